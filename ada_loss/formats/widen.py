"""Exact, fast widening of float16 NumPy arrays to float32."""
import numpy


_TABLES = {}


def _f16_to_f32_table(swapped=False):
    """The float32 value of every float16 bit pattern, widened by NumPy
    itself; ``swapped``: stored in the non-native byte order."""
    if swapped not in _TABLES:
        table = numpy.arange(1 << 16, dtype=numpy.uint16).view(
            numpy.float16).astype(numpy.float32)
        if swapped:
            table = table.astype(table.dtype.newbyteorder())
        _TABLES[swapped] = table
    return _TABLES[swapped]


def widen(a):
    """``a.astype(numpy.float32)``, bit for bit and in the same memory order.

    For a float16 NumPy array whose elements fill its memory (C, F or any
    axis order, e.g. the NHWC-ordered outputs of Chainer's convolutions) the
    values are looked up in a 65536-entry table of NumPy's own conversions
    (``numpy.take``, ~1.3 ns per element): NumPy widens float16 element by
    element with a slow path for subnormals (gradients have many), the
    lookup costs the same for all.
    """
    return _widen(a, swapped=False)


def widen_summable(a):
    """The values of ``widen(a)`` stored byte-swapped, so that NumPy reduces
    them exactly as it reduces ``a`` itself with ``dtype=numpy.float32``.

    A reduction of a float16 array casts it chunk by chunk in the iterator's
    buffers, and pairwise summation restarts at every buffer boundary; an
    unbuffered float32 reduction sums differently where a reduced run is
    longer than the buffer (8192 elements: e.g. ``x.sum(axis=(0, 2, 3))`` on
    112 x 112 feature maps, or any full sum). A byte-swapped float32 input
    also needs a cast, so NumPy buffers it the same way, and the byte swap
    is exact: ``widen_summable(a).sum(axis, dtype=numpy.float32)`` equals
    ``a.sum(axis, dtype=numpy.float32)`` bit for bit (likewise ``mean``,
    ``var``). Element-wise operations on it give native float32 arrays.
    """
    return _widen(a, swapped=True)


def _widen(a, swapped):
    dtype = numpy.dtype(numpy.float32)
    if swapped:
        dtype = dtype.newbyteorder()
    if (not isinstance(a, numpy.ndarray) or a.dtype != numpy.float16
            or a.size < 4096):
        return a.astype(dtype)
    # axes from the largest stride to the smallest: a C-contiguous view
    perm = sorted(range(a.ndim), key=lambda i: -a.strides[i])
    ap = a.transpose(perm)
    if not ap.flags.c_contiguous:
        return a.astype(dtype)
    out = numpy.take(_f16_to_f32_table(swapped), ap.view(numpy.uint16))
    inv = [0] * a.ndim
    for i, p in enumerate(perm):
        inv[p] = i
    out = out.transpose(inv)
    if out.strides != numpy.empty_like(a, dtype=dtype).strides:
        return a.astype(dtype)
    return out
