"""The ``'gauss'`` overflow bound (not in the paper; issue 19): the paper's
Gaussian model (§3.2.1) applied to the GEMM's input gradient, checked
against an independent float64/SciPy computation of its formula and, on
data that follow the model, by sampling."""
import math

import numpy as np
import pytest
from scipy import special

from ada_loss import links
from ada_loss.loss_scale.gemm import (
    BOUNDS, bound_gain, gemm_loss_scale, gemm_scale_bounds, grad_input_gain,
    grad_input_gain_l2)
from ada_loss.scaling import make_loss_scaling, parse_mode

E4M3_MAX = 448.0
E4M3_TINY = 2.0 ** -9


def reference_upper(W, g, t_uf, u_max, axes):
    """u_max / min(max|g|·max_j Σ|W_ij|, √E[g²]·max_j ‖W_j‖₂·z) with
    z = √2·erfcinv(T/n), all in float64 (erfcinv: no cancellation in 1−T/n,
    and another SciPy function than the module's erfinv)."""
    W = np.asarray(W, np.float64)
    g = np.asarray(g, np.float64)
    l1 = np.abs(W).sum(axis=axes).max()
    l2 = math.sqrt((W * W).sum(axis=axes).max())
    z = math.sqrt(2.0) * float(special.erfcinv(t_uf / g.size))
    peak = min(np.abs(g).max() * l1, math.sqrt(np.mean(g * g)) * l2 * z)
    return u_max / peak


def pow2_floor(x):
    return 2.0 ** math.floor(math.log2(x))


def _linear_node(W, batch=4):
    link = links.Linear(W.shape[1], W.shape[0], initialW=W)
    y = link(np.ones((batch, W.shape[1]), np.float32))
    return y.creator_node


def test_gauss_is_a_bound():
    assert 'gauss' in BOUNDS


@pytest.mark.parametrize('seed,out,inp,t_uf', [
    (0, 256, 32, 1e-3), (1, 64, 16, 1e-2), (2, 1024, 8, 1e-4)])
def test_gauss_upper_matches_float64_reference(seed, out, inp, t_uf):
    rng = np.random.RandomState(seed)
    W = (rng.randn(out, inp) * 0.1).astype(np.float32)
    g = (rng.randn(32, out) * 1e-3).astype(np.float32)
    gain = (grad_input_gain(W, (0,)), grad_input_gain_l2(W, (0,)))
    lower, upper = gemm_scale_bounds(W, g, t_uf, 'fp8_e4m3', 'gauss', gain)
    want = reference_upper(W, g, t_uf, E4M3_MAX, (0,))
    # E[g²] is accumulated in float32 by the module (documented)
    assert upper == pytest.approx(want, rel=1e-6)
    # the lower bound is the same for every bound
    for b in ('product', 'fan_in'):
        assert gemm_scale_bounds(W, g, t_uf, 'fp8_e4m3', b)[0] == lower
    beta = gemm_loss_scale(W, g, t_uf, 'fp8_e4m3', 'gauss', gain)
    assert beta == pow2_floor(min(max(lower, 1.0), want))


def test_gauss_never_tighter_than_output_and_looser_for_wide_gemms():
    rng = np.random.RandomState(3)
    g = (rng.randn(64, 512) * 1e-2).astype(np.float32)
    W = (rng.randn(512, 16) * 0.05).astype(np.float32)
    g1 = grad_input_gain(W, (0,))
    up_out = gemm_scale_bounds(W, g, fmt='fp8_e4m3', bound='output',
                               gain=g1)[1]
    up_gauss = gemm_scale_bounds(
        W, g, fmt='fp8_e4m3', bound='gauss',
        gain=(g1, grad_input_gain_l2(W, (0,))))[1]
    # 512 terms of random sign: √K against K, minus the tail factor z
    assert up_gauss > 4 * up_out
    # one term per output (K = 1): the Gaussian tail exceeds max|g|, so
    # the deterministic bound (a guarantee) is kept
    W1 = (rng.randn(1, 16) * 0.05).astype(np.float32)
    g1_ = (rng.randn(8, 1) * 1e-2).astype(np.float32)
    a = grad_input_gain(W1, (0,))
    assert gemm_scale_bounds(W1, g1_, fmt='fp8_e4m3', bound='gauss',
                             gain=(a, grad_input_gain_l2(W1, (0,))))[1] == \
        gemm_scale_bounds(W1, g1_, fmt='fp8_e4m3', bound='output',
                          gain=a)[1]


def test_gauss_keeps_gaussian_gradients_below_u_max():
    # Data that follow the model: β·gx stays below u_max in every trial,
    # and uses more of the range than the deterministic bound's β.
    rng = np.random.RandomState(4)
    W = (rng.randn(256, 32) * 0.1).astype(np.float32)
    gain = (grad_input_gain(W, (0,)), grad_input_gain_l2(W, (0,)))
    peaks = []
    for _ in range(50):
        g = (rng.randn(64, 256) * 1e-3).astype(np.float32)
        beta = gemm_loss_scale(W, g, 1e-3, 'fp8_e4m3', 'gauss', gain)
        beta_out = gemm_loss_scale(W, g, 1e-3, 'fp8_e4m3', 'output',
                                   gain[0])
        assert beta > beta_out
        gx = g.astype(np.float64) @ W.astype(np.float64)
        peaks.append(beta * np.abs(gx).max())
    assert max(peaks) <= E4M3_MAX
    assert min(peaks) > E4M3_MAX / 16


def test_gauss_needs_both_gains():
    W = np.ones((4, 3), np.float32)
    g = np.ones((2, 4), np.float32)
    with pytest.raises(ValueError, match='gauss'):
        gemm_scale_bounds(W, g, bound='gauss', gain=1.0)
    with pytest.raises(ValueError, match='gauss'):
        gemm_scale_bounds(W, g, bound='gauss')


def test_grad_input_gain_l2_against_numpy():
    rng = np.random.RandomState(5)
    W = rng.randn(6, 3, 3, 3).astype(np.float32)   # conv: (out, in, kh, kw)
    want = math.sqrt((W.astype(np.float64) ** 2).sum(axis=(0, 2, 3)).max())
    assert grad_input_gain_l2(W, (0, 2, 3)) == pytest.approx(want, rel=1e-12)
    assert grad_input_gain_l2(np.zeros((0, 3), np.float32), (0,)) == 0.0


def test_bound_gain_of_gemm_nodes():
    rng = np.random.RandomState(6)
    W = rng.randn(5, 7).astype(np.float32)
    func = _linear_node(W)
    W64 = W.astype(np.float64)
    assert bound_gain(func, W, 'product') is None
    assert bound_gain(func, W, 'fan_in') is None
    assert bound_gain(func, W, 'output') == pytest.approx(
        np.abs(W64).sum(axis=0).max(), rel=1e-12)
    l1, l2 = bound_gain(func, W, 'gauss')
    assert l1 == pytest.approx(np.abs(W64).sum(axis=0).max(), rel=1e-12)
    assert l2 == pytest.approx(math.sqrt((W64 ** 2).sum(axis=0).max()),
                               rel=1e-12)
    conv = links.Convolution2D(2, 4, 3, pad=1)
    y = conv(np.ones((1, 2, 5, 5), np.float32))
    Wc = conv.W.array
    l1, l2 = bound_gain(y.creator_node, Wc, 'gauss')
    assert l2 == pytest.approx(math.sqrt(
        (Wc.astype(np.float64) ** 2).sum(axis=(0, 2, 3)).max()), rel=1e-12)


def test_bound_gain_gauss_of_a_grouped_convolution():
    # groups=2: input channel c of group k gets gradient from the 2 output
    # channels of group k only
    rng = np.random.RandomState(7)
    conv = links.Convolution2D(4, 4, 3, pad=1, groups=2,
                               initialW=rng.randn(4, 2, 3, 3))
    y = conv(np.ones((1, 4, 5, 5), np.float32))
    W = conv.W.array.astype(np.float64)
    sums1, sums2 = [], []
    for k in range(2):
        Wk = W[2 * k:2 * k + 2]           # (out of group k, in/groups, 3, 3)
        sums1.append(np.abs(Wk).sum(axis=(0, 2, 3)).max())
        sums2.append((Wk ** 2).sum(axis=(0, 2, 3)).max())
    l1, l2 = bound_gain(y.creator_node, conv.W.array, 'gauss')
    assert l1 == pytest.approx(max(sums1), rel=1e-12)
    assert l2 == pytest.approx(math.sqrt(max(sums2)), rel=1e-12)


def test_adaptive_mode_accepts_bound_gauss():
    assert parse_mode('adaptive:bound=gauss').options == {'bound': 'gauss'}
    make_loss_scaling('adaptive:bound=gauss', 'fp8_e4m3')
    with pytest.raises(ValueError, match='gauss'):
        make_loss_scaling('adaptive:bound=gaus', 'fp8_e4m3')
