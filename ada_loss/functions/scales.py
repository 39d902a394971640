"""Applying a power-of-two loss scale to an array (NumPy or CuPy).

A scale is a Python number or, in the ⟨α, δ⟩ backward on a GPU, a 0-d
device array (so that the host never waits for the device).
"""
import numpy

from chainer.backends import cuda

from ada_loss.formats.widen import widen


def is_device_scalar(scale):
    """Whether a loss scale is a 0-d device array (not a Python number)."""
    return isinstance(scale, cuda.ndarray)


def host_float(scale):
    """A loss scale as the host reads it: a 0-d device array becomes a
    Python float (one transfer, so a synchronization); a number is returned
    as it is."""
    if is_device_scalar(scale):
        return device_kernels().to_floats([scale])[0]
    return scale


def device_kernels():
    """:mod:`ada_loss.loss_scale.device`, the CuPy kernels. Imported on first
    use: it needs CuPy, an optional dependency."""
    from ada_loss.loss_scale import device
    return device


def scaled(a, scale):
    """``scale · a`` for a power-of-two ``scale``: exact wherever the product
    is representable, for every power of two a double holds (the product
    rounded once to ``a``'s dtype); ``a`` itself when the scale is the
    number 1."""
    if is_device_scalar(scale):
        return device_kernels().rescale(a, scale)
    if scale == 1:
        return a
    if a.dtype in (numpy.float16, numpy.float32):
        with numpy.errstate(over='ignore', under='ignore'):
            single = numpy.float32(scale)
        if float(single) != scale:
            # A scale beyond float32's range (2^128 is inf in float32,
            # 2^-150 is 0) times a value of float32's range can still be in
            # range (2^-140 · 2^130 = 2^-10). The overflow decisions
            # (loss_scale.fit, gemm._fit_ratio) judge scale · max|y| as an
            # exact double, so the product must be that double, rounded
            # once: a float32 value times any power of two a double holds
            # is exact in float64. Only such scales take this (slower)
            # path; every other one is a float32 factor, exact already.
            return (a.astype(numpy.float64) * scale).astype(a.dtype)
        if a.dtype == numpy.float16:
            # β may lie outside FP16's range (numpy.float16(2^16) is inf,
            # numpy.float16(2^-25) is 0): multiply in FP32 and round once.
            return (widen(a) * single).astype(a.dtype)
        return a * single
    return a * a.dtype.type(scale)
