"""Max-based per-tensor scaling (Transformer Engine's delayed scaling, and the
max-exponent shift of APS, Han et al.) as a layer-wise loss scale.

For a GEMM whose input gradient gx (unscaled magnitude A = max|δx|) is to be
stored in a format with largest value u_max, the scale that maps A just below
u_max, with a safety margin of 2^margin, is

    β = 2^⌊log2(u_max / (2^margin · α · A))⌋          (α: the incoming scale)

so that α·β·A ≤ u_max / 2^margin. A is taken from a short history of past
steps (the max over it); with no usable history it is bounded from the
incoming gradient, A ≤ max|δ| · max_j Σ_i |W_ij| (the deterministic output
bound of :mod:`ada_loss.loss_scale.gemm`), so the first step cannot overflow.
"""
import math

from ada_loss.formats import get_format
from ada_loss.loss_scale.checks import nonnegative_int
from ada_loss.loss_scale.gemm import round_down_pow2


def check_margin(margin):
    return nonnegative_int('margin', margin, ' (a power-of-two safety '
                           'factor 2^margin)')


def amax_loss_scale(amax, alpha, fmt='float16', margin=0):
    """β from the unscaled amax A of the tensor the scale applies to.

    Returns 1.0 when A is 0 or not finite (nothing to go by).
    """
    f = get_format(fmt)
    peak = float(amax) * float(alpha) * 2.0 ** check_margin(margin)
    if not (peak > 0 and math.isfinite(peak)):
        return 1.0
    return round_down_pow2(f.u_max / peak)
