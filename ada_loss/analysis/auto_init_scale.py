"""Prototype (not in the paper, not a harness mode): α_{N+1}, the scale of
the loss gradient that starts Algorithm 3's backward, chosen by Eq. 1 from
the loss gradient's own statistics instead of the constant ``init_scale``.

The FP8 diagnosis (docs/fp8_diagnosis.md) found that in E4M3 the unscaled
loss gradient loses most of its entries when the first GEMM stores it. With
the loss gradient g (the gradient entering the GEMM nearest the loss,
unscaled) modelled as N(0, E[g²]) as in §3.2.1, the smallest scale with
P(α|g| < u) ≤ T_uf is u / (√E[g²] · √2 · erfinv(T_uf)); capped by
u_max / max|g| and rounded down to a power of two, it is used for the *next*
step (the statistics of a step are known only after its backward; the same
one-step delay as ``update_interval``).

:class:`AutoInitScale` wraps an ``adaptive`` :class:`ada_loss.scaling.
AdaptiveScaling` and sets its ``ada.init_scale`` before each backward. It
sees the unrounded gradient by wrapping ``GemmFunction.quantize_grad_output``
during the backward (restored after), as :mod:`gemm_probe` does; so it lives
here, for the diagnosis, until the ⟨α, δ⟩ backward offers the hook.
"""
import math

import numpy

from ada_loss.functions.gemm import GemmFunction
from ada_loss.loss_scale.gemm import erfinv, round_down_pow2


def eq1_scale(g, t_uf, fmt):
    """Eq. 1 for a gradient itself: the power of two ≤ min(max(u /
    (√E[g²]·√2·erfinv(T_uf)), 1), u_max / max|g|); 1 for an all-zero or
    non-finite ``g``."""
    g = numpy.asarray(g, numpy.float64)
    second = float(numpy.mean(g * g)) if g.size else 0.0
    peak = float(numpy.abs(g).max()) if g.size else 0.0
    if not (second > 0 and math.isfinite(second) and math.isfinite(peak)):
        return 1.0
    lower = fmt.u_min / (math.sqrt(second) * math.sqrt(2.0) * erfinv(t_uf))
    return round_down_pow2(min(max(lower, 1.0), fmt.u_max / peak))


class AutoInitScale(object):
    """Wraps an adaptive loss scaling (see the module docstring)."""

    def __init__(self, inner):
        self.inner = inner
        self.scales = []

    recovers = property(lambda self: self.inner.recovers)
    scale = property(lambda self: self.inner.ada.init_scale)
    fmt = property(lambda self: self.inner.fmt)

    def bind(self, model):
        self.inner.bind(model)

    def backward(self, loss):
        ada = self.inner.ada
        alpha = ada.init_scale
        first = []
        original = GemmFunction.quantize_grad_output

        def capture(func, gy):
            if not first and gy is not None:
                first.append(gy.array)
            return original(func, gy)
        GemmFunction.quantize_grad_output = capture
        try:
            self.inner.backward(loss)
        finally:
            GemmFunction.quantize_grad_output = original
        if first:
            g = numpy.asarray(first[0], numpy.float64) / alpha
            ada.init_scale = eq1_scale(g, ada.t_uf, ada.fmt)
        self.scales.append(alpha)

    def update(self, found_nonfinite):
        self.inner.update(found_nonfinite)

    def loss_scales(self):
        return self.inner.loss_scales()

    def serialize(self, serializer):
        self.inner.serialize(serializer)
