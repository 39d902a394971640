"""ada_loss: adaptive loss scaling for mixed precision training (Chainer).

Public API:

* :func:`gemm_loss_scale` — Algorithm 4 + §3.2.3 for one GEMM.
* :class:`AdaLossScaled` — layer-wise ⟨α, δ⟩ backprop on any Chainer model.
* :func:`make_loss_scaling` / :func:`parse_mode` — the loss-scaling modes
  ``fp32``, ``none``, ``fixed:S``, ``dynamic``, ``adaptive``.

``ada_loss.formats`` and ``ada_loss.loss_scale`` need only NumPy (or CuPy):
without Chainer installed, ``import ada_loss`` gives just those two.
"""
import warnings as _warnings

from ada_loss.formats import FloatFormat, get_format  # NOQA
from ada_loss.loss_scale import (  # NOQA
    DynamicLossScale, common_scale, gemm_loss_scale, gemm_scale_bounds)

from ada_loss import _chainer_compat

try:
    with _warnings.catch_warnings():
        # Chainer 7 imports numpy.distutils and pkg_resources, both deprecated;
        # the warnings concern Chainer's packaging, not the user.
        _warnings.filterwarnings('ignore', category=DeprecationWarning)
        _warnings.filterwarnings('ignore', category=PendingDeprecationWarning)
        _warnings.filterwarnings('ignore', 'pkg_resources is deprecated',
                                 UserWarning)
        _chainer_compat.apply()     # NumPy 2, Python 3.12, setuptools 82
        import chainer  # NOQA
        _chainer_compat.apply_cuda()
except ImportError as e:
    if not (isinstance(e, ModuleNotFoundError) and e.name == 'chainer'):
        raise   # Chainer is installed but fails: say why, not later
    chainer = None      # not installed: the framework-free parts above work

if chainer is not None:
    from ada_loss.adaptive import (  # NOQA
        AdaLossScaled, ScaleAwareBackwardError)
    from ada_loss.errors import NonFiniteGradientError  # NOQA
    from ada_loss.precision import PRECISIONS, parse_precision  # NOQA
    from ada_loss.scaling import (  # NOQA
        MODES, make_loss_scaling, parse_mode, resolve_precision)
    from ada_loss.training.precision_setup import apply_precision  # NOQA

__version__ = '0.1.0'
