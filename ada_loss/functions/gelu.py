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


def _cdf_pdf(xp, w):
    """Φ(w), φ(w) of a float32/64 array."""
    cdf = 0.5 * (1.0 + _erf(xp, w * w.dtype.type(_SQRT_HALF)))
    pdf = xp.exp(-0.5 * w * w) * w.dtype.type(_INV_SQRT_2PI)
    return cdf, pdf


class GELU(function_node.FunctionNode):
    """y = x·Φ(x); gx = gy·(Φ(x) + x·φ(x)) (:class:`GELUGrad`)."""

    def forward(self, inputs):
        x, = inputs
        self.retain_inputs((0,))
        xp = chainer.backend.get_array_module(x)
        w = _wide(x)
        y = w * _cdf_pdf(xp, w)[0]
        return chainer.utils.force_array(y.astype(x.dtype, copy=False)),

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        return GELUGrad().apply((x, grad_outputs[0]))[:1]


class GELUGrad(function_node.FunctionNode):
    """gx = gy·g'(x) with g'(x) = Φ(x) + x·φ(x), computed in FP32 for
    float16 and rounded once; its own gradients (double backprop):
    ∂/∂gy = g'(x), ∂/∂x = gy·φ(x)·(2 − x²)."""

    def forward(self, inputs):
        x, gy = inputs
        self.retain_inputs((0, 1))
        xp = chainer.backend.get_array_module(x)
        w = _wide(x)
        cdf, pdf = _cdf_pdf(xp, w)
        gx = _wide(gy) * (cdf + w * pdf)
        return chainer.utils.force_array(gx.astype(gy.dtype, copy=False)),

    def backward(self, indexes, grad_outputs):
        x, gy = self.get_retained_inputs()
        ggx, = grad_outputs
        xp = chainer.backend.get_array_module(x.array)
        w = _wide(x.array)
        cdf, pdf = _cdf_pdf(xp, w)
        ret = []
        if 0 in indexes:
            d2 = (pdf * (2.0 - w * w)).astype(x.dtype, copy=False)
            ret.append(ggx * gy * d2)
        if 1 in indexes:
            ret.append(GELUGrad().apply((x, ggx))[0])
        return tuple(ret)


def gelu(x):
    """GELU of ``x`` (:class:`GELU`)."""
    return GELU().apply((x,))[0]
