"""Algorithm 4 per head (``group_axis``, ada_loss/loss_scale/gemm.py): the
lower bound of the head with the smallest σ_p, so every head meets T_uf."""
import math

import numpy as np

from ada_loss.loss_scale.gemm import (
    erfinv, gemm_loss_scale, gemm_scale_bounds)


def _two_heads():
    rng = np.random.RandomState(0)
    W = rng.randn(2, 2, 8, 8).astype(np.float32)
    g = rng.randn(2, 2, 8, 8).astype(np.float32) * 1e-4
    W[:, 1] *= 2.0 ** -10     # head 1: a much smaller operand
    return W, g


def test_per_head_lower_bound_is_the_smallest_heads():
    W, g = _two_heads()
    lower_t, upper_t = gemm_scale_bounds(W, g, 1e-3, 'float16', 'product')
    lower_h, upper_h = gemm_scale_bounds(W, g, 1e-3, 'float16', 'product',
                                         group_axis=1)
    assert upper_h == upper_t
    w2 = (W[:, 1].astype(np.float64) ** 2).mean()
    g2 = (g[:, 1].astype(np.float64) ** 2).mean()
    want = 2.0 ** -24 / (math.sqrt(w2 * g2) * math.sqrt(2) * erfinv(1e-3))
    assert math.isclose(lower_h, want, rel_tol=1e-12)
    # the pooled statistic is dominated by head 0: ~2^9 times too small
    assert lower_h / lower_t > 2 ** 9
    b_t = gemm_loss_scale(W, g, fmt='float16')
    b_h = gemm_loss_scale(W, g, fmt='float16', group_axis=1)
    # pooled: β = 1 (head 0 needs none); per head: head 1 gets 2^8
    assert (b_t, b_h) == (1.0, 256.0)


def test_per_head_ignores_all_zero_heads_and_equals_pooled_for_one():
    W, g = _two_heads()
    W[:, 1] = 0
    lower_h, _ = gemm_scale_bounds(W, g, group_axis=1)
    w2 = (W[:, 0].astype(np.float64) ** 2).mean()
    g2 = (g[:, 0].astype(np.float64) ** 2).mean()
    assert math.isclose(lower_h, 2.0 ** -24 / (math.sqrt(w2 * g2) * math.sqrt(2)
                                    * erfinv(1e-3)), rel_tol=1e-12)
    W1, g1 = W[:, :1], g[:, :1]
    assert math.isclose(gemm_scale_bounds(W1, g1, group_axis=1)[0],
                        gemm_scale_bounds(W1, g1)[0], rel_tol=1e-6)
