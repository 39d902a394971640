"""Independent references of the scaled formats, shared by the tests of
:mod:`ada_loss.formats` and of the scaled precisions: built on ml_dtypes
(``float8_e8m0fnu`` for MX scales, the element dtypes for the casts) and
exact rational arithmetic, sharing no code with ``ada_loss.formats``.

* :func:`reference_mx`: MX quantization along one axis, block by block in a
  Python loop (amax in float64, the scale exponent by ``fractions``, the
  scale made from its E8M0 code, elements by ml_dtypes' casts of x / scale
  clamped to the element's largest value; a block with NaN/Inf is NaN).
* :func:`reference_unscaled`: an element format's own cast, unscaled.
* :func:`reference_nvfp4`, :func:`reference_blockwise`,
  :func:`reference_rht`, :func:`reference_words`: NVFP4 (with stochastic
  rounding from the counter words), blockwise FP8 and the 16-point RHT, block
  by block in loops, FP32 scalars, ml_dtypes casts (issue 33).
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


# ---------------------------------------------------------------------------
# NVFP4, its random Hadamard transform and stochastic rounding, blockwise FP8
# (issue 33). Block by block in Python loops over a matrix, FP32 scalar
# arithmetic as TE's reference quantizers write it, casts by ml_dtypes.

F32_MAX = F32(np.finfo(F32).max)
#: E2M1's non-negative values, for the reference's stochastic rounding
E2M1_GRID = [fractions.Fraction(v) for v in
             (0, 0.5, 1, 1.5, 2, 3, 4, 6)]


def reference_words(n, seed, step):
    """The counter-based random words of a cast of n values (Python ints):
    MurmurHash3's fmix32 of ``i · 0x9E3779B9 + key`` mod 2^32, ``key`` =
    fmix32(fmix32(seed ^ 0x9E3779B9) + step · 0x9E3779B9)."""
    def fmix(h):
        h &= 0xFFFFFFFF
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        return h ^ (h >> 16)
    key = fmix(fmix(seed ^ 0x9E3779B9) + step * 0x9E3779B9)
    return [fmix(i * 0x9E3779B9 + key) for i in range(n)]


def _e2m1_stochastic(y, word):
    """y (a float32 in [-6, 6]) rounded to E2M1, up in magnitude iff the
    word's top 22 bits / 2^22 ≥ 1 − (|y| − lo) / (hi − lo)."""
    v = fractions.Fraction(float(abs(y)))
    lo = max(g for g in E2M1_GRID if g <= v)
    if lo == v:
        q = lo
    else:
        hi = min(g for g in E2M1_GRID if g > v)
        frac = (v - lo) / (hi - lo)
        q = hi if fractions.Fraction(word >> 10, 1 << 22) >= 1 - frac \
            else lo
    return F32(float(q)) * (F32(-1) if np.signbit(y) else F32(1))


def _blocks_2d(shape, axis, block, tile):
    """Index slices of the blocks of a matrix."""
    m, n = shape
    if tile is not None:
        t0, t1 = tile
        return [(slice(i, i + t0), slice(j, j + t1))
                for i in range(0, m, t0) for j in range(0, n, t1)]
    if axis % 2 == 1:
        return [(i, slice(j, j + block)) for i in range(m)
                for j in range(0, n, block)]
    return [(slice(i, i + block), j) for j in range(n)
            for i in range(0, m, block)]


def reference_nvfp4(x, axis=1, block=16, tile=None, sr=None, amax=None,
                    words=None):
    """NVFP4 of a float32 matrix (TE's ``_quantize_blockwise_reference``
    arithmetic; the global amax over the blocks free of NaN and Inf, whose
    blocks become NaN). ``sr``: ``(seed, step)`` for stochastic rounding
    with the counter words of :func:`reference_words` (element i = C-order
    index), or ``words`` given (an int array of x's shape); ``amax``: the
    global amax when x is a part of the tensor (one tap of a conv's W)."""
    x = np.asarray(x, F32)
    blocks = _blocks_2d(x.shape, axis, block, tile)
    if amax is None:      # over the blocks without NaN or Inf
        amax = max([F32(np.abs(x[sl]).max()) for sl in blocks
                    if np.all(np.isfinite(x[sl]))] + [F32(0)])
    amax = F32(amax)
    with np.errstate(divide='ignore', over='ignore'):
        enc = F32(448.0 * 6.0) / amax
    if enc > F32_MAX:
        enc = F32_MAX
    if enc == 0:
        enc = F32(1)
    dec = F32(1) / enc
    mult = enc * (F32(1) / F32(6))
    if sr is not None:
        words = np.array(reference_words(x.size, *sr),
                         np.uint64).reshape(x.shape)
    out = np.empty_like(x)
    for sl in blocks:
        b = x[sl]
        if not np.all(np.isfinite(b)):
            out[sl] = np.nan
            continue
        with np.errstate(over='ignore'):
            s = F32(np.abs(b).max()) * mult
        s = min(s, F32_MAX, F32(448))
        s = F32(np.array(s, F32).astype(ml_dtypes.float8_e4m3fn)
                .astype(F32))
        with np.errstate(divide='ignore', over='ignore'):
            be = F32(1) / (s * dec)
        be = min(be, F32_MAX)
        with np.errstate(over='ignore'):   # a scale of 0: be = FP32 max
            y = np.clip(b * be, F32(-6), F32(6)).astype(F32)
        if words is None:
            q = y.astype(ml_dtypes.float4_e2m1fn).astype(F32)
        else:
            w = words[sl]
            q = np.array([_e2m1_stochastic(v, int(u)) for v, u in
                          zip(y.ravel(), w.ravel())], F32).reshape(y.shape)
        out[sl] = (q * s) * dec
    return out


def reference_hadamard(size=16):
    """D · H / sqrt(size) as float32, H built entrywise as
    (−1)^popcount(i & j) (not by Sylvester's doubling), D from TE's signs
    written out here."""
    signs = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]
    h = np.array([[(-1) ** bin(i & j).count('1') for j in range(size)]
                  for i in range(size)], np.float64)
    return (np.array(signs, np.float64)[:, None] * h / 4).astype(F32)


def reference_rht(x, axis):
    """Runs of 16 along ``axis`` of a matrix times the reference T, as
    TE's reference (``x.view(-1, 16) @ T`` in FP32)."""
    xm = np.ascontiguousarray(np.moveaxis(np.asarray(x, F32), axis, -1))
    y = (xm.reshape(-1, 16) @ reference_hadamard()).reshape(xm.shape)
    return np.ascontiguousarray(np.moveaxis(y, -1, axis))


def reference_blockwise(x, axis=1, block=128, tile=None, pow2=False):
    """Blockwise FP8 E4M3 of a float32 matrix (TE's
    ``BlockwiseQuantizerReference`` with ``scale_from_amax_tensor``)."""
    x = np.asarray(x, F32)
    out = np.empty_like(x)
    for sl in _blocks_2d(x.shape, axis, block, tile):
        b = x[sl]
        if not np.all(np.isfinite(b)):
            out[sl] = np.nan
            continue
        amax = F32(np.abs(b).max())
        if amax == 0:
            s = F32(1)
        else:
            with np.errstate(over='ignore'):
                s = F32(448) / amax
            if np.isinf(s):
                s = F32_MAX
            if pow2:
                s = F32(2.0 ** (math.frexp(float(s))[1] - 1))
        y = np.clip(b * s, F32(-448), F32(448)).astype(F32)
        q = y.astype(ml_dtypes.float8_e4m3fn).astype(F32)
        out[sl] = q * (F32(1) / s)
    return out
