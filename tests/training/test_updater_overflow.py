"""MixedPrecisionUpdater's (and the worker simulator's) overflow check
(ada_loss/training/updater.py): Inf/NaN, and in a gradient format that
saturates a value at ± u_max; the step is skipped and dynamic scaling backs
off as in IEEE formats. Dynamic-style state in snapshots."""
import warnings

import numpy as np
import pytest

import chainer
import chainer.functions as F

from ada_loss import links as AL
from ada_loss.communication import CommPolicy
from ada_loss.communication.simulator import SimulatedDataParallelUpdater
from ada_loss.formats import get_format
from ada_loss.scaling import NonFiniteGradientError, make_loss_scaling
from ada_loss.training import MixedPrecisionUpdater, all_grads_finite
from ada_loss.training.updater import nonfinite_params

FP6 = get_format('fp6_e3m2')     # saturates at ±28
F16 = get_format('float16')


class Net(chainer.Chain):
    """A GEMM link and a non-GEMM parameter (like batch norm's γ)."""

    def __init__(self):
        super(Net, self).__init__()
        with self.init_scope():
            self.fc = AL.Linear(4, 3, nobias=True,
                                initialW=np.full((3, 4), 0.1, np.float32))
            self.gain = chainer.Parameter(np.ones(3, np.float32))

    def forward(self, x):
        return F.sum(self.fc(x) * F.broadcast_to(self.gain, (len(x), 3)))


def _grads(net, fc_value, gain_value=0.0):
    net.cleargrads()
    net.fc.W.grad = np.full(net.fc.W.shape, fc_value, np.float32)
    net.gain.grad = np.full(3, gain_value, np.float32)


def test_saturating_format_value_at_u_max_is_an_overflow():
    assert FP6.saturates and FP6.u_max == 28.0 and not F16.saturates
    net = Net()
    for value in (FP6.u_max, -FP6.u_max):
        _grads(net, 0.5)
        net.fc.W.grad[1, 2] = value
        assert not all_grads_finite(net, FP6)
        assert nonfinite_params(net, FP6) == ['/fc/W']
        assert all_grads_finite(net, F16)      # finite: IEEE sees nothing
        assert all_grads_finite(net)
    _grads(net, np.float32(24.0))              # FP6's next value below 28
    assert all_grads_finite(net, FP6)
    for bad in (np.inf, np.nan):
        _grads(net, 0.5)
        net.fc.W.grad[0, 0] = bad
        assert not all_grads_finite(net, FP6)
        assert not all_grads_finite(net, F16)


def test_only_gradients_stored_in_the_format_are_held_to_u_max():
    """With an emulated precision the GEMM links' gradients are in the
    format; a non-GEMM gradient stays FP32 and may exceed u_max."""
    net = Net()
    _grads(net, 0.5, gain_value=1000.0)
    assert not all_grads_finite(net, FP6)      # no format links: all held
    net.fc.gemm_formats = (None, FP6)
    assert all_grads_finite(net, FP6)
    net.gain.grad[0] = np.inf
    assert not all_grads_finite(net, FP6)
    _grads(net, FP6.u_max)
    assert not all_grads_finite(net, FP6)


def _updater(mode, xs, fmt=None, precision_formats=None):
    net = Net()
    if precision_formats is not None:
        net.fc.gemm_formats = precision_formats
    opt = chainer.optimizers.MomentumSGD(0.01)
    opt.setup(net)
    sc = make_loss_scaling(mode)
    if fmt is not None:
        sc.fmt = fmt
    it = chainer.iterators.SerialIterator(xs, 1, shuffle=False)
    return MixedPrecisionUpdater(it, opt, sc, mode=mode), net, sc


@pytest.mark.parametrize('style', ['pytorch', 'chainer', 'tf'])
def test_constructed_saturation_is_skipped_and_backs_off(style):
    """W's gradient is x·scale: x = u_max / scale makes it exactly ±u_max
    (what a saturated overflow looks like). The step is skipped — weights,
    momenta untouched — and the scale backs off as after an Inf."""
    mode = {'pytorch': 'dynamic:init_scale=64',
            'chainer': 'dynamic:style=chainer,init_scale=64',
            'tf': 'dynamic:style=tf,init_scale=64,'
                  'decr_every_n_nan_or_inf=1'}[style]
    sat = np.full((1, 4), FP6.u_max / 64, np.float32)
    below = np.full((1, 4), 0.25 / 64, np.float32)
    up, net, sc = _updater(mode, [sat[0], below[0]], fmt=FP6)
    w0 = net.fc.W.array.copy()
    up.update()
    assert up.skipped_steps == 1 and sc.scale == 32
    np.testing.assert_array_equal(net.fc.W.array, w0)
    assert up.get_optimizer('main').t == 0
    up.update()
    assert up.skipped_steps == 1
    assert not np.array_equal(net.fc.W.array, w0)
    # the same gradients in IEEE float16 are no overflow
    up16, _, sc16 = _updater(mode, [sat[0]], fmt=F16)
    up16.update()
    assert up16.skipped_steps == 0 and sc16.scale in (64, 128)


def test_simulated_workers_skip_a_saturated_step_too():
    """The many-worker simulator ends its steps as the updater does: a
    gradient at ± u_max of a saturating format is an overflow there too."""
    sat = np.full(4, FP6.u_max / 64, np.float32)
    net = Net()
    opt = chainer.optimizers.MomentumSGD(0.01)
    opt.setup(net)
    sc = make_loss_scaling('dynamic:init_scale=64')
    sc.fmt = FP6
    it = chainer.iterators.SerialIterator([sat, sat * 0.01], 2, shuffle=False)
    up = SimulatedDataParallelUpdater(it, opt, sc, 2, CommPolicy('float16'),
                                      mode='dynamic')
    w0 = net.fc.W.array.copy()
    up.update()
    assert up.skipped_steps == 1 and sc.scale == 32
    np.testing.assert_array_equal(net.fc.W.array, w0)


def test_fixed_scale_in_saturating_format_raises():
    up, _, _ = _updater('fixed:64', [np.full(4, FP6.u_max / 64, np.float32)],
                        fmt=FP6)
    with pytest.raises(NonFiniteGradientError, match='fc/W'):
        up.update()


def test_emulated_saturation_found_and_scale_settles():
    """The GEMM rounds its weight gradient to FP6, which saturates: with
    x = 1 every scale above 28/2 gives a W gradient clipped at 28. Dynamic
    scaling sees these as overflows and halves until the gradient fits."""
    xs = [np.ones(4, np.float32)] * 12
    up, net, sc = _updater('dynamic:init_scale=1024', xs, fmt=FP6,
                           precision_formats=(None, FP6))
    scales = []
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for _ in xs:
            up.update()
            scales.append(sc.scale)
    # W's gradient is x * scale * gain = scale: overflows while >= 28
    assert scales[:7] == [512, 256, 128, 64, 32, 16, 16]
    assert up.skipped_steps == 6
    assert np.abs(net.fc.W.grad).max() < FP6.u_max


@pytest.mark.parametrize('mode', [
    'dynamic:growth_interval=3',
    'dynamic:style=chainer,interval=3',
    'dynamic:style=tf,incr_every_n_steps=3,init_scale=64',
])
def test_snapshot_resumes_every_style_exactly(mode, tmp_path):
    """save_npz/load_npz of the updater carries the style's whole state;
    the resumed run then follows the same trajectory."""
    xs = [np.ones(4, np.float32)] * 20
    up, _, sc = _updater(mode, xs)
    up.update()          # creates the optimizer state the snapshot holds
    script = [False, False, True, False, True]
    for over in script:
        sc.update(over)
    path = str(tmp_path / 'snap.npz')
    chainer.serializers.save_npz(path, up)
    up2, _, sc2 = _updater(mode, xs)
    up2.update()
    assert sc2.state.state_dict() != sc.state.state_dict()
    chainer.serializers.load_npz(path, up2)
    assert sc2.state.state_dict() == sc.state.state_dict()
    assert type(sc2.scale) is float
    rest = [False] * 7 + [True, False, True, True] + [False] * 4
    assert [sc2.state.update(o) for o in rest] == \
        [sc.state.update(o) for o in rest]


@pytest.mark.parametrize('mode', [
    'dynamic:init_scale=256,growth_interval=2',
    'dynamic:style=chainer,interval=2',
    'dynamic:style=tf,init_scale=256,incr_every_n_steps=2',
])
def test_interrupted_training_resumes_exactly(mode, tmp_path):
    """12 steps with overflows (Inf inputs, and FP6 saturation) in one go,
    or 5 steps, snapshot, a fresh updater loaded from it and 7 more: the
    same scales, skipped steps and weights at every step."""
    rng = np.random.RandomState(0)
    xs = [np.full(4, 2.0 ** rng.randint(-8, -2), np.float32)
          for _ in range(12)]
    xs[3] = xs[3].copy()
    xs[3][1] = np.inf
    xs[8] = np.full(4, FP6.u_max, np.float32)   # saturates at any scale

    def trace(up, net, sc, n):
        out = []
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            for _ in range(n):
                up.update()
                out.append((sc.scale, up.skipped_steps,
                            net.fc.W.array.copy()))
        return out

    whole = trace(*_updater(mode, xs, fmt=FP6), 12)
    up, net, sc = _updater(mode, xs, fmt=FP6)
    first = trace(up, net, sc, 5)
    path = str(tmp_path / 'snap.npz')
    chainer.serializers.save_npz(path, up)
    up2, net2, sc2 = _updater(mode, xs, fmt=FP6)
    chainer.serializers.load_npz(path, up2)
    resumed = first + trace(up2, net2, sc2, 7)
    assert [t[:2] for t in resumed] == [t[:2] for t in whole]
    for a, b in zip(resumed, whole):
        np.testing.assert_array_equal(a[2], b[2])
    assert whole[-1][1] >= 2 and len({t[0] for t in whole}) > 2
