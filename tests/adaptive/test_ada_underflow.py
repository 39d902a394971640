"""Gradient underflow in mixed16 (paper Figure 4b) and a weight gradient
below FP16's range that adaptive loss scaling carries to the FP32 update."""
import copy

import chainer
import chainer.functions as F
from chainer import function_node
import numpy as np

from ada_loss import links as AL
from ada_loss.models import PlainConvNet
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import setup_optimizer


class Probe(function_node.FunctionNode):
    """Identity whose backward records the gradient passing through it (as
    carried: in adaptive mode it is scaled by α, zeros stay zeros)."""

    def __init__(self, store, key):
        self.store = store
        self.key = key

    def forward(self, inputs):
        return inputs[0],

    def backward(self, indexes, grad_outputs):
        self.store[self.key] = grad_outputs[0].array.copy()
        return grad_outputs[0],


class ProbedPlainConvNet(PlainConvNet):
    """PlainConvNet recording the activation gradient at the input of every
    GEMM layer but the first (whose input is the data)."""

    store = None

    def forward(self, x):
        h = x
        for i in range(self.depth):
            if i > 0:
                h, = Probe(self.store, 'conv{}'.format(i + 1)).apply((h,))
            h = F.relu(getattr(self, 'conv{}'.format(i + 1))(h))
        h = F.average(h, axis=(2, 3))
        h, = Probe(self.store, 'fc').apply((h,))
        return self.fc(h)


def _loss(model, x, t):
    return F.softmax_cross_entropy(F.cast(model(x), np.float32), t)


def _bind(scaling, model):
    if hasattr(scaling, 'ada'):
        scaling.bind(model, verbose=False)
    else:
        scaling.bind(model)


def test_adaptive_reduces_activation_gradient_underflow():
    depth, width = 14, 8
    np.random.seed(0)
    with chainer.using_config('dtype', chainer.mixed16):
        m16 = ProbedPlainConvNet(depth=depth, width=width, num_classes=10,
                                 in_channels=1)
    # Scaled-down weights: the gradients shrink ~2x per layer going back,
    # so the early layers' FP16 activation gradients underflow.
    for link in m16.children():
        link.W.array[...] = (link.W.array.astype(np.float32) * 0.5).astype(
            np.float16)
    assert m16.conv1.W.dtype == np.float16
    x16 = np.random.randn(8, 1, 8, 8).astype(np.float16)
    t = np.random.randint(0, 10, 8).astype(np.int32)

    # FP32 reference from the same (FP16-valued) weights and input.
    m32 = ProbedPlainConvNet(depth=depth, width=width, num_classes=10,
                             in_channels=1)
    for (n32, p32), (n16, p16) in zip(sorted(m32.namedparams()),
                                      sorted(m16.namedparams())):
        assert n32 == n16
        p32.array[...] = p16.array.astype(np.float32)
    m32.store = {}
    _loss(m32, x16.astype(np.float32), t).backward()
    ref = m32.store
    layers = ['conv{}'.format(i) for i in range(2, depth + 1)] + ['fc']
    assert sorted(ref) == sorted(layers)

    rate = {}
    for mode in ('none', 'fixed:8', 'adaptive'):
        model = copy.deepcopy(m16)
        model.store = {}
        scaling = make_loss_scaling(mode)
        _bind(scaling, model)
        with chainer.using_config('dtype', chainer.mixed16):
            scaling.backward(_loss(model, x16, t))
        got = model.store
        assert sorted(got) == sorted(layers)
        rate[mode] = {}
        for k in layers:
            assert got[k].dtype == np.float16
            assert np.isfinite(got[k]).all()
            rate[mode][k] = float(np.mean(got[k] == 0) - np.mean(ref[k] == 0))
        if mode == 'adaptive':
            alphas = scaling.loss_scales()
            assert alphas['conv1'] > 2 ** 10   # the scales really grew

    table = '\n'.join(
        '{:7s} none={:.4f} fixed:8={:.4f} adaptive={:.4f}'.format(
            k, rate['none'][k], rate['fixed:8'][k], rate['adaptive'][k])
        for k in layers)
    # The test is meaningful: without scaling the early layers underflow.
    assert rate['none']['conv2'] > 0.5, table
    assert rate['none']['conv4'] > 0.1, table
    assert sum(rate['none'][k] > 0.01 for k in layers) >= 5, table
    assert rate['fixed:8']['conv2'] > 0.1, table
    # adaptive is below both in more than half of the layers ...
    better = [k for k in layers
              if rate['adaptive'][k] < min(rate['none'][k],
                                           rate['fixed:8'][k])]
    assert len(better) > len(layers) / 2, table
    # ... never worse than no scaling, and low everywhere (T_uf = 0.1% per
    # product; allow some slack for the sums)
    for k in layers:
        assert rate['adaptive'][k] <= rate['none'][k] + 1e-12, table
        assert rate['adaptive'][k] < 0.005, table


class LinearNet(chainer.Chain):
    """Three Linear layers, no activation: the gradient of ``l1.W`` does not
    depend on ``l1.W``, which can therefore start at zero."""

    def __init__(self):
        super(LinearNet, self).__init__()
        with self.init_scope():
            self.l1 = AL.Linear(16, 16,
                                initialW=chainer.initializers.Zero())
            self.l2 = AL.Linear(16, 16,
                                initialW=chainer.initializers.Normal(1e-3))
            self.l3 = AL.Linear(16, 4,
                                initialW=chainer.initializers.Normal(1e-3))

    def forward(self, x):
        return self.l3(self.l2(self.l1(x)))


def _tiny_grad_setup():
    np.random.seed(1)
    with chainer.using_config('dtype', chainer.mixed16):
        model = LinearNet()
    x16 = (np.random.randn(8, 16) * 0.3).astype(np.float16)
    t = np.random.randint(0, 4, 8).astype(np.int32)

    def loss_fn(m, x):
        return F.softmax_cross_entropy(F.cast(m(x), np.float32), t) * 2.0 ** -8
    return model, x16, loss_fn


def _true_grad_l1(model, x16, loss_fn):
    m32 = LinearNet()
    for (n32, p32), (n16, p16) in zip(sorted(m32.namedparams()),
                                      sorted(model.namedparams())):
        p32.array[...] = p16.array.astype(np.float32)
    m32.cleargrads()
    loss_fn(m32, x16.astype(np.float32)).backward()
    return m32.l1.W.grad.copy()


def _mixed16_step(model, x16, loss_fn, mode, lr):
    scaling = make_loss_scaling(mode)
    _bind(scaling, model)
    opt = setup_optimizer(chainer.optimizers.SGD(lr=lr), model, 'mixed16')
    model.cleargrads()
    with chainer.using_config('dtype', chainer.mixed16):
        scaling.backward(loss_fn(model, x16))
    assert all(np.isfinite(p.grad).all() for p in model.params())
    fp16_grad = model.l1.W.grad.copy()
    opt.update()
    return scaling, fp16_grad, model.l1.W.update_rule._fp32_param.array


def test_weight_gradient_below_fp16_range_survives_adaptive():
    model, x16, loss_fn = _tiny_grad_setup()
    true_g = _true_grad_l1(model, x16, loss_fn)
    peak = np.abs(true_g).max()
    # the true dW entries are far below FP16's smallest subnormal 2^-24
    assert 1e-10 < peak < 2.0 ** -24 / 4
    assert np.median(np.abs(true_g)) > 1e-10
    lr = 1.0

    m_none = copy.deepcopy(model)
    _, g_none, master_none = _mixed16_step(m_none, x16, loss_fn, 'none', lr)
    assert not g_none.any()                  # flushed to zero in FP16
    assert not master_none.any()             # the master weight stays 0
    assert not m_none.l1.W.array.any()

    m_ada = copy.deepcopy(model)
    scaling, g_ada, master_ada = _mixed16_step(m_ada, x16, loss_fn,
                                               'adaptive', lr)
    alpha = scaling.loss_scales()['l1']
    assert m_ada.l1.W._loss_scale == alpha and alpha >= 2.0 ** 12
    assert g_ada.dtype == np.float16 and np.all(g_ada[true_g != 0] != 0)
    # the FP32 master weight moved by -lr·dW, to FP16 relative precision
    delta = master_ada - 0.0
    expected = -lr * true_g
    rel = np.linalg.norm(delta - expected) / np.linalg.norm(expected)
    assert rel < 2e-3, rel
    np.testing.assert_allclose(delta, expected, rtol=1e-2,
                               atol=1e-2 * np.abs(expected).max())
    # and the other layers match too (l3's α is 1: a plain FP16 gradient)
    assert master_ada.dtype == np.float32
