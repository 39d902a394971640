"""``adaptive:init_scale=auto``: α_{N+1} from the loss gradient's own
statistics by Eq. 1 (not in the paper; docs/fp8_diagnosis.md). Checked
against an independent float64/SciPy computation of Eq. 1 on the loss
gradient that plain Chainer backprop produces, on one head and on several;
float32 exactness against plain backprop; the update interval; resume; the
options."""
import copy
import math

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from scipy import special

from ada_loss.adaptive import AdaLossScaled
from ada_loss.formats import get_format
from ada_loss.loss_scale.gemm import loss_gradient_scale
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import all_grads_finite, apply_precision

from ada_test_helpers import assert_params_bit_equal, is_pow2

E4M3 = get_format('fp8_e4m3')
F16 = get_format('float16')


def eq1_reference(grads, t_uf, fmt):
    """Eq. 1 on the concatenation of ``grads``: exact sums (fsum), SciPy's
    erfinv, the power of two by log2."""
    flat = np.concatenate([np.ravel(g).astype(np.float64) for g in grads])
    second = math.fsum(flat * flat) / flat.size
    lower = fmt.u_min / (math.sqrt(second) * math.sqrt(2.0)
                         * float(special.erfinv(t_uf)))
    x = min(max(lower, 1.0), fmt.u_max / np.abs(flat).max())
    return 2.0 ** math.floor(math.log2(x))


def _moments(g):
    g = np.asarray(g, np.float64)
    return float(np.mean(g * g)), float(np.abs(g).max())


@pytest.mark.parametrize('std', [1e-4, 3e-3, 1e-1, 30.0])
@pytest.mark.parametrize('fmt', [E4M3, F16])
def test_loss_gradient_scale_against_scipy(std, fmt):
    g = np.random.RandomState(0).randn(64, 10) * std
    assert loss_gradient_scale(*_moments(g), fmt=fmt) == \
        eq1_reference([g], 1e-3, fmt)


def test_loss_gradient_scale_degenerate():
    assert loss_gradient_scale(0.0, 0.0, fmt=E4M3) == 1.0
    assert loss_gradient_scale(float('nan'), 1.0, fmt=E4M3) == 1.0
    assert loss_gradient_scale(float('inf'), float('inf'), fmt=E4M3) == 1.0
    # large gradients: the cap u_max / max|g| wins, below 1
    assert loss_gradient_scale(*_moments([1000.0, -1.0]), fmt=E4M3) == 0.25
    with pytest.raises(ValueError, match='t_uf'):
        loss_gradient_scale(1.0, 1.0, t_uf=0.0)


def _softmax_ce_grad(y, t):
    """d mean softmax-CE / d logits, in float64 (independent of Chainer)."""
    y = np.asarray(y, np.float64)
    p = np.exp(y - y.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return (p - np.eye(y.shape[1])[t]) / len(t)


def test_fp8_classifier_follows_the_loss_gradient():
    """FP8 E4M3: after each backward, α_{N+1} is Eq. 1 of the logits'
    gradient; the next backward starts there (the last layer's α)."""
    np.random.seed(0)
    model = chainer.Sequential(L.Linear(12, 16), F.relu, L.Linear(16, 10))
    apply_precision(model, 'fp8_e4m3')
    scaling = make_loss_scaling('adaptive:init_scale=auto', 'fp8_e4m3')
    scaling.bind(model, verbose=False)
    rng = np.random.RandomState(1)
    x = rng.randn(64, 12).astype(np.float32)
    t = rng.randint(0, 10, 64).astype(np.int32)
    started = []
    for step in range(3):
        model.cleargrads()
        y = model(x)
        started.append(scaling.scale)
        scaling.backward(F.softmax_cross_entropy(y, t))
        last = list(scaling.loss_scales().values())[0]
        assert last == started[-1]
        want = eq1_reference([_softmax_ce_grad(y.array, t)], 1e-3, E4M3)
        assert scaling.scale == scaling.ada.init_scale == want > 1
    assert started[0] == 1.0 and started[1] > 1.0


class TwoHeads(chainer.Chain):
    """A trunk feeding two linear heads whose outputs reach the loss
    through element-wise ops of very different gains (a detector's loc and
    conf heads); the trunk's gradient passes a GEMM (not the loss
    gradient)."""

    def __init__(self):
        super(TwoHeads, self).__init__()
        with self.init_scope():
            self.trunk = L.Linear(8, 16)
            self.head_a = L.Linear(16, 4)
            self.head_b = L.Linear(16, 3)

    def forward(self, x):
        h = F.relu(self.trunk(x))
        self.outputs = [self.head_a(h), self.head_b(h)]
        a, b = self.outputs
        return F.sum(a * a) * 1e-9 + F.sum(F.sin(b)) * 1e-7


def test_every_head_contributes_and_float32_stays_exact():
    """In float32 the updates equal plain backprop bit for bit with
    ``init_scale='auto'`` (α_{N+1} > 1 after the first step), and α_{N+1}
    is Eq. 1 over both heads' loss gradients together (not the trunk's)."""
    rng = np.random.RandomState(3)
    np.random.seed(3)
    plain = TwoHeads()
    auto = copy.deepcopy(plain)
    ada = AdaLossScaled(auto, init_scale='auto', verbose=False)
    opt_p = chainer.optimizers.MomentumSGD(lr=0.1)
    opt_p.setup(plain)
    opt_a = chainer.optimizers.MomentumSGD(lr=0.1)
    opt_a.setup(auto)
    alphas = []
    for step in range(3):
        x = rng.randn(5, 8).astype(np.float32)
        alphas.append(ada.init_scale)
        plain.cleargrads()
        loss = plain(x)
        loss.backward(retain_grad=True)
        heads = [o.grad for o in plain.outputs]
        auto.cleargrads()
        ada.backward(auto(x))
        opt_p.update()
        opt_a.update()
        assert_params_bit_equal(plain, auto)
        assert ada.init_scale == eq1_reference(heads, 1e-3, F16)
        assert ada.init_scale != eq1_reference(heads[:1], 1e-3, F16)
        assert ada.loss_scales()['head_a'] == alphas[-1]
    assert alphas[0] == 1.0 and all(is_pow2(a) and a > 1 for a in alphas[1:])


def _mlp_step(ada, model, x, t, factor):
    model.cleargrads()
    ada.backward(F.softmax_cross_entropy(model(x), t) * factor)


def _mlp():
    return chainer.Sequential(L.Linear(10, 32), F.relu, L.Linear(32, 4))


def test_update_interval_and_resume():
    """α_{N+1} is measured on the pass before each β update (passes 3, 6
    of an interval of 3) and is saved and restored with the β's."""
    rng = np.random.RandomState(4)
    # the loss gradient shrinks by 2 per pass: α_{N+1} would grow if
    # recomputed
    batches = [(rng.randn(16, 10).astype(np.float32),
                rng.randint(0, 4, 16).astype(np.int32), 1e-5 * 2.0 ** -k)
               for k in range(7)]
    np.random.seed(4)
    model = _mlp()
    ada = AdaLossScaled(model, init_scale='auto', update_interval=3,
                        verbose=False)
    seen = []
    for batch in batches[:4]:
        _mlp_step(ada, model, *batch)
        seen.append(ada.init_scale)
    # measured at pass 3 only (for the β update of pass 4)
    assert seen[0] == seen[1] == 1.0 < seen[2] == seen[3]

    target = {}
    chainer.serializers.DictionarySerializer(target).save(ada)
    twin = copy.deepcopy(model)
    restored = AdaLossScaled(twin, init_scale='auto', update_interval=3,
                             verbose=False)
    assert restored.init_scale == 1.0
    restored.serialize(chainer.serializers.NpzDeserializer(target))
    assert restored.init_scale == ada.init_scale
    for batch in batches[4:]:
        _mlp_step(ada, model, *batch)
        _mlp_step(restored, twin, *batch)
        assert restored.init_scale == ada.init_scale
        assert dict(restored.loss_scales()) == dict(ada.loss_scales())


def test_fp8_update_interval_stays_finite():
    """With cached β's (update interval 4) in FP8 E4M3 every gradient stays
    finite: a new α_{N+1} starts only with the β's computed for it."""
    np.random.seed(6)
    model = chainer.Sequential(L.Linear(12, 32), F.relu, L.Linear(32, 32),
                               F.relu, L.Linear(32, 10))
    apply_precision(model, 'fp8_e4m3')
    scaling = make_loss_scaling('adaptive:init_scale=auto,update_interval=4',
                                'fp8_e4m3')
    scaling.bind(model, verbose=False)
    rng = np.random.RandomState(6)
    x = rng.randn(64, 12).astype(np.float32)
    t = rng.randint(0, 10, 64).astype(np.int32)
    scales = []
    for step in range(9):
        model.cleargrads()
        scaling.backward(F.softmax_cross_entropy(model(x), t))
        assert all_grads_finite(model, E4M3), step
        scales.append(scaling.scale)
    assert scales[2] == 1.0 < scales[3] == scales[6]


class SplitHeads(chainer.Chain):
    """The trunk's output reaches the loss both directly and through the
    head (a GEMM): its gradient is not the loss gradient; the head's output
    is split (a node with two outputs) before the loss."""

    def __init__(self):
        super(SplitHeads, self).__init__()
        with self.init_scope():
            self.trunk = L.Linear(8, 6)
            self.head = L.Linear(6, 4)

    def forward(self, x):
        h = self.trunk(x)
        self.outputs = [self.head(F.relu(h)), h]
        a, b = F.split_axis(self.outputs[0], 2, axis=1)
        return F.sum(a * a) * 1e-9 + F.sum(b) * 1e-8 + F.sum(h) * 1e-7


def test_a_gradient_that_passed_a_gemm_is_not_the_loss_gradient():
    rng = np.random.RandomState(7)
    np.random.seed(7)
    plain = SplitHeads()
    auto = copy.deepcopy(plain)
    ada = AdaLossScaled(auto, init_scale='auto', verbose=False)
    x = rng.randn(5, 8).astype(np.float32)
    plain(x).backward(retain_grad=True)
    head, trunk = (o.grad for o in plain.outputs)
    ada.backward(auto(x))
    assert ada.init_scale == eq1_reference([head], 1e-3, F16)
    assert ada.init_scale != eq1_reference([head, trunk], 1e-3, F16)


def test_options():
    spec = make_loss_scaling('adaptive:init_scale=auto')
    assert spec.scale == 1.0
    with pytest.raises(ValueError, match="positive number, 'auto', 'amax' or 'format'"):
        make_loss_scaling('adaptive:init_scale=often')
    with pytest.raises(ValueError, match='option of adaptive'):
        make_loss_scaling('amax:init_scale=auto')
    # a fixed α_{N+1} (the paper's 1; no longer the default) is not
    # serialized (snapshots of before stay loadable)
    ada = AdaLossScaled(chainer.Chain(), init_scale=1.0, verbose=False)
    target = {}
    chainer.serializers.DictionarySerializer(target).save(ada)
    assert 'init_scale' not in target
