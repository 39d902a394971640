"""style='authors' and the fan_in bound (issue 37), against independent
float64 computations of the authors' formulas (kumasento/gradient-scaling,
ada_loss_chainer.py: get_loss_scale_by_approx_range, get_fan_in,
bound_loss_scale_by_heuristics; core.py: get_power_of_two_scale)."""
import math

import numpy as np
import pytest
from scipy.special import erfinv

from ada_loss.loss_scale.gemm import (
    authors_caps, authors_loss_scale, authors_range, authors_raw_scale,
    authors_round_pow2, gemm_loss_scale, gemm_scale_bounds, reference_fan,
    round_down_pow2)


def _their_formulas(W, g, u_min=6.0e-8, u_max=65504.0, t_uf=1e-3):
    """(lower, upper) of their approx_range in float64, written from the
    formulas: fan = W.shape[0]·kh·kw; σ_o = √(E[g²]·E[W²])·√(fan/2)."""
    W = W.astype(np.float64)
    g = g.astype(np.float64)
    fan = W.shape[0] * (W.shape[2] * W.shape[3] if W.ndim == 4 else 1)
    sigma = math.sqrt((g.var() + g.mean() ** 2) * (W.var() + W.mean() ** 2))
    sigma *= math.sqrt(0.5 * fan)
    lower = max(u_min / (math.sqrt(2) * erfinv(t_uf) * sigma), 1.0)
    upper = u_max / fan / (np.abs(g).max() * np.abs(W).max())
    return lower, upper


def test_reference_fan_is_their_get_fan_in():
    assert reference_fan(np.zeros((10, 64))) == 10          # Linear: out
    assert reference_fan(np.zeros((16, 8, 3, 3))) == 144    # conv: out·kh·kw
    assert reference_fan(np.zeros((4, 6, 1, 1))) == 4
    assert reference_fan(np.zeros((8, 2, 3, 5))) == 8 * 15


@pytest.mark.parametrize('shape,fan,old', [
    ((10, 64), 10, 64),                # the 10×64 Linear
    ((16, 8, 3, 3), 144, 72)])         # a conv: out·kh·kw vs in·kh·kw
def test_fan_in_bound_is_the_authors(shape, fan, old):
    """bound=fan_in: upper = u_max / (fan · max|W| · max|g|) with their fan;
    the old option divided by the forward fan-in (W.size // W.shape[0])."""
    rng = np.random.RandomState(0)
    W = (rng.randn(*shape) * 0.1).astype(np.float32)
    g = (rng.randn(*((4, shape[0]) if len(shape) == 2 else
                     (2, shape[0], 5, 5))) * 30).astype(np.float32)
    _, upper = gemm_scale_bounds(W, g, bound='fan_in')
    peak = float(np.abs(W).max()) * float(np.abs(g).max())
    assert upper == pytest.approx(65504.0 / (fan * peak), rel=1e-12)
    assert upper != pytest.approx(65504.0 / (old * peak), rel=1e-3)
    _, up_product = gemm_scale_bounds(W, g, bound='product')
    assert upper == pytest.approx(up_product / fan, rel=1e-12)


def test_authors_range():
    u_min, u_max = authors_range('float16')
    assert u_min == np.float32(6.0e-8) and u_min != np.float32(2.0 ** -24)
    assert u_max == 65504.0
    u_min8, u_max8 = authors_range('fp8_e4m3')
    assert u_min8 == 2.0 ** -9 and u_max8 == 448.0


@pytest.mark.parametrize('shape,gshape,gscale', [
    ((10, 64), (8, 10), 1e-5),          # small gradients: the lower bound
    ((10, 64), (8, 10), 3e3),           # huge gradients: the fan bound
    ((16, 8, 3, 3), (2, 16, 6, 6), 1e-4),
    ((16, 8, 3, 3), (2, 16, 6, 6), 1e3)])
@pytest.mark.parametrize('dtype', [np.float16, np.float32])
def test_authors_raw_scale_matches_their_formulas(shape, gshape, gscale,
                                                   dtype):
    rng = np.random.RandomState(1)
    W = (rng.randn(*shape) * 0.1 + 0.01).astype(dtype)
    g = (rng.randn(*gshape) * gscale).astype(dtype)
    lower, upper = _their_formulas(W, g)
    raw = authors_raw_scale(W, g)
    assert raw.dtype == np.float32
    assert float(raw) == pytest.approx(min(lower, upper), rel=1e-5)
    beta = authors_loss_scale(W, g)
    assert beta == 2.0 ** math.floor(math.log2(min(lower, upper)))
    # the paper's style differs: no √(fan/2), u = 2^-24, no fan bound
    if gscale < 1:
        assert beta < gemm_loss_scale(W, g, bound='product')


def test_huge_gradient_scale_below_one():
    """Their bound may ask for β < 1 (no clamp after the upper bound)."""
    rng = np.random.RandomState(2)
    W = (rng.randn(64, 64) * 0.5).astype(np.float16)
    g = (rng.randn(8, 64) * 2e3).astype(np.float16)
    lower, upper = _their_formulas(W, g)
    assert upper < 1
    assert authors_loss_scale(W, g) == 2.0 ** math.floor(math.log2(upper))


def test_caps_as_theirs():
    """β ≤ accum / α and β ≤ layer cap, applied before the rounding."""
    rng = np.random.RandomState(3)
    W = (rng.randn(10, 64) * 0.1).astype(np.float16)
    g = (rng.randn(8, 10) * 1e-6).astype(np.float16)
    lower, upper = _their_formulas(W, g)
    raw = min(lower, upper)
    assert raw > 128
    assert authors_loss_scale(W, g, max_layer_scale=16) == 16.0
    assert authors_loss_scale(W, g, max_layer_scale=100) == 64.0
    assert authors_loss_scale(W, g, alpha=256.0, max_accum_scale=1024) == 4.0
    # α above the accumulated cap: β < 1, as theirs
    assert authors_loss_scale(W, g, alpha=2048.0,
                              max_accum_scale=1024) == 0.5
    assert float(authors_caps(np.float32(300.0), 8.0, 128, 4096)) == 128.0
    # their caps are float16 numbers: 1e5 is infinite there (no cap)
    assert float(authors_caps(np.float32(3e5), 1.0, 1e5)) == 3e5
    assert float(authors_caps(np.float32(3e5), 1.0, 1e5, None,
                              'float32')) == 1e5


def test_their_rounding_rounds_up_just_below_a_power_of_two():
    """log2 in float32 rounds 1024·(1 − 2^-24) to 10: theirs gives 1024
    where an exact floor gives 512."""
    x = np.float32(1024.0) * (np.float32(1) - np.float32(2.0 ** -24))
    assert x < 1024
    assert round_down_pow2(float(x)) == 512.0
    assert authors_round_pow2(x) == 1024.0
    assert authors_round_pow2(np.float32(1000.0)) == 512.0
    # float16 scale dtype: 2^16 is infinite there; held at 2^15
    assert authors_round_pow2(np.float32(70000.0)) == 2.0 ** 15
    assert authors_round_pow2(np.float32(70000.0), 'float32') == 2.0 ** 16


def test_zero_and_non_finite():
    W = np.ones((4, 4), np.float16)
    assert authors_loss_scale(W, np.zeros((2, 4), np.float16)) == 1.0
    assert authors_loss_scale(W, np.zeros((2, 4), np.float16), alpha=2048.0,
                              max_accum_scale=1024) == 0.5
    g = np.ones((2, 4), np.float16)
    g[0, 0] = np.inf
    assert authors_loss_scale(W, g) == 1.0
