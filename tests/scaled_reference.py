"""Independent references of the scaled formats, shared by the tests of
:mod:`ada_loss.formats` and of the scaled precisions: built on ml_dtypes
(``float8_e8m0fnu`` for MX scales, the element dtypes for the casts) and
exact rational arithmetic, sharing no code with ``ada_loss.formats``.

* :func:`reference_mx`: MX quantization along one axis, block by block in a
  Python loop (amax in float64, the scale exponent by ``fractions``, the
  scale made from its E8M0 code, elements by ml_dtypes' casts of x / scale
  clamped to the element's largest value; a block with NaN/Inf is NaN).
* :func:`reference_unscaled`: an element format's own cast, unscaled.
* :func:`reference_per_tensor`: TE's per-tensor cast, ml_dtypes' cast of
  clip(x · scale, ±fmt_max) times 1/scale in float32;
  :func:`reference_current_scale`: fmt_max / amax in float32 (1 for an
  amax of 0 or non-finite), pow2: 2^floor(log2 scale).
"""
import fractions
import math

import ml_dtypes
import numpy as np

F32 = np.float32
ELEMENTS = {   # ml_dtypes name -> (type, largest value, emax)
    'float8_e4m3fn': (ml_dtypes.float8_e4m3fn, 448.0, 8),
    'float8_e5m2': (ml_dtypes.float8_e5m2, 57344.0, 15),
    'float6_e3m2fn': (ml_dtypes.float6_e3m2fn, 28.0, 4),
    'float6_e2m3fn': (ml_dtypes.float6_e2m3fn, 7.5, 2),
    'float4_e2m1fn': (ml_dtypes.float4_e2m1fn, 6.0, 2),
}


def _e8m0(e):
    """2^e as ml_dtypes' E8M0 value, built from its code."""
    code = np.array([e + 127], np.uint8)
    return float(code.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)[0])


def _ref_exponent(amax, elem_max, emax, rule):
    if amax == 0:
        return -127
    a = fractions.Fraction(amax)
    if rule == 'floor':
        e = math.floor(math.log2(amax))
        while fractions.Fraction(2) ** e > a:
            e -= 1
        while fractions.Fraction(2) ** (e + 1) <= a:
            e += 1
        e -= emax
    else:     # smallest e with amax <= elem_max * 2^e
        m = fractions.Fraction(elem_max)
        e = math.ceil(math.log2(amax / elem_max))
        while a > m * fractions.Fraction(2) ** e:
            e += 1
        while a <= m * fractions.Fraction(2) ** (e - 1):
            e -= 1
    return min(max(e, -127), 127)


def reference_mx(x, element, axis, block, rule):
    """(values, exponents) of the MX quantization of a float32 matrix (or
    any array) along one axis, block by block."""
    ml, elem_max, emax = ELEMENTS[element]
    xm = np.moveaxis(x, axis, -1).astype(np.float64)
    out = np.empty_like(xm)
    n = xm.shape[-1]
    exps = np.empty(xm.shape[:-1] + (-(-n // block),), np.int32)
    for idx in np.ndindex(xm.shape[:-1]):
        row = xm[idx]
        for j, s in enumerate(range(0, n, block)):
            b = row[s:s + block]
            if not np.all(np.isfinite(b)):
                out[idx + (slice(s, s + block),)] = np.nan
                exps[idx + (j,)] = 0
                continue
            e = _ref_exponent(float(np.max(np.abs(b))), elem_max, emax,
                              rule)
            exps[idx + (j,)] = e
            scale = _e8m0(e)
            v = np.clip(b / scale, -elem_max, elem_max)   # exact, float64
            q = v.astype(F32).astype(ml).astype(np.float64)
            out[idx + (slice(s, s + block),)] = q * scale
    return np.moveaxis(out.astype(F32), -1, axis), exps



#: per-tensor element formats: ml_dtypes name -> (type, largest value)
PER_TENSOR = {'float8_e4m3fn': (ml_dtypes.float8_e4m3fn, 448.0),
              'float8_e5m2': (ml_dtypes.float8_e5m2, 57344.0)}


def reference_current_scale(amax, element, pow2=False):
    amax = F32(amax)
    if amax == 0 or not np.isfinite(amax):
        return F32(1)
    s = F32(PER_TENSOR[element][1]) / amax
    if pow2:
        s = F32(2.0 ** math.floor(math.log2(float(s))))
    return s


def reference_per_tensor(x, element, scale):
    ml, m = PER_TENSOR[element]
    y = np.clip(x * F32(scale), -F32(m), F32(m))
    return y.astype(ml).astype(F32) * (F32(1) / F32(scale))


def reference_unscaled(x, element):
    """``x`` rounded *unscaled* to an element format (``grad=loss``):
    ml_dtypes' cast of the float32 values and back, with the format's own
    overflow (NaN for E4M3, Inf for E5M2, saturation for FP6/FP4)."""
    return np.asarray(x, F32).astype(ELEMENTS[element][0]).astype(F32)
