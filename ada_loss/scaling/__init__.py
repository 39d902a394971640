"""Loss-scaling methods, selected by one setting (a *mode* string).

=================  ========================================================
``fp32``           no mixed precision at all (precision float32), no scaling
``none``           low precision without loss scaling
``fixed:S``        static loss scale S > 0 (power of two for exactness)
``dynamic[:k=v]``  one global backoff scale, ``style`` = ``pytorch``
                   (GradScaler, default: ``init_scale``, ``growth_factor``,
                   ``backoff_factor``, ``growth_interval``), ``chainer``
                   (Chainer's, the paper's: ``interval``, ``init_scale``) or
                   ``tf`` (TensorFlow's: ``init_scale``, ``incr_every_n_steps``,
                   ``decr_every_n_nan_or_inf``, ``incr_ratio``,
                   ``decr_ratio``); all: ``min_scale``, ``max_scale``
``adaptive[:k=v]`` layer-wise adaptive scaling (this paper); keys
                   ``init_scale`` (default ``format``: the paper's 1 where
                   the gradient format holds 1/B as a normal number, else
                   ``amax``; ``init_scale=1``: the paper's), ``t_uf``,
                   ``update_interval``, ``fmt``, ``bound``,
                   ``max_layer_scale``, ``max_accum_scale``,
                   ``nonlinear_scale``, ``split_scales``
``amax[:k=v]``     max-based layer-wise scaling; keys ``init_scale`` (a
                   number, default 1), ``margin``, ``history``, ``fmt``,
                   ``max_accum_scale``, ``nonlinear_scale``, ``split_scales``
=================  ========================================================

Every method targets the range of the gradient format of the run's precision
(:func:`make_loss_scaling` ``(mode, precision)``).
"""
from ada_loss.errors import NonFiniteGradientError  # NOQA
from ada_loss.scaling.methods import (  # NOQA
    AdaptiveScaling, AmaxScaling, DynamicScaling, FixedScaling, LossScaling,
    NoScaling)
from ada_loss.scaling.modes import (  # NOQA
    MODES, LossScalingSpec, make_loss_scaling, parse_mode,
    resolve_precision, resolved_mode)
