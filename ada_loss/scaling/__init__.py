"""Loss-scaling methods, selected by one setting (a *mode* string).

=================  ========================================================
``fp32``           no mixed precision at all (dtype float32), no scaling
``none``           mixed precision without loss scaling
``fixed:S``        static loss scale S > 0 (power of two for exactness)
``dynamic[:k=v]``  backoff dynamic scaling; keys ``init_scale``,
                   ``growth_factor``, ``backoff_factor``, ``growth_interval``
``adaptive[:k=v]`` layer-wise adaptive scaling (this paper); keys
                   ``init_scale``, ``t_uf``, ``update_interval``, ``fmt``,
                   ``bound``, ``max_layer_scale``,
                   ``max_accum_scale``
=================  ========================================================
"""
from ada_loss.scaling.modes import (  # NOQA
    DTYPES, MODES, LossScalingSpec, check_dtype, parse_mode, resolve_dtype)
from ada_loss.scaling.methods import (  # NOQA
    AdaptiveScaling, DynamicScaling, FixedScaling, LossScaling, NoScaling,
    NonFiniteGradientError, make_loss_scaling)
