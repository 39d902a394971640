"""Layer-wise loss scale of one GEMM (paper §3.2.1, Algorithm 4, §3.2.3).

For a GEMM with weights W and incoming scaled gradient g = αδ, the products
p = w·g are modelled as N(0, σ_p²) with

    σ_p² = (σ_w² + μ_w²)(σ_g² + μ_g²)                      (product rule)

and the smallest scale that keeps P(β|p| ≤ u) ≤ T_uf is (Eq. 1)

    lower = u / (σ_p · √2 · erfinv(T_uf)).

Post-processing (§3.2.3): an overflow bound ``upper``; β* = max(lower, 1),
replaced by upper where upper < β*; then rounded *down* to a power of two so
that scaling and unscaling are exact.

The overflow bound (``bound``):

* ``'product'`` — the paper's: upper = u_max / (max|W|·max|g|). It bounds
  one product w·g, not the GEMM's output, which sums fan-out many of them: in
  FP16 the headroom hides this, in FP8 (u_max = 448) it overflows.
* ``'output'`` — *this project's default, not in the paper*: the input
  gradient of the GEMM is gx_j = Σ_i g_i W_ij, so |gx_j| ≤ max|g| · Σ_i |W_ij|
  and upper = u_max / (max|g| · max_j Σ_i |W_ij|) guarantees that β·gx cannot
  overflow (deterministically; the sum runs over the axes the backward
  contracts, given by the GEMM node as ``gain``, see :func:`grad_input_gain`).
* ``'fan_in'`` — the authors' code's (kumasento/gradient-scaling,
  ``ada_loss_chainer.py: get_loss_scale_by_approx_range`` with
  ``bound_by_fan_in``): the product bound divided by their "fan-in"
  ``get_fan_in(W)`` = W.shape[0]·kh·kw (:func:`reference_fan`), the number
  of products each entry of the *input gradient* sums (Linear: out;
  Convolution2D: out·kh·kw), so upper = u_max / (fan · max|W| · max|g|).
  (Before issue 37 this option divided by W.size // W.shape[0], the
  *forward* fan-in in·kh·kw, which is no source's bound.)
* ``'gauss'`` — *not in the paper* (issue 19): the paper's own Gaussian
  model (§3.2.1) applied to the GEMM's output instead of one product. With
  the entries of g modelled as independent with E[g²] = σ_g² + μ_g², the
  input gradient gx_j = Σ_i g_i W_ij has variance E[g²] · Σ_i W_ij²; the
  bound takes the widest column, σ_gx = √E[g²] · max_j ‖W_·j‖₂, and asks
  that no entry of β·gx exceed u_max with probability ≥ 1 − T: by the union
  bound over the n = g.size entries, P(|β·gx_j| > u_max) ≤ T / n each, i.e.

      upper = u_max / (σ_gx · √2 · erfinv(1 − T / n)),

  with T = T_uf (the same allowed rate for both tails; no new constant).
  It is never tighter than ``'output'`` (a guarantee needs no more), so
  upper = max(gauss, output). A heavier tail than the Gaussian can still
  overflow: the step is then skipped and counted (the backstop of every
  recovering mode). The caller passes ``gain = (‖·‖₁ gain, ‖·‖₂ gain)``,
  see :func:`bound_gain`.

This module needs NumPy only (CuPy arrays work too); SciPy's erfinv is used
when installed, else :func:`erfinv` below.
"""
import functools
import math
import warnings

import numpy

from ada_loss.formats import get_format
from ada_loss.formats.quantize import array_module as _xp
from ada_loss.formats.widen import widen
from ada_loss.loss_scale.checks import positive_finite

BOUNDS = ('output', 'product', 'fan_in', 'gauss')

#: bounds that need the caller's ``gain`` (see :func:`bound_gain`)
GAIN_BOUNDS = ('output', 'gauss')

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _erfinv_newton(y):
    """erfinv(y) for 0 < y < 1 from the standard library: Winitzki's
    approximation refined by Halley steps on ``math.erf``/``math.erfc``
    (erfc near 1, where erf(x) − y would cancel); within 3 ulp of SciPy."""
    a = 0.147
    ln = math.log1p(-y * y)
    t = 2.0 / (math.pi * a) + ln / 2.0
    x = math.sqrt(math.sqrt(t * t - ln / a) - t)
    for _ in range(100):
        err = math.erf(x) - y if y <= 0.5 else (1.0 - y) - math.erfc(x)
        step = err / (_TWO_OVER_SQRT_PI * math.exp(-x * x))
        step /= 1.0 + x * step
        x_new = x - step
        if x_new == x:
            break
        x = x_new
    return x


@functools.lru_cache(maxsize=64)
def erfinv(y):
    """Inverse error function of a scalar 0 < y < 1 (T_uf in Eq. 1).

    SciPy's value when SciPy is importable (so CPU results do not depend on
    this module), else :func:`_erfinv_newton`.
    """
    if not 0 < y < 1:
        raise ValueError('erfinv needs 0 < y < 1, got {!r}'.format(y))
    try:
        from scipy import special
    except ImportError:
        return _erfinv_newton(float(y))
    return float(special.erfinv(y))


def max_abs(a):
    """max|a| of a NumPy/CuPy array (0 for an empty one); NaN propagates."""
    if not a.size:
        return 0.0
    xp = _xp(a)
    if a.dtype == numpy.float16 and xp is numpy:
        # NumPy's float16 loops are slow (no SIMD): widen once (exact).
        a = widen(a)
    return _max_abs_wide(xp, a)


def _max_abs_wide(xp, a):
    # max(max a, -min a) = max|a| without an |a| temporary; NaN propagates;
    # abs() turns the -0.0 of an all-zero array into 0.0.
    return abs(float(xp.maximum(a.max(), -a.min())))


def _moments(a):
    """(E[a²], max|a|) = (σ² + μ², max|a|) from one widened copy of ``a``.

    E[a²] is accumulated in float32 (exact widening of FP16 values, whose
    squares cannot leave float32's range). Float32 arrays of values below
    ~1e-19 have squares below float32's range: then it is redone in float64.
    """
    xp = _xp(a)
    if a.dtype == numpy.float16 and xp is numpy:
        a = widen(a)
    else:
        a = a.astype(numpy.promote_types(a.dtype, numpy.float32), copy=False)
    second = float(xp.mean(a * a))
    peak = _max_abs_wide(xp, a) if a.size else 0.0
    if second == 0.0 and peak > 0.0:
        a = a.astype(numpy.float64)
        second = float(xp.mean(a * a))
    return second, peak


def is_power_of_two(x):
    return x > 0 and math.isfinite(x) and math.frexp(x)[0] == 0.5


def check_scale(scale, name):
    """Validates a user-given loss scale; warns unless it is a power of two
    (only then are scaling and unscaling exact, §3.2.3). Returns a float."""
    scale = positive_finite(name, scale)
    if not is_power_of_two(scale):
        warnings.warn('{} {:g} is not a power of two: scaling and unscaling '
                      'are not exact'.format(name, scale))
    return float(scale)


def round_down_pow2(x):
    """Largest power of two ≤ x (x > 0, finite)."""
    m, e = math.frexp(x)        # x = m · 2^e with 0.5 ≤ m < 1
    return math.ldexp(1.0, e - 1)


def loss_gradient_scale(second, peak, t_uf=1e-3, fmt='float16'):
    """α_{N+1} by Eq. 1 for the loss gradient itself (*not in the paper*:
    ``adaptive:init_scale=auto``).

    The paper starts the backward at a constant α_{N+1} (§3.1); in FP8 the
    unscaled loss gradient then loses most of its entries where the first
    GEMM stores it (docs/fp8_diagnosis.md). Modelling the loss gradient g as
    N(0, E[g²]) as §3.2.1 models each product, the smallest scale with
    P(α|g| < u) ≤ T_uf is u / (√E[g²] · √2 · erfinv(T_uf)); post-processed
    as §3.2.3: at least 1, capped by u_max / max|g|, rounded down to a power
    of two.

    Args:
        second (float): E[g²] of the unscaled loss gradient.
        peak (float): its max|g|.

    Returns:
        float: a power of two; 1 for an all-zero or non-finite gradient.
    """
    if not 0 < t_uf < 1:
        raise ValueError('t_uf must be in (0, 1), got {!r}'.format(t_uf))
    f = get_format(fmt)
    if not (second > 0 and math.isfinite(second) and math.isfinite(peak)):
        return 1.0
    lower = f.u_min / (math.sqrt(second) * math.sqrt(2.0) * erfinv(t_uf))
    return round_down_pow2(min(max(lower, 1.0), f.u_max / peak))


def reference_fan(W):
    """The authors' "fan-in" of a GEMM's weights W: ``W.shape[0]`` times the
    kernel extent (``ada_loss_chainer.py: AdaLossChainer.get_fan_in``:
    ``W.shape[0]`` for a 2-D W, ``W.shape[0]·W.shape[2]·W.shape[3]`` for a
    4-D one). For Linear (out, in) and Convolution2D (out, in, kh, kw) with
    one group it is the number of products each input-gradient entry sums;
    for a grouped convolution or a Deconvolution2D (in, out, kh, kw) it is
    still W.shape[0]·kh·kw, as theirs. Returns an int (1 for a 0-d W)."""
    if W.ndim == 0:
        return 1
    return int(W.shape[0]) * int(numpy.prod(W.shape[2:], dtype=numpy.int64))


def grad_input_gain(W, axes):
    """max_j Σ_i |W_ij|: the largest factor by which the backward GEMM can
    grow max|g| (the ∞-norm of the map g ↦ gx), with ``axes`` the axes of W
    the backward contracts (Linear ``(0,)``, Convolution2D ``(0, 2, 3)``,
    Deconvolution2D ``(1, 2, 3)``). Accumulated in float64."""
    xp = _xp(W)
    a = W.astype(numpy.float64)
    return float(xp.abs(a).sum(axis=axes).max()) if W.size else 0.0


def grad_input_gain_l2(W, axes):
    """max_j ‖W_·j‖₂ = max_j √(Σ_i W_ij²) over the axes the backward
    contracts (as :func:`grad_input_gain`); the ``'gauss'`` bound's widest
    column. Accumulated in float64."""
    xp = _xp(W)
    a = W.astype(numpy.float64)
    return float(xp.sqrt((a * a).sum(axis=axes).max())) if W.size else 0.0


def bound_gain(func, W, bound):
    """The ``gain`` argument of :func:`gemm_scale_bounds` for GEMM node
    ``func`` (an :class:`ada_loss.functions.gemm.GemmFunction`) under
    ``bound``: its ∞-norm gain for ``'output'``, (∞-norm gain, widest
    column 2-norm) for ``'gauss'``, None for the others."""
    if bound == 'output':
        return func.grad_input_gain(W)
    if bound == 'gauss':
        # Σ_i W_ij² is the node's own ∞-norm gain of W² (its axes and
        # groups), squared in float64
        W2 = _xp(W).square(W.astype(numpy.float64))
        return func.grad_input_gain(W), math.sqrt(func.grad_input_gain(W2))
    return None


def check_bound(bound):
    if not isinstance(bound, str) or bound not in BOUNDS:
        raise ValueError('unknown overflow bound {!r}; expected one of: {}'
                         .format(bound, ', '.join(BOUNDS)))
    return bound


def _group_second(a, axis):
    """E[a²] over every axis but ``axis``: one value per group (float64)."""
    xp = _xp(a)
    a = a.astype(numpy.float64)
    axes = tuple(i for i in range(a.ndim) if i != axis % a.ndim)
    return xp.mean(a * a, axis=axes)


def gemm_scale_bounds(W, g, t_uf=1e-3, fmt='float16', bound='product',
                      gain=None, group_axis=None):
    """Raw (lower, upper) bounds of §3.2.1/§3.2.3 before post-processing.

    Args:
        bound: ``'product'`` (the paper), ``'output'`` (needs ``gain``, see
            :func:`grad_input_gain`), ``'fan_in'`` (the product bound
            divided by :func:`reference_fan`) or ``'gauss'`` (needs ``gain =
            (grad_input_gain, grad_input_gain_l2)``, see :func:`bound_gain`).

        group_axis: None (the statistics of the whole tensors, the paper's)
            or an axis of both W and g (the heads of a batched attention
            GEMM): σ_p per group, and the lower bound of the group with the
            smallest nonzero σ_p, so that every group meets T_uf (*not in
            the paper*; docs/modes.md, "Attention's activation ×
            activation GEMMs"). The upper bounds are maxima over the whole
            tensors either way.

    Returns ``lower = None`` when σ_p = 0 (W or g all zero) and
    ``upper = None`` when the bound's denominator is 0 (no overflow possible).
    """
    if not 0 < t_uf < 1:
        raise ValueError('t_uf must be in (0, 1), got {!r}'.format(t_uf))
    check_bound(bound)
    f = get_format(fmt)
    w2, w_max = _moments(W)
    g2, g_max = _moments(g)
    sigma_p = math.sqrt(w2 * g2)
    if group_axis is not None and sigma_p > 0:
        per_group = _group_second(W, group_axis) * _group_second(
            g, group_axis)
        per_group = per_group[per_group > 0]
        sigma_p = math.sqrt(float(per_group.min()))
    lower = (f.u_min / (sigma_p * math.sqrt(2.0) * erfinv(t_uf))
             if sigma_p > 0 else None)
    if bound == 'output':
        if gain is None:
            raise ValueError("bound='output' needs the GEMM's gain "
                             '(grad_input_gain(W, axes))')
        peak = g_max * gain
    elif bound == 'gauss':
        if not (isinstance(gain, tuple) and len(gain) == 2):
            raise ValueError("bound='gauss' needs gain=(grad_input_gain(W, "
                             'axes), grad_input_gain_l2(W, axes)), got {!r}'
                             .format(gain))
        z = math.sqrt(2.0) * erfinv(1.0 - t_uf / max(g.size, 1))
        # a guarantee (the 'output' bound) needs no more than itself
        peak = min(g_max * gain[0], math.sqrt(g2) * gain[1] * z)
    else:
        peak = w_max * g_max
        if bound == 'fan_in':
            peak *= reference_fan(W)
    upper = f.u_max / peak if peak > 0 else None
    return lower, upper


def gemm_loss_scale(W, g, t_uf=1e-3, fmt='float16', bound='product',
                    gain=None, max_scale=None, group_axis=None):
    """Loss scale β of one GEMM layer: Algorithm 4 plus §3.2.3.

    Args:
        W: the layer's weights (NumPy or CuPy array).
        g: the gradient arriving at the layer's output, as carried (αδ).
        t_uf (float): allowed underflow probability T_uf (paper: 1e-3).
        fmt: format whose range is targeted: u = its smallest subnormal
            (2^-24 for float16), u_max its largest finite value.
        bound (str), gain (float): the overflow bound (module docstring);
            ``'product'``, the paper's, by default here.
        max_scale (float or None): *not in the paper*: cap on β.
        group_axis: see :func:`gemm_scale_bounds`.

    Returns:
        float: a power of two. 1 when σ_p = 0 or the statistics are not
        finite (a non-finite gradient; that step is skipped anyway).
    """
    lower, upper = gemm_scale_bounds(W, g, t_uf, fmt, bound, gain,
                                     group_axis)
    if lower is None or not math.isfinite(lower):
        return 1.0
    beta = max(lower, 1.0)
    if upper is not None:
        # upper == 0 means max|W|·max|g| is infinite: an Inf in W or g.
        if not (math.isfinite(upper) and upper > 0):
            return 1.0
        if upper < beta:
            beta = upper
    if max_scale is not None:
        beta = min(beta, max_scale)
    return round_down_pow2(beta)


# -- style='authors': β as the authors' final code computes it --------------
#
# kumasento/gradient-scaling (Chainer 7, January 2020),
# ada_loss/chainer_impl/ada_loss_chainer.py: get_loss_scale_by_approx_range,
# get_mean_and_std(_of_product), bound_loss_scale_by_heuristics, and
# ada_loss/core.py: AdaLoss.get_range / get_power_of_two_scale. Every
# operation below is the NumPy operation of theirs on the same NumPy scalar
# types (float32 statistics, their float64 / float32 mixes), so that the
# result is theirs bit for bit under whichever NumPy runs both.

#: their u_min for float16 (``AdaLoss.get_u_min``); the paper says 2^-24
AUTHORS_U_MIN_FLOAT16 = 6.0e-8


def authors_range(fmt='float16'):
    """(u_min, u_max) as NumPy float32 scalars, their ``AdaLoss.range``:
    (6.0e-8, 65504) for float16. Their code knows float16 and float32 only;
    for any other format (FP8, ...) this uses that format's smallest
    subnormal and largest value (*an extension, not theirs*)."""
    f = get_format(fmt)
    u_min = AUTHORS_U_MIN_FLOAT16 if f.name == 'float16' else f.u_min
    r = numpy.array([u_min, f.u_max], dtype=numpy.float32)
    return r[0], r[1]


def _authors_mean_std(a):
    # their get_mean_and_std: the array cast to float32, then NumPy's own
    # float32 mean and std (population std, ddof 0)
    xp = _xp(a)
    a = a.astype(numpy.float32, copy=False)
    mu, sigma = a.mean(), a.std()
    if xp is not numpy:
        mu, sigma = numpy.float32(float(mu)), numpy.float32(float(sigma))
    return mu, sigma


def _authors_min_max(a):
    lo, hi = a.min().astype(numpy.float32), a.max().astype(numpy.float32)
    if _xp(a) is not numpy:
        lo, hi = numpy.float32(float(lo)), numpy.float32(float(hi))
    return lo, hi


def authors_raw_scale(W, g, t_uf=1e-3, fmt='float16'):
    """β before their caps and rounding: ``get_loss_scale_by_approx_range``
    (their default ``bound_by_fan_in=True``).

    With fan = :func:`reference_fan` (W), as theirs:

        σ_o  = √((σ_g² + μ_g²)(σ_W² + μ_W²)) · √(0.5 · fan)
                 (the product's σ times √(fan/2): "assuming the existence
                  of ReLU", the σ of an input-gradient entry, a sum of fan
                  products of which half are zero; the paper's text and
                  our ``style=paper`` use the product's σ alone)
        lower = max(u_min / (√2 · erfinv(T_uf) · σ_o), 1)
        upper = (u_max / fan) / (max|g| · max|W|)
        β_raw = min(lower, upper)          (may be < 1)

    Returns a NumPy float32 scalar; 1 when W or g is empty or σ = 0; None
    when the statistics are not finite (a non-finite gradient: their code
    raises there, in ``check_scale``).
    """
    if not 0 < t_uf < 1:
        raise ValueError('t_uf must be in (0, 1), got {!r}'.format(t_uf))
    one = numpy.array(1.0, dtype=numpy.float32)
    if not (g.size and W.size):
        return one
    u_min, u_max = authors_range(fmt)
    # get_mean_and_std_of_product(g, W): X = g, Y = W (an Inf in g or W
    # gives NaN statistics, quietly: None below)
    with numpy.errstate(invalid='ignore', over='ignore'):
        g_mu, g_sigma = _authors_mean_std(g)
        w_mu, w_sigma = _authors_mean_std(W)
        o_var = (g_sigma ** 2 + g_mu ** 2) * (w_sigma ** 2 + w_mu ** 2)
        o_sigma = numpy.sqrt(o_var).astype(numpy.float32)
    if not numpy.isfinite(o_sigma):
        return None
    if o_sigma == 0:
        return one
    g_min, g_max = _authors_min_max(g)
    W_min, W_max = _authors_min_max(W)
    fan = float(numpy.array(reference_fan(W), dtype=numpy.float32).item())
    u_max = u_max / fan
    o_max = numpy.abs(numpy.array([g_max * W_max, g_min * W_min,
                                   g_max * W_min, g_min * W_max])).max()
    o_sigma = o_sigma * numpy.sqrt(0.5 * fan)
    n_uf_threshold = erfinv(t_uf) * numpy.sqrt(2)
    loss_scale = u_min / (n_uf_threshold * o_sigma)
    loss_scale = numpy.maximum(loss_scale, one)
    if not (numpy.isfinite(loss_scale) and numpy.isfinite(o_max)):
        return None
    upper_scale = u_max / o_max
    return numpy.minimum(loss_scale, upper_scale).astype(numpy.float32)


def _authors_cap(cap, fmt):
    # their AdaLoss stores both caps in the scale dtype (float16 when
    # training in float16: a cap above 65504 is infinite there, i.e. off)
    if get_format(fmt).name == 'float16':
        with numpy.errstate(over='ignore'):
            cap = numpy.float16(cap)
    return numpy.array(cap, dtype=numpy.float32)


def authors_caps(scale, alpha=1.0, max_layer_scale=None,
                 max_accum_scale=None, fmt='float16'):
    """Their ``bound_loss_scale_by_heuristics``: β ≤ max_accum_scale / α
    (α the scale the gradient arrived with) and β ≤ max_layer_scale, in
    their types (the caps stored in float16 for float16 training); a cap
    that is None is not applied (their code always applies both, by
    default 1024 and 16)."""
    scale = numpy.asarray(scale, dtype=numpy.float32)
    if max_accum_scale is not None:
        accum = _authors_cap(max_accum_scale, fmt) \
            / numpy.array(float(alpha))
        scale = numpy.minimum(accum, scale)
    if max_layer_scale is not None:
        scale = numpy.minimum(_authors_cap(max_layer_scale, fmt), scale)
    return scale.astype(numpy.float32)


def authors_round_pow2(scale, fmt='float16'):
    """Their ``get_power_of_two_scale``: 2^floor(log2 β) with log2 in
    float32, then cast to the scale dtype (float16 when training in float16).

    Unlike :func:`round_down_pow2` it rounds *up* a β within float32's
    log2 resolution below a power of two (log2 in float32 rounds to the
    integer), as theirs. A float16 β ≥ 2^16 is infinite in theirs (their
    code then stops on an assertion); here it is held at 2^15. Returns a
    Python float.
    """
    scale = numpy.asarray(scale, dtype=numpy.float32)
    pot = numpy.power(2, numpy.floor(numpy.log2(scale)))
    if get_format(fmt).name == 'float16':
        with numpy.errstate(over='ignore'):
            pot = pot.astype(numpy.float16)
        if not numpy.isfinite(pot):
            return 2.0 ** 15
    return float(pot)


def authors_loss_scale(W, g, t_uf=1e-3, fmt='float16', alpha=1.0,
                       max_layer_scale=None, max_accum_scale=None):
    """β of one GEMM as the authors' final code computes it
    (``AdaLoss.get_loss_scale`` with ``loss_scale_method='approx_range'``):
    :func:`authors_raw_scale`, then :func:`authors_caps` (α the incoming
    gradient's scale), then :func:`authors_round_pow2`.

    Returns a Python float, a power of two (possibly < 1: their accumulated
    cap or overflow bound can ask for it). 1 for non-finite statistics
    (theirs raises; the step is skipped here anyway)."""
    raw = authors_raw_scale(W, g, t_uf, fmt)
    if raw is None:
        return 1.0
    return authors_round_pow2(
        authors_caps(raw, alpha, max_layer_scale, max_accum_scale, fmt), fmt)
