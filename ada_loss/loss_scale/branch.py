"""Common loss scale where gradients meet (paper §3.2.2, Algorithm 5).

A variable consumed by several operations (a ResNet shortcut, an SSD feature
map feeding its heads and the next stage) receives one gradient per consumer,
each carried at its own scale α_k. Before they are summed they must share one
scale: the largest received α_i such that no rescaled gradient
(α_i / α_k)·δ_k overflows (descending search); if none fits, scales below the
smallest are tried by halving.
"""
import math


def common_scale(scales, max_abs, u_max, max_halvings=64):
    """Chooses the scale all gradients are rescaled to (Algorithm 5).

    Args:
        scales (list of float): α_k of each received gradient (powers of two).
        max_abs (callable): ``max_abs(k)`` → max|δ_k|; only called when the
            scales differ (equal scales need no rescaling).
        u_max (float): largest finite value of the gradient format.

    Returns:
        float: the common scale α. The rescaling factors α/α_k are powers of
        two, so rescaling is exact up to underflow of values scaled down.
    """
    distinct = sorted(set(scales), reverse=True)
    if len(distinct) == 1:
        return distinct[0]
    peaks = [max_abs(k) for k in range(len(scales))]
    if not all(math.isfinite(p) for p in peaks):
        # An Inf/NaN already overflowed: no scale fixes it; the step will be
        # skipped by the non-finite check. Keep the smallest scale.
        return distinct[-1]

    def fits(alpha):
        return all(alpha / a * p < u_max for a, p in zip(scales, peaks))

    for alpha in distinct:
        if fits(alpha):
            return alpha
    alpha = distinct[-1]
    for _ in range(max_halvings):
        alpha /= 2
        if fits(alpha):
            return alpha
    return alpha
