"""How float16 element-wise operations are computed on the CPU (mixed16).

Chainer's mixed16 stores activations and activation gradients as float16
NumPy arrays. NumPy computes a float16 ufunc one element at a time (convert
to float32, operate, convert back; no SIMD) and its float32 → float16 cast
branches per value class, with a slow path for subnormal results: on CPU the
element-wise parts of a mixed16 step (ReLU, shortcut additions, the casts
and reductions of batch normalization) cost more than its GEMMs once those
are emulated (:mod:`ada_loss.functions.fp16_gemm`).

The nodes of :mod:`ada_loss.functions` that run on float16 NumPy arrays —
:func:`~ada_loss.functions.relu`, :func:`~ada_loss.functions.add`,
:func:`~ada_loss.functions.batch_normalization` — store the same bits
faster:

* an IEEE operation (+, −, ×) on float16 operands is what NumPy's float16
  loop computes from the float32 values of the operands, rounded once to
  float16 (round to nearest even): so it is computed the same way, with
  NumPy's vectorized float32 loops, between an exact widening
  (:func:`ada_loss.formats.widen`, a table of NumPy's own conversions) and a
  bit-exact narrowing (:func:`ada_loss.formats.narrow`);
* operations whose result is one of their float16 inputs or a zero (ReLU and
  its gradient) are computed on the float16 bit patterns, rounding nothing;
* where Chainer's own kernel computes in float32 (batch normalization with
  FP32 γ/β: statistics, normalization, gradients), the same float32
  expressions run on exactly widened inputs, with reductions fed as NumPy
  feeds a float16 array to them (:func:`ada_loss.formats.widen_summable`).

Every value stored is therefore bit for bit the one Chainer's float16 path
stores (tested per operation on all float16 edge values, and on training
steps of a CIFAR ResNet). The configuration key ``fp16_elementwise`` selects
the path:

* ``'emulated'`` (default): as above.
* ``'native'``: Chainer's own functions on NumPy's float16 arithmetic, for
  cross-checking.

CuPy arrays always take Chainer's own path.
"""
import chainer
import numpy

FP16_ELEMENTWISE_MODES = ('emulated', 'native')

chainer.global_config.fp16_elementwise = 'emulated'


def fp16_elementwise_mode():
    mode = getattr(chainer.config, 'fp16_elementwise', 'emulated')
    if mode not in FP16_ELEMENTWISE_MODES:
        raise ValueError(
            'chainer.config.fp16_elementwise must be one of {}, not {!r}'
            .format(', '.join(FP16_ELEMENTWISE_MODES), mode))
    return mode


def emulates_fp16_elementwise(*arrays):
    """True if an element-wise node on ``arrays`` (arrays or Variables) runs
    emulated: all are float16 NumPy arrays and the mode is ``'emulated'``."""
    arrays = [getattr(a, 'array', a) for a in arrays]
    return (all(isinstance(a, numpy.ndarray) and a.dtype == numpy.float16
                for a in arrays)
            and fp16_elementwise_mode() == 'emulated')
