"""How FP16 GEMMs are computed on the CPU.

NumPy has no BLAS path for float16 (a 1024^3 matmul takes ~170x longer than in
float32), so by default a GEMM on float16 NumPy arrays is *emulated*: the FP16
inputs are widened to FP32 (exact), the product is accumulated in FP32 by BLAS,
and the result is rounded once to FP16 (round-to-nearest-even, subnormals
kept). Those are the numerics of GPU tensor cores (FP16 products are exact in
FP32, FP32 accumulation, FP16 output).

The mode is the Chainer configuration key ``fp16_gemm``:

* ``'emulated'`` (default): as above.
* ``'native'``: NumPy's own float16 arithmetic, for cross-checking.

CuPy arrays always use the native FP16 GEMM of cuBLAS/cuDNN.
"""
import chainer
import numpy

from ada_loss.formats.narrow import narrow
from ada_loss.formats.widen import widen  # NOQA (re-exported)
from ada_loss.functions.scales import scaled

FP16_GEMM_MODES = ('emulated', 'native')

chainer.global_config.fp16_gemm = 'emulated'


def fp16_gemm_mode():
    mode = getattr(chainer.config, 'fp16_gemm', 'emulated')
    if mode not in FP16_GEMM_MODES:
        raise ValueError('chainer.config.fp16_gemm must be one of {}, not {!r}'
                         .format(', '.join(FP16_GEMM_MODES), mode))
    return mode


def emulates_fp16_gemm(arrays):
    """True if a GEMM on ``arrays`` runs emulated (FP32 accumulation on CPU)."""
    arrays = [a for a in arrays if a is not None]
    return (all(isinstance(a, numpy.ndarray) for a in arrays)
            and any(a.dtype == numpy.float16 for a in arrays)
            and fp16_gemm_mode() == 'emulated')


def round_to(y, dtype, scale=1):
    """Rounds an FP32 accumulator ``y`` to ``dtype`` after scaling it.

    ``scale`` is a power of two (a layer-wise loss scale, Algorithm 3), so
    ``scale * y`` is exact in FP32 and equals accumulating the pre-scaled
    operand; scaling the accumulator avoids an FP16 overflow of the scaled
    operand itself. float32 → float16 on NumPy is
    :func:`ada_loss.formats.narrow`: NumPy's cast bit for bit, without its
    slow path for subnormal results (gradients have many).
    """
    y = scaled(y, scale)    # on the device for a device scalar
    if (isinstance(y, numpy.ndarray) and y.dtype == numpy.float32
            and numpy.dtype(dtype) == numpy.float16):
        return narrow(y)
    return y.astype(dtype, copy=False)
