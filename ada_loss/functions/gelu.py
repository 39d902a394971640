"""GELU, x·Φ(x) with the exact (erf) Φ (Hendrycks & Gimpel 2016; PyTorch's
``nn.GELU()``, nanoGPT's MLP). Chainer 7 has none.

Element-wise: the ⟨α, δ⟩ backward passes its scale through (§3.2.2). On
float16 inputs (mixed16) it is computed in FP32 and rounded once to FP16,
forward and backward.
"""
import math

import chainer
from chainer import function_node
import numpy

_SQRT_HALF = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _erf(xp, x):
    if xp is numpy:
        from scipy import special
        return special.erf(x)
    from cupyx.scipy import special
    return special.erf(x)


def _wide(x):
    return x.astype(numpy.float32) if x.dtype == numpy.float16 else x


class GELU(function_node.FunctionNode):
    """y = x·Φ(x); gx = gy·(Φ(x) + x·φ(x)). The backward's factor is a
    constant of x (no second derivative with respect to x)."""

    def forward(self, inputs):
        x, = inputs
        self.retain_inputs((0,))
        xp = chainer.backend.get_array_module(x)
        w = _wide(x)
        y = w * (0.5 * (1.0 + _erf(xp, w * w.dtype.type(_SQRT_HALF))))
        return chainer.utils.force_array(y.astype(x.dtype, copy=False)),

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        gy, = grad_outputs
        xp = chainer.backend.get_array_module(x.array)
        w = _wide(x.array)
        cdf = 0.5 * (1.0 + _erf(xp, w * w.dtype.type(_SQRT_HALF)))
        pdf = xp.exp(-0.5 * w * w) * w.dtype.type(_INV_SQRT_2PI)
        d = cdf + w * pdf
        if gy.dtype == numpy.float16:
            g = (gy.array.astype(numpy.float32) * d).astype(numpy.float16)
            return chainer.Variable(g, requires_grad=False),
        return gy * d.astype(gy.dtype, copy=False),


def gelu(x):
    """GELU of ``x`` (:class:`GELU`)."""
    return GELU().apply((x,))[0]
