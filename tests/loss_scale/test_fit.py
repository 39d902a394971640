"""Fitting a gradient into its format decides on the rounded value
(ada_loss/loss_scale/fit.py; issue 38, defects 2 and 9).

The reference here is brute force: every power of two 2^-k, k = 0..200, is
tried by rounding ``peak·2^-k`` with ml_dtypes (an independent
implementation of the formats), and the largest that neither becomes
Inf/NaN nor, in a saturating format, reaches u_max is the answer."""
import math

import ml_dtypes
import numpy as np
import pytest

from ada_loss.formats import get_format
from ada_loss.functions.linear import LinearGradData
from ada_loss.loss_scale.fit import fit_ratio, overflows, top_binade_scale

#: project format name → ml_dtypes type
FORMATS = {
    'fp8_e4m3': ml_dtypes.float8_e4m3fn,
    'fp8_e5m2': ml_dtypes.float8_e5m2,
    'float16': np.float16,
    'bfloat16': ml_dtypes.bfloat16,
    'fp6_e3m2': ml_dtypes.float6_e3m2fn,
    'fp6_e2m3': ml_dtypes.float6_e2m3fn,
    'fp4_e2m1': ml_dtypes.float4_e2m1fn,
}


def _stored(value, dtype):
    """``value`` (float32) rounded to ``dtype`` by ml_dtypes; a format
    without Inf/NaN saturates in ml_dtypes' cast only for finite inputs
    below its own overflow: read an out-of-range value as overflow."""
    with np.errstate(over='ignore', invalid='ignore'):
        return float(np.float32(value).astype(dtype).astype(np.float64))


def _fits(v, name):
    """Whether the float32 magnitude ``v`` is stored by ml_dtypes without
    overflowing the format."""
    fmt = get_format(name)
    dtype = FORMATS[name]
    v = np.float32(v)
    if fmt.saturates:
        # ml_dtypes' fn-formats without NaN clamp; anything whose rounding
        # reaches u_max counts as an overflow (the updater's)
        return abs(_stored(v, dtype)) < fmt.u_max and v < 2 * fmt.u_max
    return math.isfinite(_stored(v, dtype))


def _reference_ratio(peak, name):
    for k in range(0, 200):
        if _fits(peak * 2.0 ** -k, name):
            return 2.0 ** -k
    raise AssertionError('no ratio fits')


def _magnitudes(u_max, rng):
    """Values around u_max: exactly u_max, just above and below it, what
    rounds down to it, far above it, random ones over many binades."""
    vals = [u_max, u_max * (1 + 2.0 ** -12), u_max * (1 - 2.0 ** -12),
            u_max * 1.0178, u_max * 1.5, u_max * 2, u_max * 2 - 1e-3,
            233618.6, 27.0, 6.1, 7.6, 465.0, 463.9, 65519.0, 65520.0]
    vals += list(u_max * 2.0 ** rng.uniform(-3, 40, 300))
    with np.errstate(over='ignore'):
        vals = [float(np.float32(v)) for v in vals]
    return [v for v in vals if math.isfinite(v)]


@pytest.mark.parametrize('name', sorted(FORMATS))
def test_fit_ratio_is_the_largest_power_of_two_whose_rounding_fits(name):
    fmt = get_format(name)
    rng = np.random.RandomState(len(name))
    for peak in _magnitudes(fmt.u_max, rng):
        assert fit_ratio(peak, fmt) == _reference_ratio(peak, name), peak


def test_the_issues_cases():
    e4m3 = get_format('fp8_e4m3')
    # defect 9: 2^-9 · 233618.6 = 456.3 rounds to 448 (finite): the largest
    assert fit_ratio(233618.6, e4m3) == 2.0 ** -9
    # defect 2: 448 exactly is a finite E4M3 value: nothing to fit
    assert not overflows(448.0, e4m3) and fit_ratio(448.0, e4m3) == 1.0
    # saturating fp6_e3m2: 27 rounds up to its u_max 28 — an overflow
    e3m2 = get_format('fp6_e3m2')
    assert overflows(27.0, e3m2) and fit_ratio(27.0, e3m2) == 0.5


def _grad_data_scale(gy_value, fmt_name, output_scale=1.0):
    """The scale LinearGradData (fit_output) produces gx = gy·W at, with
    W = 1 (1×1), in float32 storage rounded to the format."""
    node = LinearGradData(output_scale, get_format(fmt_name), True)
    W = np.ones((1, 1), np.float32)
    gy = np.full((1, 1), gy_value, np.float32)
    gx, = node.forward((W, gy))
    return node.applied_scale, float(gx[0, 0])


def test_gemm_output_at_u_max_is_not_fitted():
    """Defect 2: |β·gx| = 448 exactly in E4M3 was halved; a value that
    rounds up to u_max in a saturating format was not fitted."""
    scale, gx = _grad_data_scale(448.0, 'fp8_e4m3')
    assert scale == 1.0 and gx == 448.0
    scale, gx = _grad_data_scale(224.0, 'fp8_e4m3', output_scale=2.0)
    assert scale == 2.0 and gx == 448.0
    scale, gx = _grad_data_scale(27.0, 'fp6_e3m2')
    assert scale == 0.5 and gx == 14.0       # 13.5 → 14, below u_max 28
    scale, gx = _grad_data_scale(456.3, 'fp8_e4m3')
    assert scale == 1.0 and gx == 448.0      # rounds down: finite


@pytest.mark.parametrize('name', sorted(FORMATS))
def test_fitted_output_never_overflows_and_is_unchanged_where_it_fits(name):
    """Property over formats and magnitudes: the fitted GEMM output is
    exactly the unfitted one wherever that did not overflow (u_max
    included), and never overflows otherwise."""
    fmt = get_format(name)
    rng = np.random.RandomState(7)
    for v in _magnitudes(fmt.u_max, rng):
        if not math.isfinite(v):
            continue
        scale, gx = _grad_data_scale(v, name)
        plain = float(fmt.quantize(np.array([v], np.float32))[0])
        if not overflows(v, fmt):
            assert scale == 1.0 and gx == plain, v
        else:
            assert scale < 1.0 and not overflows(abs(gx), fmt), v
            assert gx == float(fmt.quantize(
                np.array([v * scale], np.float32))[0]), v


@pytest.mark.parametrize('name', sorted(FORMATS))
def test_top_binade_scale_is_the_largest_power_of_two_that_fits(name):
    """α_{N+1} of ``adaptive:init_scale=amax``: the largest 2^k (k of any
    sign) whose product with the peak does not overflow when rounded, by
    brute force with ml_dtypes."""
    fmt = get_format(name)
    rng = np.random.RandomState(11)
    for peak in list(2.0 ** rng.uniform(-30, 30, 200)) + [fmt.u_max, 1.0,
                                                          1 / 64.]:
        peak = float(np.float32(peak))
        alpha = top_binade_scale(peak, fmt)
        # brute force: scan k downwards from far above
        want = next(2.0 ** k for k in range(160, -160, -1)
                    if peak * 2.0 ** k < 3.4028234e38 and _fits(peak * 2.0 ** k,
                                                       name))
        assert alpha == want, peak
    assert top_binade_scale(0.0, fmt) == 1.0
    assert top_binade_scale(float('nan'), fmt) == 1.0
