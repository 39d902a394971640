"""The adaptive mode's overflow guard, its backoff after skipped steps and the
skip report (not in the paper; docs/modes.md).

* A non-GEMM node that amplifies the gradient by 2^10 between two GEMMs (what
  batch norm's backward does at depth) overflows FP8 E4M3 under the paper's
  Algorithm 3-4 (``guard=False``); with the guard the gradients are finite
  and, on values every step represents exactly, unscale to plain FP32
  backprop bit for bit.
* A run whose every step overflows in FP16 storage (the guard cannot look
  inside an element-wise FP16 node) skips forever without the guard and
  recovers within a stated number of steps with it.
* A skipped step names the first layer in backward order whose gradient went
  non-finite, for the layer-wise and the global modes.
"""
import chainer
import chainer.functions as F
import numpy as np
import pytest

import ada_loss
from ada_loss import links as AL
from ada_loss.adaptive.backward import fit_ratio
from ada_loss.formats import get_format
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, apply_precision, setup_optimizer)

AMPLIFY = 2.0 ** 10


class Amplified(chainer.Chain):
    """l1 → ×gain (a non-GEMM node: α passes through) → l2."""

    def __init__(self, gain=AMPLIFY, n_in=4, n_hidden=4, n_out=3):
        super(Amplified, self).__init__()
        self.gain = gain
        with self.init_scope():
            self.l1 = AL.Linear(n_in, n_hidden, nobias=True)
            self.l2 = AL.Linear(n_hidden, n_out, nobias=True)

    def forward(self, x):
        return self.l2(self.l1(x) * self.gain)


def _exact_net(rng):
    """Weights and input of powers of two (signed): every product and every
    sum of the backward below is exact in E4M3 and in FP32."""
    model = Amplified()
    for p in (model.l1.W, model.l2.W):
        p.array[...] = rng.choice([-1.0, 1.0], p.shape) * 2.0 ** \
            rng.randint(-2, 2, p.shape)
    x = (rng.choice([-1.0, 1.0], (1, 4)) * 2.0 ** rng.randint(-1, 2, (1, 4))
         ).astype(np.float32)
    return model, x


def _backward(model, x, guard):
    """The ⟨α, δ⟩ backward of y[0, 0] in fwd=float32,bwd=fp8_e4m3."""
    apply_precision(model, 'fwd=float32,bwd=fp8_e4m3')
    ada = ada_loss.AdaLossScaled(model, fmt='fp8_e4m3', guard=guard,
                                 verbose=False)
    model.cleargrads()
    y = model(x)
    ada.backward(y[0, 0])
    return ada, {n: p.grad / np.float32(p._loss_scale or 1.0)
                 for n, p in model.namedparams()}


def _reference(model, x):
    """Plain FP32 backprop of the same graph."""
    ref = Amplified()
    ref.l1.W.array[...] = model.l1.W.array
    ref.l2.W.array[...] = model.l2.W.array
    ref.cleargrads()
    ref(x)[0, 0].backward()
    return {n: p.grad for n, p in ref.namedparams()}


@pytest.mark.parametrize('seed', range(4))
def test_guard_keeps_amplified_gradient_finite_and_exact(seed):
    rng = np.random.RandomState(seed)
    model, x = _exact_net(rng)
    ref = _reference(model, x)
    # the paper's algorithm: β of l2 fits its own output in E4M3, the
    # 2^10 after it overflows it (E4M3 'fn': NaN)
    _, unguarded = _backward(model.copy('copy'), x, guard=False)
    assert not np.isfinite(unguarded['/l1/W']).all()
    ada, grads = _backward(model, x, guard=True)
    for name in ref:
        assert np.isfinite(grads[name]).all(), name
        assert np.array_equal(grads[name], ref[name]), name
    # the guard lowered the entering gradient of l1 (and nothing else)
    assert set(ada.guarded()) == {('l1', 'in')}
    assert ada.guarded()[('l1', 'in')] >= 1
    assert ada.loss_scales()['l1'] < ada.loss_scales()['l2'] * \
        ada.layer_scales()['l2']


def test_guard_is_bit_identical_where_nothing_overflows():
    """With no amplification the guard never acts: gradients and scales are
    the paper's algorithm's bit for bit."""
    rng = np.random.RandomState(5)
    model, x = _exact_net(rng)
    model.gain = 1.0
    ada_a, a = _backward(model.copy('copy'), x, guard=False)
    ada_b, b = _backward(model, x, guard=True)
    assert ada_b.guarded() == {}
    assert ada_a.loss_scales() == ada_b.loss_scales()
    assert ada_a.layer_scales() == ada_b.layer_scales()
    for name in a:
        assert np.array_equal(a[name], b[name]), name


def test_fit_ratio_is_the_largest_power_of_two_that_fits():
    for name in ('fp8_e4m3', 'fp8_e5m2', 'float16', 'bfloat16'):
        fmt = get_format(name)
        for peak in (fmt.u_max * 0.5, fmt.u_max, fmt.u_max * 1.0001,
                     fmt.u_max * 3, 1e30):
            peak = float(np.float32(min(peak, 3e38)))
            r = fit_ratio(peak, fmt)
            q = float(fmt.quantize(np.array([peak * r], np.float32))[0])
            assert np.isfinite(q) and not (fmt.saturates and q >= fmt.u_max)
            if r < 1:     # and twice the ratio would not have fitted
                q2 = float(fmt.quantize(np.array([peak * r * 2],
                                                 np.float32))[0])
                assert not np.isfinite(q2) or (fmt.saturates and
                                               q2 >= fmt.u_max) or \
                    q2 > fmt.u_max
        assert fit_ratio(1.0, fmt) == 1.0
        with pytest.raises(ValueError):
            fit_ratio(float('inf'), fmt)


# -- a run that would skip forever (FP16 storage) --------------------------
class FP16Amplified(chainer.Chain):
    """l1 → ×2^14 → l2 → CE; in mixed16 the ×2^14 of the backward overflows
    FP16 inside the element-wise node, before any GEMM sees it."""

    def __init__(self):
        super(FP16Amplified, self).__init__()
        with self.init_scope():
            self.l1 = AL.Linear(12, 16)
            self.l2 = AL.Linear(16, 3)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)) * 2.0 ** 14)


def _run(mode, steps=12, seed=0):
    rng = np.random.RandomState(seed)
    np.random.seed(seed)
    with chainer.using_config('dtype', chainer.mixed16):
        model = Classifier(FP16Amplified(), 'mixed16')
    data = [(rng.randn(12).astype(np.float32) * 1e-3,
             np.int32(rng.randint(3))) for _ in range(8 * steps)]
    it = chainer.iterators.SerialIterator(data, 8, shuffle=False)
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(lr=1e-6), model,
                          'mixed16')
    scaling = make_loss_scaling(mode)
    updater = MixedPrecisionUpdater(it, opt, scaling, mode=mode)
    skipped = []
    for _ in range(steps):
        before = updater.skipped_steps
        updater.update()
        skipped.append(updater.skipped_steps > before)
    return updater, scaling, skipped


def test_paper_mode_is_stuck_guarded_mode_recovers():
    _, _, skipped = _run('adaptive:guard=false,init_scale=1024')
    assert all(skipped)           # every step: the run never recovers
    updater, scaling, skipped = _run('adaptive:init_scale=1024')
    # the backoff lowers β of l2 (the GEMM the Inf came from) by 2^1, 2^3,
    # 2^6, ...: at most 5 skipped steps, then every step applies
    first_clean = skipped.index(False)
    assert 1 <= first_clean <= 5
    assert not any(skipped[first_clean:])
    assert scaling.ada.backoff()['predictor/l2'] >= 1
    # the skip report names the layer the Inf entered (backward order)
    assert updater.last_skip.layer == 'predictor/l1'
    assert updater.last_skip.alpha > 0
    assert not np.isfinite(updater.last_skip.max_abs)
    assert updater.skipped_by_layer == {'predictor/l1': first_clean}


def test_skip_report_of_a_global_mode_names_first_layer_in_backward_order():
    updater, _, skipped = _run('dynamic:style=chainer,init_scale=1024',
                               steps=3)
    assert all(skipped)
    # l2's weight gradient is finite; l1's is the first that is not
    assert updater.last_skip.layer == 'predictor/l1'
    assert updater.last_skip.alpha == 256     # 1024, halved twice
    assert updater.skipped_by_layer == {'predictor/l1': 3}


def test_backoff_state_is_serialized():
    updater, scaling, _ = _run('adaptive:init_scale=1024', steps=8)
    state = {}
    serializer = chainer.serializers.DictionarySerializer(state)
    updater.serialize(serializer)
    updater2, scaling2, _ = _run('adaptive:init_scale=1024', steps=0)
    updater2.serialize(chainer.serializers.NpzDeserializer(state))
    assert scaling2.ada.backoff() == scaling.ada.backoff()
    assert scaling2.ada._skip_run == scaling.ada._skip_run
    assert updater2.skipped_by_layer == updater.skipped_by_layer


def test_guard_option_is_validated():
    with pytest.raises(ValueError, match='guard'):
        make_loss_scaling('adaptive:guard=1')
    with pytest.raises(ValueError, match='backoff_window'):
        make_loss_scaling('amax:backoff_window=0')
