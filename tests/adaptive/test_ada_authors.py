"""AdaLossScaled(style='authors') (issue 37): β of a layer is
authors_loss_scale of the gradient entering it, with the caps applied with
the α it arrives at, kept between updates uncapped (as theirs)."""
import copy

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

from ada_loss.adaptive import AdaLossScaled
from ada_loss.loss_scale.gemm import authors_loss_scale, gemm_loss_scale


class Net(chainer.Chain):
    def __init__(self):
        super(Net, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(12, 24)
            self.l2 = L.Linear(24, 10)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def _setup(seed=0):
    with chainer.using_config('dtype', np.float16):
        np.random.seed(seed)
        net = Net()
    rng = np.random.RandomState(seed)
    x = rng.randn(8, 12).astype(np.float16)
    return net, x


def _run(ada, net, x, gy):
    net.cleargrads()
    y = net(x)
    ada.backward(F.sum(y * gy))
    return dict(ada.loss_scales()), dict(ada.layer_scales())


@pytest.mark.parametrize('scale', [1e-5, 1e-2, 30.0])
def test_last_layer_beta_is_authors_formula(scale):
    net, x = _setup()
    gy = (np.random.RandomState(1).randn(8, 10) * scale).astype(np.float16)
    ada = AdaLossScaled(net, style='authors', verbose=False)
    alphas, betas = _run(ada, net, x, gy)
    assert alphas['l2'] == 1.0
    want = authors_loss_scale(net.l2.W.array, gy)
    assert betas['l2'] == want
    assert alphas['l1'] == want
    # the paper's style on the same gradient differs in the small cases
    if scale < 1e-3:
        assert want < gemm_loss_scale(net.l2.W.array, gy, bound='output',
                                      gain=float(np.abs(net.l2.W.array.astype(
                                          np.float64)).sum(0).max()))


def test_caps_use_the_arriving_alpha():
    net, x = _setup()
    gy = (np.random.RandomState(1).randn(8, 10) * 1e-6).astype(np.float16)
    # raw β of l2 is about 109: the layer cap 16 binds
    ada = AdaLossScaled(copy.deepcopy(net), style='authors',
                        max_layer_scale=16, max_accum_scale=4096,
                        verbose=False)
    alphas, betas = _run(ada, ada.model, x, gy)
    assert betas['l2'] == 16.0 == authors_loss_scale(
        net.l2.W.array, gy, max_layer_scale=16, max_accum_scale=4096)
    # arriving at α = 512 with an accumulated cap of 256: β = 1/2 (< 1)
    ada = AdaLossScaled(copy.deepcopy(net), style='authors', init_scale=512.0,
                        max_layer_scale=128, max_accum_scale=256,
                        verbose=False)
    alphas, betas = _run(ada, ada.model, x, gy)
    assert alphas['l2'] == 512.0
    assert betas['l2'] == 0.5 == authors_loss_scale(
        net.l2.W.array, gy * np.float16(512), alpha=512.0,
        max_layer_scale=128, max_accum_scale=256)
    assert alphas['l1'] == 256.0


def test_update_interval_keeps_uncapped_beta():
    net, x = _setup()
    rng = np.random.RandomState(2)
    g_small = (rng.randn(8, 10) * 1e-5).astype(np.float16)
    g_big = (rng.randn(8, 10) * 30).astype(np.float16)
    ada = AdaLossScaled(net, style='authors', update_interval=2,
                        verbose=False)
    _, b1 = _run(ada, net, x, g_small)
    _, b2 = _run(ada, net, x, g_big)      # reused, not recomputed
    assert b2['l2'] == b1['l2'] == authors_loss_scale(net.l2.W.array,
                                                      g_small)
    _, b3 = _run(ada, net, x, g_big)      # recomputed
    assert b3['l2'] == authors_loss_scale(net.l2.W.array, g_big)
    assert b3['l2'] != b1['l2']


def test_style_options():
    net, _ = _setup()
    assert AdaLossScaled(copy.deepcopy(net), verbose=False).bound == 'output'
    assert AdaLossScaled(copy.deepcopy(net), style='authors',
                         verbose=False).bound == 'fan_in'
    with pytest.raises(ValueError, match='fan_in'):
        AdaLossScaled(copy.deepcopy(net), style='authors', bound='output',
                      verbose=False)
    with pytest.raises(ValueError, match='paper, authors'):
        AdaLossScaled(copy.deepcopy(net), style='theirs', verbose=False)
