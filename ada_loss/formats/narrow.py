"""Exact, fast narrowing of float32 NumPy arrays to float16.

``narrow(y)`` is ``y.astype(numpy.float16)`` bit for bit (round to nearest
even, subnormals, overflow to ±Inf, NaN payloads, same memory order), without
NumPy's costs: its float32 → float16 cast is scalar code with branches per
value class, so arrays that mix normal, subnormal and zero results (gradients
do) cost 15-60 ns per element (each inexact subnormal result also raises the
FP underflow flag, ~75 ns), against ~2 ns here.

How: the float16 bit pattern is computed from the float32 bits with a dozen
branch-free integer passes (F. Giesen's ``float_to_half_fast3_rtne``), on
chunks of 64K elements so that every pass runs in cache:

* normal results: ``(|x| + 0xFFF + lsb − (112 << 23)) >> 13`` rebiases the
  exponent and rounds the mantissa at bit 13, ties to even (a carry into the
  exponent is the correct rounding up, and turns 65520 and above into Inf);
* subnormal results: ``bits(|x| + 0.5) − bits(0.5)`` is |x| · 2^24 rounded to
  an integer, ties to even, by float32 addition;
* the right one of the two without a branch: the normal-path code is never
  larger than the subnormal-path code where the result is subnormal (it is
  negative or the code of a smaller value) and is ≥ 1024 where the result is
  normal, so ``max(normal, min(subnormal, 1024))``, then ``min(·, 0x7C00)``
  for overflow and Inf, then the sign bit.

A chunk that holds a NaN is cast by NumPy itself (NaN payloads follow
NumPy's rule; they are rare, so speed does not matter there). Overflow gives
±Inf silently: where float16 overflows in mixed precision a loss scaler
checks for it.
"""
import threading

import numpy

_I32 = numpy.int32
_U16 = numpy.uint16
_CHUNK = 1 << 16        # 5 int32 scratch arrays of 256 KiB: stay in L2
_SMALL = 1024           # below this NumPy's cast is as fast
_ABS = _I32(0x7FFFFFFF)
_INF_BITS = 0x7F800000
_NORMAL_BIAS = _I32(0xFFF - (112 << 23))
_HALF_BITS = _I32(0x3F000000)      # bits of 0.5
_F16_INF = _I32(0x7C00)

_scratch = threading.local()


def _buffers():
    """Per-thread scratch: three int32 chunks and two constant chunks
    (NumPy's minimum with a scalar operand is 2-3x slower than with an
    array)."""
    bufs = getattr(_scratch, 'bufs', None)
    if bufs is None:
        bufs = tuple(numpy.empty(_CHUNK, _I32) for _ in range(3)) + (
            numpy.full(_CHUNK, 1024, _I32), numpy.full(_CHUNK, 0x7C00, _I32))
        _scratch.bufs = bufs
    return bufs


def _narrow_flat(src, dst):
    """float16 bits of the float32 1-d array ``src`` into uint16 ``dst``."""
    bits = src.view(_I32)
    abs_buf, norm_buf, sub_buf, c1024, cinf = _buffers()
    for i in range(0, src.size, _CHUNK):
        j = min(i + _CHUNK, src.size)
        m = j - i
        a, n, s = abs_buf[:m], norm_buf[:m], sub_buf[:m]
        b = bits[i:j]
        o = dst[i:j]
        numpy.bitwise_and(b, _ABS, out=a)
        if int(a.max()) > _INF_BITS:        # a NaN: NumPy's own rule
            with numpy.errstate(over='ignore'):
                o[...] = src[i:j].astype(numpy.float16).view(_U16)
            continue
        # subnormal results: |x| * 2^24 rounded by float32 addition (s is
        # also the scratch of the rounding bit below, so it comes first)
        numpy.add(a.view(numpy.float32), numpy.float32(0.5),
                  out=s.view(numpy.float32))
        numpy.subtract(s, _HALF_BITS, out=s)
        numpy.minimum(s, c1024[:m], out=s)
        # normal results: rebias, round at bit 13 (ties to even)
        numpy.right_shift(a, 13, out=n)
        numpy.bitwise_and(n, _I32(1), out=n)
        numpy.add(n, a, out=n)
        numpy.add(n, _NORMAL_BIAS, out=n)
        numpy.right_shift(n, 13, out=n)
        numpy.maximum(n, s, out=n)
        numpy.minimum(n, cinf[:m], out=n)
        # the sign: bit 31 to bit 15
        numpy.right_shift(b, 16, out=a)
        numpy.bitwise_and(a, _I32(0x8000), out=a)
        numpy.bitwise_or(n, a, out=n)
        numpy.copyto(o, n, casting='unsafe')


def narrow(y):
    """``y.astype(numpy.float16)``, bit for bit and in the same memory order.

    Args:
        y: a float32 NumPy array (anything else is cast by NumPy).

    Returns:
        numpy.ndarray: float16, laid out as ``y.astype(numpy.float16)`` is.
    """
    if (not isinstance(y, numpy.ndarray) or y.dtype != numpy.float32
            or y.size < _SMALL):
        with numpy.errstate(over='ignore'):
            return numpy.asarray(y).astype(numpy.float16)
    out = numpy.empty_like(y, dtype=numpy.float16)   # astype's layout
    perm = _stride_order(y)
    yp = y.transpose(perm)
    if not yp.flags.c_contiguous:
        y = y.copy(order='K')
        perm = _stride_order(y)
        yp = y.transpose(perm)
    op = out.transpose(perm)
    if not (yp.flags.c_contiguous and op.flags.c_contiguous):
        with numpy.errstate(over='ignore'):
            return y.astype(numpy.float16)
    _narrow_flat(yp.reshape(-1), op.view(_U16).reshape(-1))
    return out


def _stride_order(a):
    """Axes from the largest stride to the smallest (a C-contiguous view of
    a dense array in any axis order)."""
    return sorted(range(a.ndim), key=lambda i: -a.strides[i])
