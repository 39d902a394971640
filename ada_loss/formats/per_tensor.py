"""Per-tensor FP8 scaling as NVIDIA Transformer Engine does it: one FP32
scale per tensor, ``q = cast(x · scale)``, dequantized as ``q · scale_inv``.

Sources: TE's ``transformer_engine/common/recipe/__init__.py``
(``Float8CurrentScaling``, ``DelayedScaling``) and the scale computation of
``recipe_common.cuh`` (``compute_scale_from_amax``), re-derived here:

* **Current scaling** (:func:`current_scale`): ``scale = fmt_max / amax``
  in FP32 from the tensor's own amax; an amax of 0 or non-finite gives 1;
  a quotient that overflows FP32 gives FP32's largest value; ``pow2``
  keeps only the exponent bits of the scale (rounds it down to a power of
  two, so nothing overflows).
* **Delayed scaling** (:class:`DelayedScaling`): the scale of this step is
  computed from the amaxes of the previous ``history`` steps (their max,
  TE's ``amax_compute_algo="max"``), ``scale = fmt_max / amax / 2^margin``;
  an amax of 0 or non-finite keeps the previous scale; the first step uses
  scale 1. Defaults as TE's: history 1024, margin 0. Amaxes are reduced
  with ``fmaxf`` as TE's kernels do (a NaN entry is ignored); every step's
  amax is recorded and the window rolls every step, 0 included (TE's
  ``amax_and_scale_update`` kernel rolls unconditionally; a window of
  zeros keeps the previous scale).
* **The cast** (:func:`quantize_with_scale`): ``x · scale`` in FP32,
  saturated to ± fmt_max (TE casts with CUDA's ``__NV_SATFINITE``: with a
  delayed scale a tensor can exceed the history's amax), rounded to
  nearest even. Unlike SATFINITE, an input NaN or ±Inf gives NaN, so that
  a non-finite tensor stays visible to loss scaling's overflow checks.
* **Dequantization**: ``q · (1 / scale)`` in FP32. TE applies the two
  operands' ``scale_inv`` to the GEMM's FP32 accumulator instead; the two
  agree to FP32 rounding, and exactly with ``pow2`` scales.

NumPy or CuPy (the amax is brought to the host: the scale is a Python
float, as it is a scalar of the recipe's state).
"""
import numpy

from ada_loss.formats.float_format import get_format
from ada_loss.formats.quantize import array_module

_F32 = numpy.float32
_F32_MAX = float(numpy.finfo(_F32).max)

#: Transformer Engine's defaults of ``DelayedScaling``
DEFAULT_HISTORY = 1024
DEFAULT_MARGIN = 0


def _pow2_floor(scale):
    """The power of two ≤ ``scale`` (a positive finite float32) that has
    its exponent bits (TE's ``force_pow_2_scales``)."""
    bits = numpy.array(scale, _F32).view(numpy.uint32) & numpy.uint32(
        0xFF800000)
    return _F32(bits.view(_F32))


def amax_of(x):
    """max |x| as a Python float, reduced as TE's amax kernels reduce
    (``fmaxf``: a NaN entry is ignored, so one NaN does not poison the
    amax history of delayed scaling for ``history`` steps); 0 for an empty
    or all-NaN x; +Inf where x holds ±Inf."""
    if x.size == 0:
        return 0.0
    xp = array_module(x)
    a = xp.abs(x).ravel()
    amax = float(xp.fmax.reduce(a)) if xp is numpy else float(xp.nanmax(a))
    return 0.0 if amax != amax else amax


def current_scale(amax, element, pow2=False):
    """TE's current scaling: ``fmt_max / amax`` (FP32), 1 where amax is 0 or
    non-finite, FP32's max where the quotient overflows; ``pow2``: rounded
    down to a power of two. Returns a NumPy float32."""
    fmt_max = _F32(get_format(element).u_max)
    amax = _F32(amax)
    if not numpy.isfinite(amax) or amax == 0:
        return _F32(1)
    with numpy.errstate(over='ignore'):
        scale = fmt_max / amax
    if numpy.isinf(scale):
        scale = _F32(_F32_MAX)
    return _pow2_floor(scale) if pow2 else scale


def delayed_scale(amax_history, previous, element, margin=DEFAULT_MARGIN,
                  pow2=False):
    """TE's delayed scaling: ``fmt_max / max(history) / 2^margin`` (FP32),
    ``previous`` where that amax is 0 or non-finite. Returns a float32."""
    fmt_max = _F32(get_format(element).u_max)
    # TE's update kernel reduces the history with fmaxf (NaN ignored)
    amax = _F32(numpy.fmax.reduce(numpy.asarray(amax_history,
                                                _F32).ravel()))
    if not numpy.isfinite(amax) or amax == 0:
        return _F32(previous)
    with numpy.errstate(over='ignore'):
        scale = fmt_max / amax / _F32(2.0 ** margin)
    if numpy.isinf(scale):
        scale = _F32(_F32_MAX)
    return _pow2_floor(scale) if pow2 else scale


def quantize_with_scale(x, element, scale, amax=None):
    """``x`` cast to ``element`` at ``scale`` and dequantized: float32
    ``round(clip(x · scale, ±fmt_max)) · (1 / scale)``; NaN and ±Inf of x
    give NaN. ``amax`` (x's, if known) saves a pass when it is finite."""
    fmt = get_format(element)
    xp = array_module(x)
    if x.dtype == numpy.float16:
        x = x.astype(_F32)
    scale = _F32(scale)
    with numpy.errstate(over='ignore', invalid='ignore'):
        y = x * scale
    xp.clip(y, _F32(-fmt.u_max), _F32(fmt.u_max), out=y)
    if amax is None or not numpy.isfinite(amax):
        # a non-finite input stays visible (to the overflow checks of loss
        # scaling) instead of saturating
        y[~xp.isfinite(x)] = _F32(numpy.nan)
    q = fmt.quantize(y)
    q *= _F32(1) / scale
    return q


def quantize_per_tensor(x, element, amax=None, pow2=False):
    """``x`` quantized with one scale from ``amax`` (its own when None, TE's
    current scaling). Returns ``(values, scale)``: float32 dequantized
    values of x's shape, the float32 scale."""
    if amax is None:
        amax = amax_of(x)
    scale = current_scale(amax, element, pow2)
    return quantize_with_scale(x, element, scale, amax), scale


class DelayedScaling(object):
    """The state of one tensor's delayed scaling: its amax history and
    scale (a tensor role of one GEMM: x, W or the incoming gradient).

    :meth:`quantize` casts with the current scale, records the tensor's
    amax and computes the scale of the next cast from the history (TE
    records the amax during the step and updates the scale after it; with
    one cast per tensor per step the two are the same).

    Attributes:
        amax_history: float32 array of length ``history``, newest first
            (zeros where no step was recorded yet, as TE's).
        scale: float32, the scale of the next cast (1 at first).
    """

    def __init__(self, element, history=DEFAULT_HISTORY,
                 margin=DEFAULT_MARGIN, pow2=False):
        if int(history) < 1:
            raise ValueError('history must be ≥ 1, got {!r}'.format(history))
        self.element = get_format(element)
        self.margin = margin
        self.pow2 = bool(pow2)
        self.amax_history = numpy.zeros(int(history), _F32)
        self.scale = _F32(1)

    def record(self, amax):
        """Adds one step's amax and updates the scale from the history."""
        h = self.amax_history
        h[1:] = h[:-1].copy()
        h[0] = amax
        self.scale = delayed_scale(h, self.scale, self.element, self.margin,
                                   self.pow2)

    def quantize(self, x, record=True):
        """``x`` at the current scale (dequantized, float32); then, if
        ``record``, its amax joins the history."""
        amax = amax_of(x)
        y = quantize_with_scale(x, self.element, self.scale, amax)
        if record:
            self.record(amax)
        return y

    def serialize(self, serializer):
        """Chainer's serializer protocol (duck-typed: no Chainer import):
        the amax history and the scale, training state of the recipe."""
        h = serializer('amax_history', self.amax_history)
        if h is not None and h is not self.amax_history:
            self.amax_history[...] = numpy.asarray(h)
        scale = serializer('scale', numpy.array(self.scale, _F32))
        self.scale = _F32(numpy.asarray(scale))
