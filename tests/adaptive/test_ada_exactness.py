"""In float32, adaptive loss scaling changes nothing: every scale is a power
of two, so the ⟨α, δ⟩ backward (Algorithm 3, with Algorithm 5 where gradients
meet) followed by the FP32 unscaling must give bit-identical updates to plain
``loss.backward()`` — as long as the scales really are > 1 (asserted)."""
import copy

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

from ada_loss.adaptive import AdaLossScaled
from ada_loss.loss_scale.gemm import BOUNDS

from ada_test_helpers import (
    assert_params_bit_equal, assert_params_changed, is_pow2, params_dict)


class MLP(chainer.Chain):
    def __init__(self):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(20, 32)
            self.l2 = L.Linear(32, 32)
            self.l3 = L.Linear(32, 5)

    def forward(self, x):
        return self.l3(F.relu(self.l2(F.relu(self.l1(x)))))


class ResBlockNet(chainer.Chain):
    """conv0 -> [conv1-bn1-relu-conv2-bn2] + identity -> relu -> fc."""

    def __init__(self):
        super(ResBlockNet, self).__init__()
        with self.init_scope():
            self.conv0 = L.Convolution2D(3, 8, 3, pad=1)
            self.conv1 = L.Convolution2D(8, 8, 3, pad=1, nobias=True)
            self.bn1 = L.BatchNormalization(8)
            self.conv2 = L.Convolution2D(8, 8, 3, pad=1, nobias=True)
            self.bn2 = L.BatchNormalization(8)
            self.fc = L.Linear(8 * 6 * 6, 5)

    def forward(self, x):
        x = F.relu(self.conv0(x))
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        h = F.relu(h + x)
        return self.fc(h)


class MultiHeadNet(chainer.Chain):
    """SSD-like: one feature map feeds three conv heads of very different
    magnitudes whose outputs are summed into the loss (plus a linear head on
    the same feature map, so it has four consumers)."""

    def __init__(self):
        super(MultiHeadNet, self).__init__()
        with self.init_scope():
            self.base = L.Convolution2D(3, 8, 3, pad=1)
            self.extra = L.Convolution2D(8, 8, 3, pad=1)
            self.head0 = L.Convolution2D(8, 4, 3, pad=1)
            self.head1 = L.Convolution2D(
                8, 4, 3, pad=1, initialW=chainer.initializers.Normal(1e-4))
            self.head2 = L.Convolution2D(
                8, 4, 1, initialW=chainer.initializers.Normal(10.0))
            self.head3 = L.Convolution2D(8, 4, 3, pad=1)

    def forward(self, x):
        f = F.relu(self.base(x))
        g = F.relu(self.extra(f))
        y0 = self.head0(f)
        y1 = self.head1(f) * 1e-3
        y2 = self.head2(f)
        y3 = self.head3(g) * 30.0
        return (F.sum(y0 * y0) * 1e-6 + F.sum(y1) + F.mean(y2 * 1e-2)
                + F.sum(F.sin(y3)) * 1e-5)


def _mlp_loss(x, t):
    def fn(model):
        return F.softmax_cross_entropy(model(x), t) * 1e-4
    return fn


def _run_both(make_model, batches, loss_of, init_scale=1.0, seed=0,
              scaler=AdaLossScaled, **options):
    """Two MomentumSGD steps with plain backward and with AdaLossScaled (or
    ``scaler``) on a deep copy of the same model; checks bitwise equality
    after every step."""
    np.random.seed(seed)
    plain = make_model()
    # initialize lazily-shaped params with a forward pass
    loss_of(*batches[0])(plain)
    plain.cleargrads()
    ada_model = copy.deepcopy(plain)
    ada = scaler(ada_model, init_scale=init_scale, verbose=False, **options)
    opt_p = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    opt_p.setup(plain)
    opt_a = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
    opt_a.setup(ada_model)
    records = []
    for batch in batches:
        before = params_dict(plain)
        for model, opt, a in ((plain, opt_p, None), (ada_model, opt_a, ada)):
            model.cleargrads()
            loss = loss_of(*batch)(model)
            if a is None:
                loss.backward()
            else:
                a.backward(loss)
            opt.update()
        assert_params_changed(before, plain)
        assert_params_bit_equal(plain, ada_model)
        records.append((ada.loss_scales(), ada.layer_scales()))
        for alphas, betas in [records[-1]]:
            for v in list(alphas.values()) + list(betas.values()):
                assert is_pow2(v), v
    return plain, ada_model, ada, records


@pytest.mark.parametrize('bound', BOUNDS)
def test_mlp_bit_exact(bound):
    rng = np.random.RandomState(0)
    batches = [(rng.randn(16, 20).astype(np.float32),
                rng.randint(0, 5, 16).astype(np.int32)) for _ in range(2)]
    _, _, ada, records = _run_both(MLP, batches, _mlp_loss, bound=bound)
    for alphas, betas in records:
        assert set(alphas) == {'l1', 'l2', 'l3'}
        assert max(betas.values()) > 1
        # α accumulates β downstream: α_l2 = α_l3·β_l3, α_l1 = α_l2·β_l2
        assert alphas['l3'] == 1.0
        assert alphas['l2'] == alphas['l3'] * betas['l3']
        assert alphas['l1'] == alphas['l2'] * betas['l2']
        assert len(set(alphas.values())) > 1


def test_mlp_bit_exact_with_init_scale():
    rng = np.random.RandomState(1)
    batches = [(rng.randn(16, 20).astype(np.float32),
                rng.randint(0, 5, 16).astype(np.int32)) for _ in range(2)]
    _, ada_model, ada, records = _run_both(MLP, batches, _mlp_loss,
                                           init_scale=8.0)
    alphas, betas = records[-1]
    assert alphas['l3'] == 8.0
    # the weight grads are left scaled by α, with _loss_scale for Chainer
    assert ada_model.l3.W._loss_scale == 8.0


@pytest.mark.parametrize('bound', BOUNDS)
def test_resblock_bit_exact(bound):
    rng = np.random.RandomState(2)
    batches = [(rng.randn(4, 3, 6, 6).astype(np.float32),
                rng.randint(0, 5, 4).astype(np.int32)) for _ in range(2)]
    _, _, ada, records = _run_both(ResBlockNet, batches, _mlp_loss, seed=2,
                                   bound=bound)
    for alphas, betas in records:
        assert set(alphas) == {'conv0', 'conv1', 'conv2', 'fc'}
        assert max(betas.values()) > 1
        # the two branches arriving at conv0's output carry different scales:
        # the residual branch α_conv1·β_conv1, the shortcut α_conv2 (= the
        # scale after the addition). They are merged by Algorithm 5.
        branch = alphas['conv1'] * betas['conv1']
        shortcut = alphas['conv2']
        assert branch != shortcut
        assert alphas['conv0'] == max(branch, shortcut)


def _multihead_loss(x):
    def fn(model):
        return model(x)
    return fn


@pytest.mark.parametrize('bound', BOUNDS)
def test_multihead_bit_exact(bound):
    rng = np.random.RandomState(3)
    batches = [(rng.randn(2, 3, 8, 8).astype(np.float32),) for _ in range(2)]
    _, _, ada, records = _run_both(MultiHeadNet, batches, _multihead_loss,
                                   seed=3, bound=bound)
    for alphas, betas in records:
        heads = ['head0', 'head1', 'head2']
        arriving = {h: alphas[h] * betas[h] for h in heads}
        arriving['extra'] = alphas['extra'] * betas['extra']
        assert len(set(arriving.values())) >= 3, arriving
        assert alphas['base'] == max(arriving.values())
        assert max(betas.values()) > 1


def test_gradients_scaled_by_alpha():
    """Before the update, each parameter's gradient equals α times the plain
    gradient exactly, and ``_loss_scale`` is α (None when α = 1)."""
    rng = np.random.RandomState(4)
    x = rng.randn(4, 3, 6, 6).astype(np.float32)
    t = rng.randint(0, 5, 4).astype(np.int32)
    np.random.seed(4)
    plain = ResBlockNet()
    _mlp_loss(x, t)(plain)
    ada_model = copy.deepcopy(plain)
    ada = AdaLossScaled(ada_model, verbose=False)
    plain.cleargrads()
    _mlp_loss(x, t)(plain).backward()
    ada_model.cleargrads()
    ada.backward(_mlp_loss(x, t)(ada_model))
    alphas = ada.loss_scales()
    assert max(alphas.values()) > 1
    grads = dict(plain.namedparams())
    for name, p in ada_model.namedparams():
        layer = name.lstrip('/').rsplit('/', 1)[0]
        scale = p._loss_scale
        ref = grads[name].grad
        if layer in alphas:
            expected = alphas[layer]
            assert (scale or 1.0) == expected
        else:
            assert scale is None or is_pow2(scale)
            expected = scale or 1.0
        np.testing.assert_array_equal(p.grad, ref * np.float32(expected))


class SplitShareNet(chainer.Chain):
    """A multi-output node (split_axis) whose outputs reach GEMMs of very
    different scales, and one Linear link applied twice (shared weights)."""

    def __init__(self):
        super(SplitShareNet, self).__init__()
        with self.init_scope():
            self.l0 = L.Linear(12, 16)
            self.la = L.Linear(8, 6)
            self.lb = L.Linear(8, 6)
            self.shared = L.Linear(6, 5)

    def forward(self, x):
        h = F.relu(self.l0(x))
        ha, hb = F.split_axis(h, 2, axis=1)
        ya = self.shared(F.relu(self.la(ha)))
        yb = self.shared(F.relu(self.lb(hb))) * 1e-3
        return ya + yb


def test_multi_output_node_and_shared_weights_bit_exact():
    rng = np.random.RandomState(5)
    batches = [(rng.randn(8, 12).astype(np.float32),
                rng.randint(0, 5, 8).astype(np.int32)) for _ in range(2)]
    _, _, ada, records = _run_both(SplitShareNet, batches, _mlp_loss, seed=5)
    for alphas, betas in records:
        # the two outputs of split_axis arrive at different scales
        assert alphas['la'] * betas['la'] != alphas['lb'] * betas['lb']
        assert alphas['l0'] == max(alphas['la'] * betas['la'],
                                   alphas['lb'] * betas['lb'])


def test_gradient_accumulation_over_two_backward_passes_bit_exact():
    """Without cleargrads, a second backward accumulates into the gradients
    of the first; at different scales, the leaf merges them (Algorithm 5)."""
    rng = np.random.RandomState(6)
    x1, x2 = (rng.randn(16, 20).astype(np.float32) for _ in range(2))
    t1, t2 = (rng.randint(0, 5, 16).astype(np.int32) for _ in range(2))
    np.random.seed(6)
    plain = MLP()
    plain(x1)
    plain.cleargrads()
    model = copy.deepcopy(plain)
    ada = AdaLossScaled(model, verbose=False)
    for m, a in ((plain, None), (model, ada)):
        opt = chainer.optimizers.MomentumSGD(lr=0.1)
        opt.setup(m)
        for x, t, f in ((x1, t1, 1e-4), (x2, t2, 1e-2)):
            loss = F.softmax_cross_entropy(m(x), t) * f
            loss.backward() if a is None else a.backward(loss)
            if a is not None and f == 1e-4:
                first = dict(a.loss_scales())
        opt.update()
    assert dict(ada.loss_scales()) != first   # the two passes' α differ
    assert_params_bit_equal(plain, model)


@pytest.mark.parametrize('caps', [{}, {'max_layer_scale': 128,
                                      'max_accum_scale': 4096}])
def test_style_authors_bit_exact(caps):
    """style='authors' (issue 37): powers of two too, so float32 training
    is plain backprop bit for bit, with and without the authors' caps."""
    rng = np.random.RandomState(2)
    batches = [(rng.randn(4, 3, 6, 6).astype(np.float32),
                rng.randint(0, 5, 4).astype(np.int32)) for _ in range(2)]
    _, _, ada, records = _run_both(ResBlockNet, batches, _mlp_loss, seed=2,
                                   style='authors', **caps)
    for alphas, betas in records:
        assert max(betas.values()) > 1
        if caps:
            assert max(betas.values()) <= 128
            assert all(alphas[k] * betas[k] <= 4096 for k in alphas)
