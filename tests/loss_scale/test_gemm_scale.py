"""Algorithm 4 + §3.2.3 (gemm_loss_scale) and Algorithm 5 (common_scale).

The GEMM loss scale is checked against an independent float64 computation of
the paper's formulas with NumPy/SciPy.
"""
import math
import zlib

import numpy as np
import pytest
from scipy import special

from ada_loss.loss_scale import (
    common_scale, gemm_loss_scale, gemm_scale_bounds, grad_input_gain,
    round_down_pow2)

U = {'float16': (2.0 ** -24, 65504.0),
     'bfloat16': (2.0 ** -133, (2 - 2.0 ** -7) * 2.0 ** 127)}


def reference_raw(W, g, t_uf, fmt):
    """β* of §3.2.1/§3.2.3 before rounding, in float64 (None: σ_p = 0)."""
    u, u_max = U[fmt]
    W = np.asarray(W, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    var_p = ((np.var(W) + np.mean(W) ** 2) * (np.var(g) + np.mean(g) ** 2))
    if var_p == 0:
        return None
    sigma_p = math.sqrt(var_p)
    lower = u / (sigma_p * math.sqrt(2.0) * float(special.erfinv(t_uf)))
    peak = np.max(np.abs(W)) * np.max(np.abs(g))
    upper = u_max / peak
    beta = max(lower, 1.0)
    if upper < beta:
        beta = upper
    return beta


def pow2_floor(x):
    return 2.0 ** math.floor(math.log2(x))


def is_pow2(x):
    return x > 0 and math.isfinite(x) and math.frexp(x)[0] == 0.5


def assert_matches_reference(W, g, t_uf, fmt):
    raw = reference_raw(W, g, t_uf, fmt)
    beta = gemm_loss_scale(W, g, t_uf=t_uf, fmt=fmt)
    assert isinstance(beta, float)
    assert is_pow2(beta)
    if raw is None:
        assert beta == 1.0
        return beta, raw
    expected = pow2_floor(raw)
    # The implementation accumulates statistics in float32; only a raw value
    # within float32 rounding of a power of two may round to the neighbour.
    near = abs(math.log2(raw) - round(math.log2(raw))) < 1e-5
    if near:
        assert beta in (expected, expected * 2, expected / 2), (beta, raw)
    else:
        assert beta == expected, (beta, raw, W.shape, g.shape, W.dtype)
    return beta, raw


SHAPES = [
    ((64, 32), (16, 64)),             # Linear: W (out, in), gy (batch, out)
    ((10, 300), (128, 10)),
    ((16, 8, 3, 3), (4, 16, 8, 8)),   # conv: W (out, in, kh, kw), gy (N,C,H,W)
    ((32, 3, 5, 5), (2, 32, 7, 7)),
    ((8, 8, 1, 1), (3, 8, 4, 4)),
]


@pytest.mark.parametrize('shapes', SHAPES)
@pytest.mark.parametrize('g_mag', [1e-8, 1e-6, 1e-4, 1e-2, 1.0, 1e2])
@pytest.mark.parametrize('dtype', [np.float32, np.float16])
@pytest.mark.parametrize('fmt', ['float16', 'bfloat16'])
def test_gemm_loss_scale_matches_reference(shapes, g_mag, dtype, fmt):
    rng = np.random.RandomState(zlib.crc32(repr((shapes, g_mag, fmt))
                                           .encode()))
    w_shape, g_shape = shapes
    fan_in = int(np.prod(w_shape[1:]))
    W = (rng.randn(*w_shape) * math.sqrt(2.0 / fan_in)).astype(dtype)
    # A non-zero mean too, so that μ² matters in σ_p².
    g = ((rng.randn(*g_shape) + 0.3) * g_mag).astype(dtype)
    if dtype == np.float16 and not np.any(g):
        pytest.skip('all of g underflowed in float16')
    for t_uf in (1e-3, 1e-2, 0.1, 0.5):
        beta, raw = assert_matches_reference(W, g, t_uf, fmt)
        if raw is not None and raw > 2:
            assert beta > 1


@pytest.mark.parametrize('dtype', [np.float32, np.float16])
@pytest.mark.parametrize('offset', [3.0, 30.0, -10.0])
def test_mean_dominated_operands(dtype, offset):
    # σ_p² uses σ² + μ² (second moments): with |μ| >> σ the mean dominates
    # and a variance-only statistic would give a scale |μ|/σ times too big.
    rng = np.random.RandomState(11)
    W = ((rng.randn(32, 48) + offset) * 0.01).astype(dtype)
    g = ((rng.randn(8, 32) * 0.5 + offset) * 1e-6).astype(dtype)
    beta, raw = assert_matches_reference(W, g, 1e-3, 'float16')
    var_only = 2.0 ** -24 / (math.sqrt(np.var(W.astype(np.float64))
                                       * np.var(g.astype(np.float64)))
                             * math.sqrt(2) * special.erfinv(1e-3))
    assert var_only > 8 * raw


def test_reference_exercises_lower_bound_and_grows_with_small_g():
    # Sanity of the test itself: tiny gradients give large scales in float16
    # and the scale follows 1/σ_g (a factor 2^10 in g changes β by 2^-10).
    rng = np.random.RandomState(0)
    W = (rng.randn(64, 64) * 0.1).astype(np.float32)
    g = (rng.randn(32, 64) * 1e-8).astype(np.float32)
    b1 = gemm_loss_scale(W, g)
    b2 = gemm_loss_scale(W, g * np.float32(2.0 ** 10))
    assert b1 > 2 ** 10
    assert b1 / b2 == 2.0 ** 10
    # smaller T_uf -> stricter -> larger scale
    assert gemm_loss_scale(W, g, t_uf=1e-4) >= gemm_loss_scale(W, g, t_uf=1e-2)
    assert gemm_loss_scale(W, g, t_uf=1e-4) > gemm_loss_scale(W, g, t_uf=0.5)


def test_gemm_scale_bounds_values():
    rng = np.random.RandomState(1)
    W = rng.randn(20, 30)
    g = rng.randn(7, 20) * 1e-3 + 1e-4
    lower, upper = gemm_scale_bounds(W, g, t_uf=1e-3, fmt='float16')
    sp = math.sqrt((W.var() + W.mean() ** 2) * (g.var() + g.mean() ** 2))
    assert lower == pytest.approx(
        2.0 ** -24 / (sp * math.sqrt(2) * special.erfinv(1e-3)), rel=1e-6)
    assert upper == pytest.approx(
        65504.0 / (np.abs(W).max() * np.abs(g).max()), rel=1e-12)
    # Eq. (1): with the lower bound the underflow probability of p is T_uf.
    assert special.erf(2.0 ** -24 / (lower * sp * math.sqrt(2))) == \
        pytest.approx(1e-3, rel=1e-5)


@pytest.mark.parametrize('zero', ['W', 'g', 'both'])
def test_all_zero_operand_gives_one(zero):
    rng = np.random.RandomState(2)
    W = rng.randn(8, 4).astype(np.float32)
    g = (rng.randn(3, 8) * 1e-7).astype(np.float32)
    if zero in ('W', 'both'):
        W[...] = 0
    if zero in ('g', 'both'):
        g[...] = 0
    assert gemm_loss_scale(W, g) == 1.0
    lower, upper = gemm_scale_bounds(W, g)
    assert lower is None and upper is None


@pytest.mark.parametrize('dtype', [np.float32, np.float16])
def test_huge_values_give_power_of_two_below_one(dtype):
    rng = np.random.RandomState(3)
    W = (rng.randn(16, 16) * 30).astype(dtype)
    g = (rng.randn(4, 16) * 300).astype(dtype)
    peak = float(np.abs(W.astype(np.float64)).max()
                 * np.abs(g.astype(np.float64)).max())
    assert 65504.0 / peak < 1
    beta = gemm_loss_scale(W, g)
    assert beta < 1 and is_pow2(beta)
    assert beta == pow2_floor(65504.0 / peak)
    assert_matches_reference(W, g, 1e-3, 'float16')
    # scaled products can no longer overflow float16
    assert beta * peak <= 65504.0


def test_upper_bound_binding_above_one():
    # lower > upper > 1: β is the upper bound rounded down. Since
    # upper/lower = (u_max/u)·√2·erfinv(T_uf)·σ_p/(max|W|·max|g|), this needs
    # heavy outliers and a strict T_uf.
    rng = np.random.RandomState(4)
    W = (rng.randn(64, 64) * 1e-3).astype(np.float32)
    g = (rng.randn(16, 64) * 1e-6).astype(np.float32)
    W[0, 0] = 30.0
    g[0, 0] = 1.0
    t_uf = 1e-9
    lower, upper = gemm_scale_bounds(W, g, t_uf=t_uf)
    assert 1 < upper < lower
    beta = gemm_loss_scale(W, g, t_uf=t_uf)
    assert beta == pow2_floor(upper)
    assert_matches_reference(W, g, t_uf, 'float16')
    # the binding upper bound rounds *down*: never above the bound
    assert beta <= upper < 2 * beta
    # with the paper's T_uf the same data is not upper-bound limited
    lower3, upper3 = gemm_scale_bounds(W, g, t_uf=1e-3)
    assert gemm_loss_scale(W, g, t_uf=1e-3) == max(1.0, pow2_floor(lower3))


def test_lower_below_one_gives_one():
    rng = np.random.RandomState(5)
    W = rng.randn(32, 32).astype(np.float32)
    g = rng.randn(8, 32).astype(np.float32)
    lower, upper = gemm_scale_bounds(W, g)
    assert lower < 1 < upper
    assert gemm_loss_scale(W, g) == 1.0


@pytest.mark.parametrize('bad', [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize('where', ['g', 'W'])
@pytest.mark.parametrize('dtype', [np.float32, np.float16])
def test_non_finite_gives_one(bad, where, dtype):
    rng = np.random.RandomState(6)
    W = (rng.randn(8, 8) * 0.1).astype(dtype)
    g = (rng.randn(4, 8) * 1e-4).astype(dtype)
    (g if where == 'g' else W)[1, 2] = bad
    assert gemm_loss_scale(W, g) == 1.0
    assert gemm_loss_scale(W, g, bound='fan_in') == 1.0
    assert gemm_loss_scale(W, g, bound='output', gain=1.0) == 1.0


@pytest.mark.parametrize('t_uf', [0, 1, -0.1, 1.5, float('nan')])
def test_invalid_t_uf(t_uf):
    W = np.ones((2, 2), np.float32)
    g = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError):
        gemm_loss_scale(W, g, t_uf=t_uf)
    with pytest.raises(ValueError):
        gemm_scale_bounds(W, g, t_uf=t_uf)


def test_unknown_format():
    W = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError):
        gemm_loss_scale(W, W, fmt='float8')


def test_bound_options_and_max_scale():
    rng = np.random.RandomState(7)
    W = (rng.randn(64, 48) * 0.05).astype(np.float32)
    g = (rng.randn(16, 64) * 1e-7).astype(np.float32)
    lower, upper = gemm_scale_bounds(W, g)
    assert lower > 1
    base = gemm_loss_scale(W, g)
    assert base == pow2_floor(lower)
    # fan_in: the product bound divided by the authors' fan W.shape[0] = 64
    # (the terms of each input-gradient entry; not the forward fan-in 48)
    lo_f, up_f = gemm_scale_bounds(W, g, bound='fan_in')
    assert lo_f == lower and up_f == pytest.approx(upper / 64, rel=1e-12)
    # output: u_max / (max|g| * max_j sum_i |W_ij|), computed independently
    gain = float(np.abs(W.astype(np.float64)).sum(axis=0).max())
    assert grad_input_gain(W, (0,)) == pytest.approx(gain, rel=1e-12)
    lo_o, up_o = gemm_scale_bounds(W, g, bound='output', gain=gain)
    assert up_o == pytest.approx(
        65504.0 / (float(np.abs(g).max()) * gain), rel=1e-6)
    for bound, up in (('fan_in', up_f), ('output', up_o)):
        want = pow2_floor(min(max(lower, 1.0), up))
        assert gemm_loss_scale(W, g, bound=bound, gain=gain) == want
    with pytest.raises(ValueError, match='gain'):
        gemm_scale_bounds(W, g, bound='output')
    with pytest.raises(ValueError, match='output, product, fan_in'):
        gemm_scale_bounds(W, g, bound='sum')
    assert gemm_loss_scale(W, g, max_scale=8.0) == 8.0
    assert gemm_loss_scale(W, g, max_scale=12.0) == 8.0


def test_round_down_pow2():
    assert round_down_pow2(1.0) == 1.0
    assert round_down_pow2(1.9999) == 1.0
    assert round_down_pow2(2.0) == 2.0
    assert round_down_pow2(1023.9) == 512.0
    assert round_down_pow2(0.3) == 0.25
    assert round_down_pow2(2.0 ** -30 * 1.5) == 2.0 ** -30
    for x in np.geomspace(1e-30, 1e30, 97):
        assert round_down_pow2(float(x)) == pow2_floor(float(x))


# -- Algorithm 5 -------------------------------------------------------------

UMAX = 65504.0


def _cs(scales, peaks):
    calls = []

    def max_abs(k):
        calls.append(k)
        return peaks[k]
    return common_scale(scales, max_abs, UMAX), calls


def test_common_scale_largest_that_fits():
    # δ_k are carried at α_k; rescaled to α they become (α/α_k)·δ_k.
    alpha, _ = _cs([4.0, 64.0, 16.0], [10.0, 100.0, 1.0])
    assert alpha == 64.0


def test_common_scale_descends():
    # δ_0 = 5000 carried at α 4: at 64 it would be 80000 (overflow), at 16 it
    # is 20000 (fits), and 100 at 64 -> 25 at 16.
    alpha, _ = _cs([4.0, 64.0, 16.0], [5000.0, 100.0, 1.0])
    assert alpha == 16.0
    # next one down too
    alpha, _ = _cs([4.0, 64.0, 16.0], [20000.0, 100.0, 1.0])
    assert alpha == 4.0
    # the condition is strict (< u_max)
    alpha, _ = _cs([1.0, 2.0], [UMAX / 2, 1.0])
    assert alpha == 1.0
    alpha, _ = _cs([1.0, 2.0], [UMAX / 2 - 1, 1.0])
    assert alpha == 2.0


def test_common_scale_below_smallest_by_halving():
    # at 8 the first one overflows (65500·4); at 2 both fit (strictly).
    alpha, _ = _cs([2.0, 8.0], [65500.0, 40000.0])
    assert alpha == 2.0
    # A gradient carried at the smallest scale that is itself >= u_max (a
    # float32 array can hold it): no received scale fits, so scales below the
    # smallest are tried by halving.
    alpha, _ = _cs([2.0, 8.0], [70000.0, 100.0])
    assert alpha == 1.0          # 70000/2 = 35000 fits, 100/8 too
    alpha, _ = _cs([2.0, 8.0], [300000.0, 100.0])
    assert alpha == 0.25         # /8 = 37500 fits; /4 = 75000 does not
    assert math.frexp(alpha)[0] == 0.5


def test_common_scale_equal_scales_untouched():
    alpha, calls = _cs([16.0, 16.0, 16.0], [1e9, 1.0, 2.0])
    assert alpha == 16.0
    assert calls == []           # no statistics needed
    alpha, calls = _cs([0.5], [1e9])
    assert alpha == 0.5 and calls == []


def test_common_scale_non_finite_keeps_smallest():
    alpha, _ = _cs([4.0, 64.0], [float('inf'), 1.0])
    assert alpha == 4.0
    alpha, _ = _cs([4.0, 64.0], [1.0, float('nan')])
    assert alpha == 4.0


def test_common_scale_against_brute_force():
    rng = np.random.RandomState(8)
    for _ in range(300):
        n = rng.randint(2, 5)
        scales = [2.0 ** int(e) for e in rng.randint(-3, 12, size=n)]
        peaks = [float(p) for p in 10.0 ** rng.uniform(-3, 5, size=n)]
        alpha, _ = _cs(scales, peaks)

        def fits(a):
            return all(a / s * p < UMAX for s, p in zip(scales, peaks))
        cands = sorted(set(scales), reverse=True)
        fitting = [a for a in cands if fits(a)]
        if len(cands) == 1:
            assert alpha == cands[0]
        elif fitting:
            assert alpha == fitting[0]
        else:
            a = min(cands)
            while not fits(a):
                a /= 2
            assert alpha == a
        assert is_pow2(alpha)
