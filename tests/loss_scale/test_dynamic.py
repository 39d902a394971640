"""Dynamic loss scaling in its three styles (ada_loss.loss_scale.dynamic):
each trajectory over scripted clean/overflow steps is the source's, Chainer's
step for step against Chainer's own optimizer; options and state."""
import math
import warnings

import numpy as np
import pytest

import chainer
import chainer.functions as F

from ada_loss.loss_scale.dynamic import (
    STYLES, ChainerLossScale, DynamicLossScale, TFLossScale,
    describe_styles, make_dynamic_loss_scale, style_options)
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import MixedPrecisionUpdater

C, O = False, True   # a clean step, an overflowing step


def run(state, script):
    return [state.update(s) for s in script]


# ------------------------------------------------ PyTorch GradScaler

def test_pytorch_defaults_are_gradscalers():
    s = make_dynamic_loss_scale('pytorch')
    assert type(s) is DynamicLossScale
    assert (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval,
            s.min_scale, s.max_scale) == (2.0 ** 16, 2.0, 0.5, 2000, None,
                                          None)
    assert make_loss_scaling('dynamic').state.state_dict() == \
        {'scale': 65536.0, 'clean_steps': 0}


def test_pytorch_trajectory():
    """GradScaler.update: ×backoff on every overflow (tracker reset), ×growth
    when the tracker of consecutive clean steps reaches growth_interval."""
    s = DynamicLossScale(init_scale=1024, growth_interval=3)
    got = run(s, [C, C, C, O, C, C, O, C, C, C, O, O, O, C])
    assert got == [1024, 1024, 2048, 1024, 1024, 1024, 512, 512, 512, 1024,
                   512, 256, 128, 128]
    assert s.clean_steps == 1


@pytest.mark.filterwarnings('error::RuntimeWarning')   # growth past f32
def test_pytorch_float32_scale():
    """The scale is a float32 tensor: each product (in double) is rounded to
    float32, and a growth that would overflow float32 is not applied; there
    is no lower clamp."""
    s = DynamicLossScale(init_scale=1000.0, growth_factor=1.1,
                         backoff_factor=0.3, growth_interval=1)
    want, in_double = np.float32(1000.0), 1000.0
    discriminating = False
    for step in [C, C, O, C, O, O, C]:
        factor = 0.3 if step else 1.1
        want = np.float32(float(want) * factor)
        in_double *= factor
        assert s.update(step) == float(want)
        discriminating |= float(want) != in_double
    assert discriminating   # a double scale would differ
    top = DynamicLossScale(init_scale=2.0 ** 127, growth_interval=1)
    assert run(top, [C, C]) == [2.0 ** 127] * 2
    low = DynamicLossScale(init_scale=2.0 ** -140)
    assert run(low, [O] * 10)[-1] == 0.0   # float32 underflow, as PyTorch


# ------------------------------------------------ TensorFlow / the Ascend guide

def test_tf_defaults_are_seed_002s():
    s = make_dynamic_loss_scale('tf')
    assert type(s) is TFLossScale
    assert (s.scale, s.incr_every_n_steps, s.decr_every_n_nan_or_inf,
            s.incr_ratio, s.decr_ratio, s.min_scale, s.max_scale) == (
        2.0 ** 32, 1000, 2, 2.0, 0.5, 1.0, None)


def test_tf_trajectory():
    """ExponentialUpdateLossScaleManager.update_loss_scale: overflows
    *accumulate* (a clean step in between resets only the clean count) and
    the scale drops on the decr_every_n_nan_or_inf-th; growth needs
    incr_every_n_steps consecutive clean steps; every change resets both."""
    s = TFLossScale(init_scale=2.0 ** 10, incr_every_n_steps=3)
    script = [O, C, O, C, C, O, C, C, C, O, O, O, O]
    got, trace = [], []
    for step in script:
        got.append(s.update(step))
        trace.append((s.good_steps, s.bad_steps))
    assert got == [1024, 1024, 512, 512, 512, 512, 512, 512, 1024, 1024,
                   512, 512, 256]
    assert trace == [(0, 1), (1, 1), (0, 0), (1, 0), (2, 0), (0, 1),
                     (1, 1), (2, 1), (0, 0), (0, 1), (0, 0), (0, 1), (0, 0)]


@pytest.mark.filterwarnings('error::RuntimeWarning')   # growth past f32
def test_tf_float32_and_bounds():
    """float32 products with the ratio converted to float32; never below 1;
    a growth to a non-finite float32 is not applied."""
    s = TFLossScale(init_scale=100.0, decr_every_n_nan_or_inf=1,
                    decr_ratio=0.8)
    want = np.float32(100.0)
    for _ in range(5):
        want = np.maximum(np.float32(1), want * np.float32(0.8))
        assert s.update(O) == float(want)
    assert run(s, [O] * 30)[-1] == 1.0
    top = TFLossScale(init_scale=2.0 ** 127, incr_every_n_steps=1)
    assert run(top, [C, C]) == [2.0 ** 127] * 2
    assert (top.good_steps, top.bad_steps) == (0, 0)


# ------------------------------------------------ Chainer, vs Chainer itself

class _W(chainer.Link):
    def __init__(self, dtype):
        super(_W, self).__init__()
        with self.init_scope():
            self.w = chainer.Parameter(
                np.linspace(-1, 1, 4).astype(dtype))


def _lossfun(link):
    def f(x):
        return F.sum(F.broadcast_to(link.w, x.shape) * x)
    return f


def _chainer_reference(xs, dtype, interval):
    """Chainer's own dynamic loss scaling: optimizer.loss_scaling() and
    optimizer.update(lossfun), which checks the gradients
    (check_nan_in_grads), skips and updates the scale itself."""
    link = _W(dtype)
    opt = chainer.optimizers.MomentumSGD(0.01)
    opt.setup(link)
    opt.loss_scaling(interval=interval)
    scales, ws = [], []
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')   # "Non finite number found ..."
        for x in xs:
            opt.update(_lossfun(link), x[None])
            scales.append(opt._loss_scale)
            ws.append(link.w.array.copy())
    return scales, ws


def _ours(xs, dtype, mode):
    """The same steps through MixedPrecisionUpdater and dynamic:style=chainer
    (our own finite check and skip)."""
    link = _W(dtype)
    opt = chainer.optimizers.MomentumSGD(0.01)
    opt.setup(link)
    sc = make_loss_scaling(mode)
    it = chainer.iterators.SerialIterator(list(xs), 1, shuffle=False)
    up = MixedPrecisionUpdater(it, opt, sc, mode=mode,
                               loss_func=_lossfun(link))
    scales, ws = [], []
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for _ in xs:
            up.update()
            scales.append(sc.scale)
            ws.append(link.w.array.copy())
    return scales, ws, up


def _script():
    """Doubling until the clamp at 65504, the first overflow, the slow
    growth, runs of overflows down to the clamp at 1, and isolated ones."""
    return ([C] * 20 + [O] + [C] * 25 + [O, O] + [C] * 9 + [O] * 20
            + [C] * 40 + [O, C, O, C, C, O] + [C] * 10)


@pytest.mark.parametrize('interval', [1, 8, 1000])
def test_chainer_style_equals_chainers_own_step_for_step(interval):
    """Scripted Inf in the gradients on the overflow steps: the scale after
    every step and the weights after every step are Chainer's."""
    script = _script()
    xs = []
    for over in script:
        x = np.full(4, 1e-3, np.float32)
        if over:
            x[2] = np.inf
        xs.append(x)
    want_scales, want_ws = _chainer_reference(xs, np.float32, interval)
    got_scales, got_ws, up = _ours(
        xs, np.float32, 'dynamic:style=chainer,interval={}'.format(interval))
    assert got_scales == want_scales   # exact, every step
    for a, b in zip(got_ws, want_ws):
        np.testing.assert_array_equal(a, b)
    assert up.skipped_steps == sum(script)
    # the clamps were reached
    assert 65504 in want_scales and 1 in want_scales
    # and the pure state machine gives the same
    assert run(ChainerLossScale(interval=interval), script) == want_scales


def test_chainer_style_equals_chainers_own_on_fp16_overflow():
    """No scripted Inf: FP16 gradients x·scale overflow where the scale is
    too large for this step's x, so which steps overflow depends on the
    trajectory itself."""
    rng = np.random.RandomState(0)
    xs = [np.full(4, 2.0 ** rng.randint(-6, 3), np.float16)
          for _ in range(150)]
    want_scales, want_ws = _chainer_reference(xs, np.float16, 4)
    got_scales, got_ws, up = _ours(xs, np.float16,
                                   'dynamic:style=chainer,interval=4')
    assert got_scales == want_scales
    for a, b in zip(got_ws, want_ws):
        np.testing.assert_array_equal(a, b)
    assert 5 < up.skipped_steps < 100


def test_chainer_defaults():
    s = make_loss_scaling('dynamic:style=chainer').state
    assert type(s) is ChainerLossScale
    assert (s.scale, s.interval, s.min_scale, s.max_scale,
            s.overflowed_ever) == (1.0, 1000, 1.0, 65504.0, False)
    assert s.multiplier == math.pow(2.0, 1.0 / 1000)
    # doubles every step until the first overflow
    assert run(s, [C] * 5) == [2, 4, 8, 16, 32]


# ------------------------------------------------ options and state

def test_style_options():
    assert STYLES == ('pytorch', 'chainer', 'tf')
    assert style_options('pytorch') == [
        'init_scale', 'growth_factor', 'backoff_factor', 'growth_interval',
        'min_scale', 'max_scale']
    assert style_options('chainer') == [
        'interval', 'init_scale', 'min_scale', 'max_scale']
    assert style_options('tf') == [
        'init_scale', 'incr_every_n_steps', 'decr_every_n_nan_or_inf',
        'incr_ratio', 'decr_ratio', 'min_scale', 'max_scale']


def test_describe_styles_lists_every_option_with_its_default():
    text = describe_styles().splitlines()
    assert len(text) == 3
    assert text[1].startswith('dynamic:style=chainer')
    assert 'interval=1000, init_scale=1, min_scale=1, max_scale=65504' \
        in text[1]
    assert 'init_scale=2^16, growth_factor=2' in text[0]
    assert 'decr_every_n_nan_or_inf=2, incr_ratio=2, decr_ratio=0.5' \
        in text[2]


def test_user_clamps():
    s = make_dynamic_loss_scale('pytorch', init_scale=4, growth_interval=1,
                                min_scale=1, max_scale=16)
    assert run(s, [C] * 4) == [8, 16, 16, 16]
    assert run(s, [O] * 6) == [8, 4, 2, 1, 1, 1]
    c = make_dynamic_loss_scale('chainer', max_scale=8, min_scale=0.25)
    assert run(c, [C] * 5 + [O] * 7) == [2, 4, 8, 8, 8, 4, 2, 1, 0.5, 0.25,
                                         0.25, 0.25]


@pytest.mark.parametrize('style, options, needles', [
    ('torch', {}, ['torch', 'pytorch, chainer, tf']),
    (None, {}, ['pytorch, chainer, tf']),
    ('chainer', {'growth_interval': 3},
     ['chainer', 'growth_interval', 'interval, init_scale']),
    ('pytorch', {'interval': 3}, ['pytorch', 'interval']),
    ('tf', {'growth_factor': 2}, ['tf', 'growth_factor',
                                  'decr_every_n_nan_or_inf']),
    ('pytorch', {'growth_factor': 1}, ['growth_factor', '> 1']),
    ('pytorch', {'growth_factor': 0.5}, ['growth_factor', '> 1']),
    ('pytorch', {'growth_factor': float('inf')}, ['growth_factor']),
    ('pytorch', {'backoff_factor': 1}, ['backoff_factor', '(0, 1)']),
    ('tf', {'incr_ratio': 1.0}, ['incr_ratio', '> 1']),
    ('tf', {'decr_ratio': 1.5}, ['decr_ratio', '(0, 1)']),
    ('tf', {'decr_every_n_nan_or_inf': 0}, ['decr_every_n_nan_or_inf',
                                            'positive integer']),
    ('tf', {'incr_every_n_steps': 2.5}, ['incr_every_n_steps']),
    ('chainer', {'interval': 0}, ['interval', 'positive integer']),
    ('chainer', {'interval': float('inf')}, ['interval']),
    ('chainer', {'init_scale': 0}, ['init_scale', 'positive finite']),
    ('chainer', {'min_scale': 8, 'max_scale': 4}, ['min_scale',
                                                   'max_scale']),
    ('pytorch', {'init_scale': 'abc'}, ['init_scale']),
])
def test_bad_options(style, options, needles):
    with pytest.raises(ValueError) as info:
        make_dynamic_loss_scale(style, **options)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


@pytest.mark.parametrize('style, script', [
    ('pytorch', [C, C, O, C]),
    ('chainer', [C, C, O, C]),
    ('tf', [O, C, C]),
])
def test_state_dict_round_trip_resumes_exactly(style, script):
    opts = {'pytorch': {'growth_interval': 3},
            'chainer': {'interval': 3},
            'tf': {'incr_every_n_steps': 3, 'init_scale': 64}}[style]
    a = make_dynamic_loss_scale(style, **opts)
    run(a, script)
    b = make_dynamic_loss_scale(style, **opts)
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    rest = [C, C, C, O, C, O, O, C, C, C, C]
    assert run(b, rest) == run(a, rest)
