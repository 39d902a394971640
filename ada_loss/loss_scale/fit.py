"""Fitting a gradient into its stored format by a power of two.

The overflow guard of the adaptive and amax modes (*not in the paper*) and
the weight gradients of the ⟨α, δ⟩ backward lower a gradient's scale by the
power of two that brings it into its format where rounding would overflow.
Both decide **on the rounded value**, the value the format actually stores:

* a value that rounds to a finite number below the format's overflow
  threshold is left alone, even at or a little above u_max (|v| = 448 in
  E4M3 is a finite E4M3 value; 456.3 rounds to 448 under round-to-nearest-
  even), so the guard is bit-identical to no guard wherever nothing
  overflows;
* in a format that saturates (OCP FP6/FP4) a value that rounds *to* ±u_max
  counts as an overflow (the updater cannot tell it from a saturated one),
  even when it was a little below u_max before rounding (27 → 28 in
  fp6_e3m2).

Powers of two only: the scaled gradient is exact in FP32 and its unscaled
value unchanged. NumPy only.
"""
import math

import numpy


def overflows(value, fmt):
    """Whether the magnitude ``value`` (≥ 0, a float) overflows ``fmt``
    when rounded to it: it rounds to Inf/NaN, or to u_max in a format that
    saturates."""
    q = float(fmt.quantize(numpy.array([value], numpy.float32))[0])
    return not math.isfinite(q) or (fmt.saturates and q >= fmt.u_max)


def fit_ratio(peak, fmt):
    """The largest power of two 2^-k (k ≥ 0) such that ``2^-k · peak``
    does not overflow ``fmt`` when rounded (:func:`overflows`); 1 when
    ``peak`` does not overflow. ``peak`` must be finite.

    With 2^(e-1) ≤ peak / u_max < 2^e, 2^-e brings the product below u_max
    and 2^-(e-2) leaves it at ≥ 2·u_max (an overflow in every format), so
    the answer is 2^-(e-1) (when its product rounds down into range) or the
    first smaller power that fits."""
    if not math.isfinite(peak):
        raise ValueError('fit_ratio needs a finite peak, got {!r}'.format(
            peak))
    if not overflows(peak, fmt):
        return 1.0
    ratio = min(1.0, 2.0 ** -(math.frexp(peak / fmt.u_max)[1] - 1))
    while overflows(peak * ratio, fmt):
        ratio /= 2.0
    return ratio


def top_binade_scale(peak, fmt):
    """The largest power of two α with ``α · peak`` rounding to a value of
    ``fmt`` that does not overflow (:func:`overflows`): the scale that puts
    ``peak`` into the format's top binade (*not in the paper*:
    ``adaptive:init_scale=amax`` uses it for α_{N+1}, the loss gradient's
    scale). 1 for a zero or non-finite ``peak`` (nothing to go by)."""
    if not (peak > 0 and math.isfinite(peak)):
        return 1.0
    alpha = 2.0 ** (math.frexp(fmt.u_max / peak)[1] - 1)  # α·peak ≤ u_max
    if not overflows(peak * alpha * 2.0, fmt):
        alpha *= 2.0     # rounds down into range: one binade more
    while alpha > 2.0 ** -149 and overflows(peak * alpha, fmt):
        alpha /= 2.0
    return alpha
