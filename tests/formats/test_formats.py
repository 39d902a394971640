"""Number formats: ranges and rounding, against ml_dtypes, NumPy and an
independent exact (rational) computation.

* ``quantize`` equals ``x.astype(ml_dtypes.T).astype(float32)`` bit for bit
  for every format ml_dtypes has, on the boundary cases of each format (all
  its values, every tie, one float32 ulp either side of every tie, overflow
  thresholds, ±0, ±Inf, NaN, float32 subnormals) and a million random
  values spread over float32's whole exponent range. Both implementations
  are checked: the one ``quantize`` uses and the bit-level one.
* ``e<E>m<M>`` formats equal round-to-nearest-even computed with Python
  fractions over the sorted list of the format's values (a definition-level
  computation sharing nothing with the implementation).
"""
import fractions
import math
import struct

import ml_dtypes
import numpy as np
import pytest

from ada_loss.formats import FloatFormat, get_format

F32 = np.float32

# our name -> ml_dtypes type (same semantics)
ML = {
    'float16': np.float16,
    'bfloat16': ml_dtypes.bfloat16,
    'fp8_e4m3': ml_dtypes.float8_e4m3fn,
    'fp8_e5m2': ml_dtypes.float8_e5m2,
    'e5m2': ml_dtypes.float8_e5m2,
    'e4m3': ml_dtypes.float8_e4m3,
    'e3m4': ml_dtypes.float8_e3m4,
    'fp6_e3m2': ml_dtypes.float6_e3m2fn,
    'fp6_e2m3': ml_dtypes.float6_e2m3fn,
    'fp4_e2m1': ml_dtypes.float4_e2m1fn,
}
# OCP FP6/FP4 have no NaN encoding: ml_dtypes maps NaN to a number (-0 for
# float4_e2m1fn); our FP32 storage keeps NaN as NaN (stated in the module).
NO_NAN = ('fp6_e3m2', 'fp6_e2m3', 'fp4_e2m1')


def _all_values(ml_type):
    """Every finite value of an ml_dtypes / NumPy format, as float32."""
    nbits = np.dtype(ml_type).itemsize * 8
    codes = np.arange(1 << nbits, dtype=np.uint16 if nbits == 16
                      else np.uint8)
    if nbits == 16:
        v = codes.view(ml_type).astype(F32)
    else:
        v = codes.view(ml_type).astype(F32)
    return np.unique(v[np.isfinite(v)])


def _boundary_cases(values):
    """The format's values, their midpoints (ties), ±1 float32 ulp around
    every midpoint, and beyond the largest value; both signs."""
    pos = values[values > 0].astype(np.float64)
    mids = (pos[:-1] + pos[1:]) / 2
    top = pos[-1]
    ulp = pos[-1] - pos[-2]
    extra = [top + ulp / 2, top + ulp, top * 2, pos[0] / 2, pos[0] / 4,
             pos[0] * 0.75, 1e-45, 3e38]
    with np.errstate(over='ignore'):    # beyond float32 (E = 8): inf
        c = np.concatenate([pos, mids, extra]).astype(F32)
    c = np.concatenate([c, np.nextafter(c, F32(np.inf)),
                        np.nextafter(c, F32(0))])
    c = np.concatenate([c, -c, F32([0.0, -0.0, np.inf, -np.inf])])
    return c


def _random_cases(n=1000000, seed=0):
    rng = np.random.RandomState(seed)
    bits = rng.randint(0, 2 ** 32, size=n, dtype=np.uint64).astype(
        np.uint32)
    x = bits.view(F32)
    return x[np.isfinite(x)]


def _assert_bits_equal(got, want, x, name):
    gn, wn = np.isnan(got), np.isnan(want)
    assert np.array_equal(gn, wn), (name, x[gn != wn][:5])
    bad = ~gn & (got.view(np.uint32) != want.view(np.uint32))
    assert not bad.any(), (name, x[bad][:5], got[bad][:5], want[bad][:5])


@pytest.mark.parametrize('name', sorted(ML))
def test_quantize_equals_ml_dtypes(name):
    fmt = get_format(name)
    ml = ML[name]
    x = np.concatenate([_boundary_cases(_all_values(ml)), _random_cases()])
    if name not in NO_NAN:
        x = np.concatenate([x, F32([np.nan, -np.nan])])
    with np.errstate(over='ignore'):    # the reference's overflow: inf
        want = x.astype(ml).astype(F32)
    _assert_bits_equal(fmt.quantize(x), want, x, name)
    _assert_bits_equal(fmt._rounder.round(x.copy()), want, x, name + ' bits')
    if fmt._magic is not None:
        _assert_bits_equal(fmt._magic.round(x), want, x, name + ' magic')


@pytest.mark.parametrize('name', sorted(ML))
def test_range_matches_ml_dtypes(name):
    fmt = get_format(name)
    info = ml_dtypes.finfo(ML[name]) if name != 'float16' else \
        np.finfo(np.float16)
    assert fmt.u_max == float(info.max)
    assert fmt.u_min == float(info.smallest_subnormal)
    assert (fmt.exp_bits, fmt.man_bits) == (info.nexp, info.nmant)


def test_nan_stays_nan_in_saturating_formats():
    for name in NO_NAN:
        fmt = get_format(name)
        out = fmt.quantize(F32([np.nan, np.inf, -np.inf, 1e30]))
        assert np.isnan(out[0])
        assert out[1] == fmt.u_max and out[2] == -fmt.u_max
        assert out[3] == fmt.u_max and fmt.saturates


def _exact_values(e, m):
    """All non-negative finite values of IEEE-style e<E>m<M>, as Fractions
    (from the definition: bias 2^(E-1)-1, exponent field 0 = subnormal,
    all-ones = Inf/NaN)."""
    bias = 2 ** (e - 1) - 1
    vals = set()
    for field in range(0, 2 ** e - 1):
        for frac in range(2 ** m):
            if field == 0:
                v = fractions.Fraction(frac, 2 ** m) * \
                    fractions.Fraction(2) ** (1 - bias)
            else:
                v = (1 + fractions.Fraction(frac, 2 ** m)) * \
                    fractions.Fraction(2) ** (field - bias)
            vals.add(v)
    return sorted(vals)


def _rne_exact(x, values):
    """Round-to-nearest-even of a float32 ``x`` onto ``values`` (exact
    rationals) with an unbounded exponent, as IEEE 754 defines it: the
    sorted values are extended by the next binade's first value 2^(emax+1)
    (the code after the largest); ties go to the even code (codes count the
    non-negative values from 0); a result at or beyond 2^(emax+1) is Inf."""
    if math.isnan(x):
        return math.nan
    if math.isinf(x):
        return x
    s = -1 if math.copysign(1, x) < 0 else 1
    a = fractions.Fraction(abs(x))
    top = values[-1]
    nxt = fractions.Fraction(2) ** (math.floor(math.log2(top)) + 1)
    ext = values + [nxt]
    if a >= nxt:
        return s * math.inf
    lo, hi = 0, len(ext) - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ext[mid] <= a:
            lo = mid
        else:
            hi = mid
    if a == ext[lo]:
        r = lo
    else:
        dl, dh = a - ext[lo], ext[hi] - a
        r = lo if (dl < dh or (dl == dh and lo % 2 == 0)) else hi
    return s * (math.inf if r == len(values) else float(ext[r]))


EXACT_FORMATS = ['e2m0', 'e2m1', 'e2m3', 'e3m0', 'e3m2', 'e4m3', 'e5m2',
                 'e4m7', 'e5m10', 'e6m5', 'e8m0', 'e8m3']


@pytest.mark.parametrize('name', EXACT_FORMATS)
def test_emxmy_against_exact_rounding(name):
    e, m = int(name[1]), int(name[3:])
    fmt = get_format(name)
    values = _exact_values(e, m)
    assert fmt.u_max == float(values[-1])
    assert fmt.u_min == float(values[1])
    assert fmt.overflow == 'inf' and not fmt.saturates
    pos = np.array([float(v) for v in values[1:]], dtype=np.float64)
    # all values exact in float32? (they are: E <= 8, M <= 23)
    assert np.array_equal(pos.astype(F32).astype(np.float64), pos)
    x = _boundary_cases(pos.astype(F32))
    rng = np.random.RandomState(e * 31 + m)
    with np.errstate(over='ignore'):    # beyond float32 (E = 8): inf
        x = np.concatenate([x, (rng.standard_normal(3000) * np.exp2(
            rng.uniform(np.log2(pos[0]) - 3, np.log2(pos[-1]) + 2, 3000))
            ).astype(F32), F32([np.nan])])
    if len(values) > 5000:
        x = x[rng.choice(len(x), 20000, replace=False)] if len(x) > 20000 \
            else x
    want = np.array([_rne_exact(float(v), values) for v in x], dtype=F32)
    _assert_bits_equal(fmt.quantize(x), want, x, name)
    _assert_bits_equal(fmt._rounder.round(x.copy()), want, x, name + ' bits')


def test_float32_is_identity_and_known_aliases():
    x = _random_cases(10000)
    assert np.array_equal(get_format('float32').quantize(x).view(np.uint32),
                          x.view(np.uint32))
    assert get_format('e8m23') is get_format('float32')
    assert get_format('e5m10') is get_format('float16')
    assert get_format('e8m7') is get_format('bfloat16')
    assert get_format(np.float16) is get_format('float16')
    assert isinstance(get_format('e3m0'), FloatFormat)
    assert get_format(get_format('e3m0')) is get_format('e3m0')


@pytest.mark.parametrize('bad', ['e9m2', 'e1m3', 'e4m24', 'fp7', 'float64',
                                 'e5', '', 'E5M2x'])
def test_unknown_or_impossible_format(bad):
    with pytest.raises(ValueError, match='e<E>m<M>'):
        get_format(bad)


def test_quantize_bad_input():
    fmt = get_format('fp8_e5m2')
    with pytest.raises(TypeError, match='float32'):
        fmt.quantize(np.zeros(3, np.float64))
    with pytest.raises(ValueError, match='nearest, stochastic'):
        fmt.quantize(np.zeros(3, F32), rounding='up')
    with pytest.raises(ValueError, match='rng'):
        fmt.quantize(np.zeros(3, F32), rounding='stochastic')


def test_float16_input_is_widened_exactly():
    with np.errstate(over='ignore'):    # overflows dropped next
        x = _random_cases(5000).astype(np.float16)
    x = x[np.isfinite(x)]
    out = get_format('e5m2').quantize(x)
    assert out.dtype == F32
    assert np.array_equal(out, get_format('e5m2').quantize(x.astype(F32)))


def _spacing(fmt, x):
    """Spacing of the format's values in the binade of each |x| (float64)."""
    x = np.abs(x.astype(np.float64))
    e = np.maximum(np.floor(np.log2(np.maximum(x, 1e-300))), fmt.emin)
    return np.exp2(e - fmt.man_bits)


@pytest.mark.parametrize('name', ['e5m2', 'fp8_e4m3', 'bfloat16', 'e3m0'])
def test_stochastic_rounding(name):
    fmt = get_format(name)
    rng = np.random.RandomState(1)
    # values inside the range, normal and subnormal
    x = (rng.uniform(-1, 1, 4000) * np.exp2(rng.uniform(
        math.log2(fmt.u_min), math.log2(fmt.u_max) - 1, 4000))).astype(F32)
    a = fmt.quantize(x, 'stochastic', rng=np.random.default_rng(5))
    b = fmt.quantize(x, 'stochastic', rng=5)
    assert np.array_equal(a, b)             # seeded: reproducible
    assert np.array_equal(fmt.quantize(a), a)   # values of the format
    # each result is one of the two neighbours of x
    sp = _spacing(fmt, x)
    xd = x.astype(np.float64)
    down, up = np.floor(xd / sp) * sp, np.ceil(xd / sp) * sp
    assert np.all((a == down) | (a == up))
    assert (a != fmt.quantize(x)).any()     # not round-to-nearest
    # unbiased: the mean of many draws of one value approaches it
    v = F32(0.3) if fmt.u_max > 1 else F32(fmt.u_max / 3)
    n = 200000
    draws = fmt.quantize(np.full(n, v, F32), 'stochastic',
                         rng=np.random.default_rng(7))
    assert len(np.unique(draws)) == 2
    sp_v = _spacing(fmt, np.array([v]))[0]
    assert abs(draws.astype(np.float64).mean() - v) < 5 * sp_v / \
        math.sqrt(n)
