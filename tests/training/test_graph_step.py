"""The capturable step (:mod:`ada_loss.training.graph_step`) equals the
eager step of :class:`MixedPrecisionUpdater` bit for bit, on NumPy.

Each mode runs 60 steps of a tiny MLP in mixed16 (FP16 parameters, FP32
masters, MomentumSGD with weight decay) eagerly and through
:class:`CapturableStep`, from the same weights and batches; both are
killed at step 30 (the updater serialized, loaded into a fresh model,
optimizer and updater) and go on. Batches 7, 8 and 41 carry an injected
overflow: a node between the two layers whose backward multiplies the
gradient by Inf (a genuine gradient overflow: the loss stays finite, so the
adaptive guard backs the layer off). After every step the parameters, the
FP32 masters, every optimizer state, the updater's snapshot (loss-scale
state, counters, skip report) and the reported loss scale are compared bit
for bit.
"""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from chainer import serializers

from ada_loss.errors import NonFiniteGradientError
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import Classifier, MixedPrecisionUpdater
from ada_loss.training.graph_step import CapturableStep, finite_flag
from ada_loss.training.hooks import add_weight_decay
from ada_loss.training.precision_setup import setup_optimizer

PRECISION = 'mixed16'
STEPS, KILL, BATCH = 60, 30, 8
BAD = (7, 8, 41)                 # batches whose backward overflows
SENTINEL = 1234.0                # x[0, 0] of a bad batch


class Blowup(chainer.FunctionNode):
    """Identity on ``h``; its backward multiplies the gradient by Inf when
    the batch ``x`` is marked (the injected overflow), decided on the
    arrays (no host read: capturable)."""

    def forward(self, inputs):
        h, x = inputs
        self.retain_inputs((1,))
        return h,

    def backward(self, indexes, grad_outputs):
        gy, = grad_outputs
        x = self.get_retained_inputs()[0].array
        xp = chainer.backend.get_array_module(x)
        factor = xp.where(x[0, 0] == SENTINEL, xp.inf, 1.0).astype(gy.dtype)
        return gy * factor, None


class MLP(chainer.Chain):
    def __init__(self):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(6, 16)
            self.l2 = L.Linear(16, 3)

    def forward(self, x):
        h = Blowup().apply((self.l1(x), x))[0]
        return self.l2(F.relu(h))


def _data():
    rng = np.random.RandomState(0)
    data = []
    for i in range(STEPS):
        x = rng.randn(BATCH, 6).astype(np.float32)
        if i in BAD:
            x[0, 0] = SENTINEL
        t = rng.randint(3, size=BATCH).astype(np.int32)
        data.extend(zip(x.astype(np.float16), t))
    return data


def _updater(mode, graph, device=None, net=MLP, data=None):
    """A mixed16 updater of ``net`` from seed 0 (``graph``: with a
    :class:`CapturableStep`, or a runner class to install)."""
    np.random.seed(0)
    with chainer.using_config('dtype', chainer.mixed16):
        model = Classifier(net(), PRECISION)
    if device is not None:
        model.to_device(device)
    it = chainer.iterators.SerialIterator(data or _data(), BATCH,
                                          shuffle=False)
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(lr=0.05), model,
                          PRECISION)
    add_weight_decay(model, 1e-4)
    updater = MixedPrecisionUpdater(
        it, opt, make_loss_scaling(mode, PRECISION), mode=mode,
        device=device)
    if graph is True:
        updater.step_runner = CapturableStep(updater)
    elif graph:
        updater.step_runner = graph(updater)
    return updater


def _snapshot(updater):
    d = {}
    updater.serialize(serializers.DictionarySerializer(d))
    return d


def _state(updater):
    """Every array and value the next step depends on."""
    opt = updater.get_optimizer('main')
    out = {'snapshot': _snapshot(updater),
           'scale': updater.loss_scaling.scale,
           'skipped': updater.skipped_steps,
           'last_skip': updater.last_skip,
           'by_layer': dict(updater.skipped_by_layer)}
    for name, p in sorted(opt.target.namedparams()):
        out[name] = p.array
        master = getattr(p.update_rule, '_fp32_param', None)
        out[name + '@fp32'] = None if master is None else master.array
        out[name + '@t'] = p.update_rule.t
    ada = getattr(updater.loss_scaling, 'ada', None)
    if ada is not None:
        out['backoff'] = ada.backoff()
        out['iteration'] = ada.iteration
    return out


def _bits(v):
    if hasattr(v, 'get') and hasattr(v, 'device') and \
            not isinstance(v, np.ndarray):
        v = v.get()                                  # a CuPy array
    if isinstance(v, np.ndarray) and v.dtype.kind == 'f':
        return v.dtype.str, v.shape, v.tobytes()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, float):
        return np.float64(v).tobytes()
    if isinstance(v, dict):
        return {k: _bits(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(_bits(x) for x in v)
    return v


def _resumed(updater, mode, graph, **kwargs):
    """The updater serialized and loaded into a fresh one (a kill)."""
    d = _snapshot(updater)
    fresh = _updater(mode, graph, **kwargs)
    fresh.serialize(serializers.NpzDeserializer(_as_npz(d)))
    return fresh


def _as_npz(d):
    import io
    buf = io.BytesIO()
    np.savez(buf, **{k: chainer.backend.CpuDevice().send(v)
                     if hasattr(v, 'device') else np.asarray(v)
                     for k, v in d.items()})
    buf.seek(0)
    return np.load(buf)


MODES = [
    'fixed:16', 'none',
    'dynamic:init_scale=65536,growth_interval=5',
    'dynamic:style=chainer,interval=3,init_scale=8192',
    'dynamic:style=tf,init_scale=65536,incr_every_n_steps=4,'
    'decr_every_n_nan_or_inf=1',
    # adaptive's default (init_scale=format: α_{N+1} = 1 in FP16) and the
    # paper's constant path it no longer takes by default
    'adaptive', 'adaptive:init_scale=1',
    'adaptive:update_interval=3,backoff_window=5',
    'adaptive:init_scale=auto,update_interval=2', 'adaptive:guard=false',
    'amax:history=4',
]


def _recovers(mode):
    return not mode.startswith(('fixed', 'none'))


def run_pair(mode, runner, steps=STEPS, kill=KILL, **kwargs):
    """Runs ``mode`` eagerly and with ``runner`` (True: CapturableStep, or
    a runner class) side by side, both killed and resumed at step ``kill``,
    asserting after every step that their states are equal bit for bit.
    Returns (the runner's updater, skipped steps, loss scales seen, whether
    a layer was backed off)."""
    eager = _updater(mode, False, **kwargs)
    graph = _updater(mode, runner, **kwargs)
    assert _bits(_state(eager)) == _bits(_state(graph))
    skipped, scales, backed_off = 0, {eager.loss_scaling.scale}, False
    for step in range(steps):
        if step == kill:
            assert _bits(_snapshot(eager)) == _bits(_snapshot(graph))
            eager = _resumed(eager, mode, False, **kwargs)
            graph = _resumed(graph, mode, runner, **kwargs)
        if not _recovers(mode) and step in BAD:
            with pytest.raises(NonFiniteGradientError):
                eager.update()
            with pytest.raises(NonFiniteGradientError):
                graph.update()
            # the skip is in the counters of neither; go past the batch
            assert _bits(_state(eager)) == _bits(_state(graph))
            eager.iteration += 1
            graph.iteration += 1
            continue
        eager.update()
        graph.update()
        a, b = _state(eager), _state(graph)
        assert _bits(a) == _bits(b), (mode, step)
        skipped = a['skipped']
        scales.add(a['scale'])
        backed_off |= bool(a.get('backoff'))
    return graph, skipped, scales, backed_off


def check_coverage(mode, skipped, scales, backed_off):
    """What each mode's run must have gone through to mean anything."""
    if _recovers(mode):
        assert skipped >= len(BAD)
    if mode.startswith('dynamic'):
        assert len(scales) > 2          # backed off and grew
    if mode.startswith(('adaptive', 'amax')) and 'guard=false' not in mode:
        assert backed_off


@pytest.mark.parametrize('mode', MODES)
def test_capturable_step_equals_eager_bit_for_bit(mode):
    _, skipped, scales, backed_off = run_pair(mode, True)
    check_coverage(mode, skipped, scales, backed_off)


def test_skipped_step_leaves_optimizer_state_untouched():
    """A skipped step in the middle of training: parameters, FP32 masters
    and momentum are those of before it, bit for bit."""
    updater = _updater('adaptive', True)
    for _ in range(BAD[0]):
        updater.update()
    opt = updater.get_optimizer('main')
    before = {n: (p.array.copy(), p.update_rule._fp32_param.array.copy(),
                  p.update_rule.state['v'].copy())
              for n, p in opt.target.namedparams()}
    updater.update()
    assert updater.skipped_steps == 1
    for n, p in opt.target.namedparams():
        w, m, v = before[n]
        assert p.array.tobytes() == w.tobytes()
        assert p.update_rule._fp32_param.array.tobytes() == m.tobytes()
        assert p.update_rule.state['v'].tobytes() == v.tobytes()


@pytest.mark.parametrize('mode', MODES)
def test_run_leaves_the_host_to_settle(mode):
    """:meth:`CapturableStep.run` keeps its results in arrays and leaves
    every host value a replay could not advance as it was -- the optimizer's
    and update rules' ``t``, the adaptive pass count, the loss-scale host
    state, the skip count, the graph key; :meth:`settle` advances them (a
    replay runs no Python, so the host must not depend on ``run`` having
    run). Over the first 10 steps, a skipped one (batch 7) included."""
    updater = _updater(mode, True)
    step = updater.step_runner
    opt = updater.get_optimizer('main')
    for i in range(10):
        if not _recovers(mode) and i in BAD:
            break
        batch = updater._iterators['main'].next()
        before = (_bits(_snapshot(updater)), opt.t,
                  [p.update_rule.t for p in opt.target.params()],
                  updater.skipped_steps, step.graph_key())
        step.run(updater.converter(batch, updater.input_device))
        assert isinstance(step.flag, np.ndarray) and step.flag.shape == ()
        # the host part of the snapshot: not the parameters and optimizer
        # states, nor what the adaptive step keeps on a device (β, α_{N+1}:
        # arrays written in place there, host floats here), nor amax's
        # histories (host floats: amax is not captured)
        snap = _bits(_snapshot(updater))
        host = {k: v for k, v in before[0].items()
                if not k.startswith(('optimizer:', 'model'))
                and k.rpartition('/')[2] not in (
                    'beta_keys', 'beta_values', 'init_scale', 'amax_keys',
                    'amax_lengths', 'amax_values')}
        assert {k: snap[k] for k in host} == host
        assert (opt.t, [p.update_rule.t for p in opt.target.params()],
                updater.skipped_steps, step.graph_key()) == before[1:]
        step.settle()
        updater.iteration += 1
        assert int(step.skipped) == updater.skipped_steps
    assert opt.t > 0


def test_finite_flag_is_an_array_and_sees_saturation():
    from ada_loss.formats import get_format
    model = MLP()
    for p in model.params():
        p.grad = np.ones_like(p.array)
    flag = finite_flag(model)
    assert flag.shape == () and bool(flag)
    model.l1.W.grad[0, 0] = 28.0       # FP6 E3M2's u_max: saturated
    assert bool(finite_flag(model))
    assert not bool(finite_flag(model, get_format('fp6_e3m2')))
    model.l1.W.grad[0, 0] = np.inf
    assert not bool(finite_flag(model))


def test_distributed_updater_is_refused():
    from ada_loss.training.updater import MixedPrecisionUpdater as M

    class Other(M):
        def grads_finite(self, model):
            return True
    updater = _updater('fixed:16', False)
    updater.__class__ = Other
    with pytest.raises(ValueError, match='decides the finite check'):
        CapturableStep(updater)


def test_optimizer_level_hooks_are_refused():
    """Chainer's optimizer hooks run on the host with the loss scale as a
    host number (``WeightDecay`` multiplies its rate by it)."""
    updater = _updater('dynamic', False)
    updater.get_optimizer('main').add_hook(
        chainer.optimizer_hooks.WeightDecay(1e-4))
    with pytest.raises(ValueError, match='optimizer-level hook'):
        CapturableStep(updater)


def test_graph_key_follows_what_a_capture_bakes_in():
    """A learning-rate change, the adaptive update-interval phase and a
    backoff each change the key (a replayed graph would otherwise run with
    the old constants)."""
    updater = _updater('adaptive:update_interval=2', True)
    step = updater.step_runner
    keys = []
    for _ in range(3):
        keys.append(step.graph_key())
        updater.update()
    assert keys[0] != keys[1] and keys[0] == keys[2]       # the phase
    k = step.graph_key()
    updater.get_optimizer('main').lr = 0.01
    assert step.graph_key() != k
    k = step.graph_key()
    updater.loss_scaling.ada._backoff['predictor/l1'] = 1
    assert step.graph_key() != k


@pytest.mark.parametrize('mode', ['fixed:16', 'dynamic', 'adaptive'])
def test_gradients_between_steps_are_the_eager_ones(mode):
    """What an extension reads between steps: after an applied step each
    parameter's gradient as the eager update left it (batch norm's FP32
    γ/β divided in place), bit for bit."""
    class BNMLP(MLP):
        def __init__(self):
            super(BNMLP, self).__init__()
            with self.init_scope():
                self.bn = L.BatchNormalization(16)

        def forward(self, x):
            h = Blowup().apply((self.bn(self.l1(x)), x))[0]
            return self.l2(F.relu(h))
    eager, graph = _updater(mode, False, net=BNMLP), \
        _updater(mode, True, net=BNMLP)
    for _ in range(4):
        eager.update()
        graph.update()
        for (n, p), (_, q) in zip(
                sorted(eager.get_optimizer('main').target.namedparams()),
                sorted(graph.get_optimizer('main').target.namedparams())):
            assert _bits(p.grad) == _bits(q.grad), n
