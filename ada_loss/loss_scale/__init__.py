"""The loss-scale mathematics, framework-independent: NumPy (or CuPy) only,
no Chainer, no SciPy (SciPy's erfinv is used when it is installed).

* :mod:`~ada_loss.loss_scale.gemm`: Algorithm 4 and the §3.2.3 post-processing.
* :mod:`~ada_loss.loss_scale.branch`: Algorithm 5 (rescaling at a fan-out).
* :mod:`~ada_loss.loss_scale.dynamic`: backoff dynamic loss scaling
  (Kuchaiev et al., 2018), the baseline, as PyTorch, Chainer (the paper's)
  and TensorFlow (as Huawei's Ascend guide *Loss Scaling*
  uses it) define it.
"""
from ada_loss.loss_scale.gemm import (  # NOQA
    BOUNDS, erfinv, gemm_loss_scale, gemm_scale_bounds, grad_input_gain,
    round_down_pow2)
from ada_loss.loss_scale.branch import common_scale  # NOQA
from ada_loss.loss_scale.dynamic import (  # NOQA
    ChainerLossScale, DynamicLossScale, TFLossScale, make_dynamic_loss_scale)
