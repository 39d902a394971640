"""Exact, fast widening of float16 NumPy arrays to float32."""
import numpy


_F16_TO_F32 = []


def _f16_to_f32_table():
    if not _F16_TO_F32:
        # every float16 bit pattern, widened by NumPy itself
        _F16_TO_F32.append(numpy.arange(1 << 16, dtype=numpy.uint16).view(
            numpy.float16).astype(numpy.float32))
    return _F16_TO_F32[0]


def widen(a):
    """``a.astype(numpy.float32)``, bit for bit and in the same memory order.

    For a float16 NumPy array whose elements fill its memory (C, F or any
    axis order, e.g. the NHWC-ordered outputs of Chainer's convolutions) the
    values are looked up in a 65536-entry table of NumPy's own conversions:
    NumPy 1.x widens float16 element by element with a slow path for
    subnormals (gradients have many), the lookup costs the same for all.
    """
    if (not isinstance(a, numpy.ndarray) or a.dtype != numpy.float16
            or a.size < 4096):
        return a.astype(numpy.float32)
    # axes from the largest stride to the smallest: a C-contiguous view
    perm = sorted(range(a.ndim), key=lambda i: -a.strides[i])
    ap = a.transpose(perm)
    if not ap.flags.c_contiguous:
        return a.astype(numpy.float32)
    out = _f16_to_f32_table()[ap.view(numpy.uint16)]
    inv = [0] * a.ndim
    for i, p in enumerate(perm):
        inv[p] = i
    out = out.transpose(inv)
    if out.strides != numpy.empty_like(a, dtype=numpy.float32).strides:
        return a.astype(numpy.float32)
    return out
