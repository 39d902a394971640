"""Per-tensor scaling against Transformer Engine's formulas, written out here
in float32 scalar arithmetic, and the casts against ml_dtypes:

* current: scale = fmt_max / amax (448 for E4M3, 57344 for E5M2); amax 0
  or non-finite -> 1; an FP32-overflowing quotient -> FP32 max; pow2 ->
  the power of two at or below;
* delayed: history of 1024 by default, max over it, margin 0,
  scale = fmt_max / amax / 2^margin, amax 0 or non-finite keeps the
  previous scale, the first cast at scale 1;
* values: ml_dtypes' cast of clip(x · scale, ±fmt_max), times 1/scale.
"""
import ml_dtypes
import numpy as np
import pytest

from ada_loss.formats.per_tensor import amax_of
from ada_loss.formats import (DelayedScaling, current_scale, delayed_scale,
                              quantize_per_tensor, quantize_with_scale)

F32 = np.float32
MAX = {'float8_e4m3fn': 448.0, 'float8_e5m2': 57344.0}
ML = {'float8_e4m3fn': ml_dtypes.float8_e4m3fn,
      'float8_e5m2': ml_dtypes.float8_e5m2}


def _ref_values(x, element, scale):
    m = F32(MAX[element])
    y = np.clip(x * F32(scale), -m, m)
    return y.astype(ML[element]).astype(F32) * (F32(1) / F32(scale))


@pytest.mark.parametrize('element', sorted(MAX))
def test_current_scale_formula(element):
    m = F32(MAX[element])
    for amax in (1.0, 3.0, 0.1, 7e-3, 448.0, 1e30, 2.0 ** -110):
        assert current_scale(amax, element) == m / F32(amax)
    for amax in (0.0, np.inf, np.nan):
        assert current_scale(amax, element) == F32(1)
    # the quotient overflows FP32: the largest float32
    assert current_scale(1e-45, element) == np.finfo(F32).max
    s = current_scale(3.0, element, pow2=True)
    assert s == 2.0 ** np.floor(np.log2(float(m) / 3.0))


@pytest.mark.parametrize('element', sorted(MAX))
def test_quantize_per_tensor_values(element):
    rng = np.random.RandomState(0)
    x = (rng.standard_normal(4096) * 2.0 ** rng.uniform(-30, 30, 4096)
         ).astype(F32)
    for pow2 in (False, True):
        got, scale = quantize_per_tensor(x, element, pow2=pow2)
        amax = F32(np.abs(x).max())
        assert scale == current_scale(amax, element, pow2)
        want = _ref_values(x, element, scale)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # a given amax below the tensor's: values beyond saturate (no NaN)
    got, scale = quantize_per_tensor(x, element, amax=1.0)
    assert np.isfinite(got).all()
    assert np.abs(got).max() == F32(F32(MAX[element]) * (F32(1) / scale))


def test_non_finite_inputs_give_nan():
    x = F32([1.0, np.inf, -np.inf, np.nan, 2.0])
    got, scale = quantize_per_tensor(x, 'float8_e5m2')
    assert scale == 1
    assert np.isnan(got[1:4]).all() and got[0] == 1 and got[4] == 2
    got = quantize_with_scale(x, 'float8_e4m3fn', 4.0, amax=np.inf)
    assert np.isnan(got[1:4]).all()


def test_delayed_scaling_recipe():
    d = DelayedScaling('float8_e4m3fn')
    assert len(d.amax_history) == 1024 and d.margin == 0
    assert d.scale == 1                           # the first step's scale
    x1 = F32([0.5, -2.0, 1.0])
    y = d.quantize(x1)
    assert np.array_equal(y, _ref_values(x1, 'float8_e4m3fn', 1.0))
    assert d.scale == F32(448) / F32(2)           # from amax 2
    d.record(8.0)
    assert d.scale == F32(448) / F32(8)
    d.record(0.5)                                 # max over history: 8
    assert d.scale == F32(448) / F32(8)
    s = d.scale
    d.record(0.0)
    assert d.scale == s
    d.record(np.inf)                              # inf in the history:
    assert d.scale == s                           # the previous scale
    # history length 2, margin 1: the window slides
    d = DelayedScaling('float8_e5m2', history=2, margin=1)
    for amax, want in ((4.0, 57344 / 4 / 2), (1.0, 57344 / 4 / 2),
                       (2.0, 57344 / 2 / 2), (0.5, 57344 / 2 / 2),
                       (0.25, 57344 / 0.5 / 2)):
        d.record(amax)
        assert d.scale == F32(want), amax
    d = DelayedScaling('float8_e4m3fn', pow2=True)
    d.record(3.0)
    assert d.scale == 128.0        # 448/3 = 149.3 -> 2^7
    # the history's max is the formula's amax
    h = F32([1.0, 5.0, 0.0, 2.0])
    assert delayed_scale(h, 7.0, 'float8_e4m3fn') == F32(448) / F32(5)
    assert delayed_scale(F32([0, 0]), 7.0, 'float8_e4m3fn') == F32(7)
    # TE reduces the history with fmaxf: a NaN entry is ignored
    assert delayed_scale(F32([1, np.nan]), 7.0, 'float8_e4m3fn') == F32(448)


def test_delayed_scaling_saturates_beyond_history():
    d = DelayedScaling('float8_e4m3fn', history=4)
    d.record(1.0)                     # scale 448
    y = d.quantize(F32([10.0, 0.5]))
    assert y[0] == F32(448) * (F32(1) / F32(448)) and y[1] == 0.5
    assert d.scale == F32(448) / F32(10)


def test_one_nan_does_not_freeze_delayed_scaling():
    """Issue 38, defect 8: TE reduces amaxes with fmaxf (NaN ignored); one
    NaN entry used to freeze the scale for the whole history (1024 steps)
    while the tensors grew and saturated."""
    d = DelayedScaling('float8_e4m3fn')
    d.quantize(F32([1.0, 2.0]))
    assert d.scale == F32(448) / F32(2)
    y = d.quantize(F32([np.nan, 4.0]))
    assert np.isnan(y[0])                  # the NaN itself stays visible
    assert d.scale == F32(448) / F32(4)    # its amax is 4, not NaN
    d.quantize(F32([8.0]))
    assert d.scale == F32(448) / F32(8)
    assert amax_of(F32([np.nan, np.nan])) == 0.0
    assert amax_of(F32([np.nan, -3.0])) == 3.0
    assert amax_of(F32([np.inf, 1.0])) == np.inf
