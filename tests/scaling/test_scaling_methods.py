"""Loss-scaling methods in training: exactness of power-of-two fixed scales,
FP32 master weights of mixed16, dynamic skip/backoff/growth, and errors of
the modes that cannot recover from non-finite gradients."""
import warnings

import numpy
import pytest

import chainer
import chainer.functions as F

from ada_loss import DynamicLossScale, NonFiniteGradientError
from ada_loss import links as AL
from ada_loss.scaling import (
    DynamicScaling, FixedScaling, NoScaling, make_loss_scaling)
from ada_loss.training import MixedPrecisionUpdater, setup_optimizer
from ada_loss.training import dtype_config

import substrate_helpers as H

F16 = numpy.float16
F32 = numpy.float32


# ------------------------------------------------ fixed:S in float32 is exact

def _train_float32(mode, steps=5):
    up, model, _, _ = H.build(
        mode, H.small_cnn(width=4), dtype='float32',
        optimizer=chainer.optimizers.MomentumSGD(0.1), batch=16,
        dataset=H.digits_subset(48, size=16),
        hooks=[chainer.optimizer_hooks.WeightDecay(1e-3)])
    init = {n: p.array.copy() for n, p in model.namedparams()}
    for _ in range(steps):
        H.step(up, model)
    params = {n: p.array.copy() for n, p in model.namedparams()}
    # BN running statistics too (persistent values, not parameters)
    for name, link in model.namedlinks():
        for pname in ('avg_mean', 'avg_var'):
            if hasattr(link, pname):
                params[name + '/' + pname] = getattr(link, pname).copy()
    return init, params, up


@pytest.fixture(scope='module')
def unscaled_float32():
    return _train_float32('none')


@pytest.mark.parametrize('scale', [8, 1024, 2.0 ** -3])
def test_fixed_power_of_two_bitwise_equal_to_unscaled(unscaled_float32,
                                                      scale):
    init_ref, ref, _ = unscaled_float32
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # a power of two must not warn
        init, got, up = _train_float32('fixed:{!r}'.format(scale))
    assert up.loss_scaling.scale == scale
    assert isinstance(up.loss_scaling, FixedScaling)
    assert got.keys() == ref.keys()
    for name in init:
        numpy.testing.assert_array_equal(init[name], init_ref[name])
        # the run did train (else equality would be vacuous)
        assert not numpy.array_equal(got[name], init[name]), name
        assert got[name].dtype == F32
    for name in ref:
        numpy.testing.assert_array_equal(got[name], ref[name], err_msg=name)


@pytest.mark.parametrize('scale', [8, 1024])
def test_fixed_scale_scales_gradients_exactly(scale):
    """The optimizer receives S * (unscaled gradient) with _loss_scale S."""
    grads = {}
    for mode in ('none', 'fixed:{}'.format(scale)):
        up, model, sc, data = H.build(mode, H.small_cnn(width=4),
                                      dtype='float32', batch=16)
        del up
        data = H.digits_subset(16, size=16)
        x = numpy.stack([data[i][0] for i in range(16)])
        with chainer.using_config('train', True):
            loss = model(x, data.labels)
        sc.backward(loss)
        grads[mode] = {n: (p.grad.copy(), p._loss_scale)
                       for n, p in model.namedparams()}
    for name, (g, s) in grads['none'].items():
        gs, ss = grads['fixed:{}'.format(scale)][name]
        assert s is None and ss == scale, name
        numpy.testing.assert_array_equal(gs, g * F32(scale), err_msg=name)


def test_fixed_non_power_of_two_warns_and_still_trains(unscaled_float32):
    with pytest.warns(UserWarning, match='not a power of two'):
        make_loss_scaling('fixed:3')
    with pytest.warns(UserWarning, match='not a power of two'):
        _, got, _ = _train_float32('fixed:3')
    _, ref, _ = unscaled_float32
    for name in ref:  # equal up to rounding, not bit for bit
        numpy.testing.assert_allclose(got[name], ref[name], rtol=1e-4,
                                      atol=1e-5, err_msg=name)


# ------------------------------------------------ mixed16: FP32 master weights

def test_mixed16_master_weights_are_fp32_and_model_is_their_fp16_cast():
    up, model, _, _ = H.build(
        'fixed:1024', H.small_cnn(width=4),
        optimizer=chainer.optimizers.MomentumSGD(0.05), batch=16,
        dataset=H.digits_subset(48, size=16))
    assert model.precision == 'mixed16'
    for _ in range(3):
        H.step(up, model)
    n_fp16 = n_bn = 0
    kept_fp32_bits = False
    for name, p in model.namedparams():
        master = p.update_rule._fp32_param
        if '/bn' in name:  # BN gamma/beta stay FP32, updated in place
            n_bn += 1
            assert p.dtype == F32, name
            assert master is None, name
            continue
        n_fp16 += 1
        assert p.dtype == F16, name
        assert master is not None and master.dtype == F32, name
        numpy.testing.assert_array_equal(p.array, master.array.astype(F16),
                                         err_msg=name)
        # the master holds more than FP16 precision (it is not re-read from
        # the FP16 weights each step)
        if not numpy.array_equal(master.array.astype(F16).astype(F32),
                                 master.array):
            kept_fp32_bits = True
        for k, v in p.update_rule.state.items():
            assert v.dtype == F32, (name, k)
    assert n_fp16 == 5 and n_bn == 6  # conv1-3 W, fc W and b; 3 x (γ, β)
    assert kept_fp32_bits
    for name, link in model.namedlinks():
        if hasattr(link, 'avg_mean'):
            assert link.avg_mean.dtype == F32 and link.avg_var.dtype == F32


def test_mixed16_gradient_is_unscaled_in_fp32_not_fp16():
    """fixed:1024, plain SGD: master_new == master - lr * (g16.astype(f32) /
    1024) bit for bit, for gradients whose FP16 quotient g16 / 1024 would be
    an FP16 subnormal (so dividing in FP16 would lose bits)."""
    rs = numpy.random.RandomState(0)
    n, n_in, n_out, lr = 8, 6, 4, 0.5
    with dtype_config('mixed16'):
        model = AL.Linear(n_in, n_out)
    assert model.W.dtype == F16 and model.b.dtype == F16
    coef = (rs.uniform(-1, 1, (n, n_out)) * 2.0 ** -16).astype(F32)
    data = [rs.standard_normal(n_in).astype(F16) for _ in range(n)]

    def loss_func(x):
        return F.sum(F.cast(model(x), F32) * coef)

    opt = setup_optimizer(chainer.optimizers.SGD(lr), model, 'mixed16')
    it = chainer.iterators.SerialIterator(data, n, shuffle=False)
    up = MixedPrecisionUpdater(it, opt, make_loss_scaling('fixed:1024'),
                               mode='fixed:1024', loss_func=loss_func)
    discriminating = False
    for i in range(2):
        before = {name: (p.array.astype(F32) if p.update_rule._fp32_param
                         is None else p.update_rule._fp32_param.array.copy())
                  for name, p in model.namedparams()}
        up.update()
        for name, p in model.namedparams():
            g16 = p.grad  # the scaled FP16 gradient the optimizer received
            assert g16.dtype == F16
            assert numpy.isfinite(g16).all() and (g16 != 0).any()
            master = p.update_rule._fp32_param.array
            want = before[name] - lr * (g16.astype(F32) / F32(1024))
            numpy.testing.assert_array_equal(master, want, err_msg=name)
            numpy.testing.assert_array_equal(p.array, master.astype(F16))
            in_fp16 = (g16 / F16(1024)).astype(F32)
            if not numpy.array_equal(in_fp16, g16.astype(F32) / 1024):
                discriminating = True
            assert (master != before[name]).any(), name
    assert discriminating  # dividing in FP16 would have given other values


# ------------------------------------------------ dynamic

def _mlp_mixed16(mode, **kw):
    return H.build(mode, H.MLP, **kw)


@pytest.mark.filterwarnings('ignore::RuntimeWarning')
def test_dynamic_skips_overflow_step_then_grows():
    up, model, sc, data = _mlp_mixed16(
        'dynamic:init_scale=1024,growth_interval=3',
        optimizer=chainer.optimizers.MomentumSGD(0.1))
    opt = up.get_optimizer('main')
    assert isinstance(sc, DynamicScaling) and sc.scale == 1024
    assert sc.state.growth_interval == 3
    for _ in range(2):
        obs = H.step(up, model)
    assert obs['skipped_steps'] == 0 and obs['loss_scale'] == 1024
    assert sc.state.clean_steps == 2
    before = H.snapshot(model, opt)
    assert before['/predictor/l1/W']['master'] is not None
    assert 'v' in before['/predictor/l1/W']['state']

    data.images[3, 0, 2, 5] = numpy.inf  # one Inf pixel in the batch
    obs = H.step(up, model)
    data.images[3, 0, 2, 5] = 0.5
    assert not numpy.isfinite(obs['main/loss'])
    assert up.skipped_steps == 1 and obs['skipped_steps'] == 1
    assert sc.scale == 1024 * 0.5 and obs['loss_scale'] == 512
    assert sc.state.clean_steps == 0
    after = H.snapshot(model, opt)
    H.assert_snapshot_equal(before, after)  # weights, masters, momenta, t
    assert all(p.grad is None for p in model.params())

    for i in range(3):
        obs = H.step(up, model)
        assert numpy.isfinite(obs['main/loss'])
        assert obs['skipped_steps'] == 1
        assert sc.scale == (512 if i < 2 else 1024), i
    assert up.iteration == 6
    stepped = H.snapshot(model, opt)
    assert stepped['__t__'] == before['__t__'] + 3
    assert not numpy.array_equal(stepped['/predictor/l1/W']['master'],
                                 before['/predictor/l1/W']['master'])


@pytest.mark.filterwarnings('ignore::RuntimeWarning')
def test_dynamic_backs_off_from_too_large_scale():
    """init_scale 2^24: the scaled FP16 gradients overflow; each such step
    is skipped (nothing updated, no master created) and halves the scale
    until the gradients fit in FP16."""
    up, model, sc, _ = _mlp_mixed16('dynamic:init_scale=16777216')
    opt = up.get_optimizer('main')
    init = H.snapshot(model, opt)
    obs = H.step(up, model)
    assert obs['skipped_steps'] == 1 and sc.scale == 2.0 ** 23
    H.assert_snapshot_equal(init, H.snapshot(model, opt))
    assert all(p.update_rule._fp32_param is None for p in model.params())
    for _ in range(15):
        obs = H.step(up, model)
        assert sc.scale == 2.0 ** 24 * 0.5 ** up.skipped_steps
        if opt.t:
            break
    assert opt.t == 1  # eventually a clean step updated the weights
    assert 1 < up.skipped_steps < 16
    w = model.predictor.l1.W
    assert not numpy.array_equal(w.update_rule._fp32_param.array,
                                 init['/predictor/l1/W']['array'].astype(F32))


def test_dynamic_state_survives_serialization(tmp_path):
    up, model, sc, _ = _mlp_mixed16(
        'dynamic:init_scale=64,growth_interval=5')
    for _ in range(2):
        H.step(up, model)
    sc.state.update(True)  # 32, clean_steps 0
    sc.state.update(False)  # clean_steps 1
    up.skipped_steps = 7
    path = str(tmp_path / 'snap.npz')
    chainer.serializers.save_npz(path, up)
    up2, model2, sc2, _ = _mlp_mixed16(
        'dynamic:init_scale=64,growth_interval=5', seed=1)
    chainer.serializers.load_npz(path, up2)
    assert sc2.scale == 32 and sc2.state.clean_steps == 1
    assert up2.skipped_steps == 7 and up2.iteration == 2


# ---- DynamicLossScale unit tests

def test_dynamic_loss_scale_defaults():
    s = DynamicLossScale()
    assert (s.scale, s.growth_factor, s.backoff_factor, s.growth_interval) \
        == (2.0 ** 16, 2.0, 0.5, 2000)
    assert s.clean_steps == 0


def test_dynamic_loss_scale_state_machine():
    s = DynamicLossScale(init_scale=8, growth_factor=4, backoff_factor=0.25,
                         growth_interval=2)
    trace = [s.update(x) for x in
             (False, False, False, True, False, True, True, False, False)]
    assert trace == [8, 32, 32, 8, 8, 2, 0.5, 0.5, 2]
    assert s.clean_steps == 0
    s.update(False)
    assert s.clean_steps == 1
    state = s.state_dict()
    assert state == {'scale': 2.0, 'clean_steps': 1}
    t = DynamicLossScale()
    t.load_state_dict(state)
    assert t.scale == 2.0 and t.clean_steps == 1


@pytest.mark.filterwarnings('error::RuntimeWarning')   # growth past f32
def test_dynamic_loss_scale_clamps():
    s = DynamicLossScale(init_scale=4, growth_interval=1, min_scale=1,
                         max_scale=16)
    assert [s.update(False) for _ in range(4)] == [8, 16, 16, 16]
    assert [s.update(True) for _ in range(6)] == [8, 4, 2, 1, 1, 1]
    # no clamp by default, as PyTorch's GradScaler: only float32's range
    d = DynamicLossScale(init_scale=2.0 ** 24, growth_interval=1)
    assert d.update(False) == 2.0 ** 25
    d = DynamicLossScale(init_scale=2.0 ** 127, growth_interval=1)
    assert d.update(False) == 2.0 ** 127   # 2^128 is not finite in float32
    d = DynamicLossScale(init_scale=2.0 ** -24)
    assert d.update(True) == 2.0 ** -25


@pytest.mark.parametrize('kwargs, match', [
    (dict(init_scale=0), 'init_scale'),
    (dict(init_scale=-2), 'init_scale'),
    (dict(init_scale=float('inf')), 'init_scale'),
    (dict(init_scale=float('nan')), 'init_scale'),
    (dict(growth_factor=1), 'growth_factor'),
    (dict(growth_factor=0.5), 'growth_factor'),
    (dict(backoff_factor=1), 'backoff_factor'),
    (dict(backoff_factor=0), 'backoff_factor'),
    (dict(backoff_factor=2), 'backoff_factor'),
    (dict(growth_interval=0), 'growth_interval'),
    (dict(growth_interval=1.5), 'growth_interval'),
])
def test_dynamic_loss_scale_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DynamicLossScale(**kwargs)


# ------------------------------------------------ non-recoverable modes

@pytest.mark.filterwarnings('ignore::RuntimeWarning')  # NaN on purpose
@pytest.mark.parametrize('mode', ['fp32', 'none', 'fixed:256'])
def test_nonfinite_raises_in_modes_that_cannot_recover(mode):
    up, model, sc, data = _mlp_mixed16(mode)
    assert not sc.recovers
    opt = up.get_optimizer('main')
    H.step(up, model)  # one clean step: masters and momenta exist
    before = H.snapshot(model, opt)
    data.images[0, 0, 4, 4] = numpy.inf
    with pytest.raises(NonFiniteGradientError) as info:
        H.step(up, model)
    msg = str(info.value)
    assert 'non-finite gradient' in msg
    assert repr(mode) in msg
    assert 'cannot recover' in msg and 'dynamic or adaptive' in msg
    assert 'predictor/l1/W' in msg
    assert isinstance(info.value, FloatingPointError)
    H.assert_snapshot_equal(before, H.snapshot(model, opt))


@pytest.mark.filterwarnings('ignore::RuntimeWarning')
@pytest.mark.parametrize('precision', ['mixed16', 'fp8_e4m3', 'fp8_e5m2'])
def test_fixed_scale_overflow_raises(precision):
    """A too large fixed scale overflows the low-precision gradients: an
    error, not a silent skip nor an Inf in the weights. (A scale not below
    the format's largest value is refused before anything is built.)"""
    with pytest.raises(ValueError, match='not below the largest value'):
        make_loss_scaling('fixed:65536', precision)
    # inputs x1000 make the weight gradients (sums over the batch) large
    data = [(x * 1000, t) for x, t in H.digits_subset(16, size=8)]
    scale = {'mixed16': 32768, 'fp8_e4m3': 256, 'fp8_e5m2': 32768}[precision]
    up, model, _, _ = H.build('fixed:{}'.format(scale), H.MLP,
                              dtype=precision, dataset=data)
    opt = up.get_optimizer('main')
    before = H.snapshot(model, opt)
    with pytest.raises(NonFiniteGradientError, match='fixed:'):
        H.step(up, model)
    H.assert_snapshot_equal(before, H.snapshot(model, opt))
    assert all(numpy.isfinite(p.array).all() for p in model.params())


def test_no_scaling_is_plain_backprop():
    assert isinstance(make_loss_scaling('none'), NoScaling)
    assert isinstance(make_loss_scaling('fp32'), NoScaling)
    assert make_loss_scaling('none').scale == 1.0
