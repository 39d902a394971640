"""Layer scales β beyond FP16's range (β >= 2^16) in mixed16, with both FP16
GEMM paths: 'emulated' (FP32 accumulation; β scales the accumulator) and
'native' (NumPy float16 arithmetic, the path CuPy arrays take too; β
pre-scales the incoming gradient). numpy.float16(2^16) is inf, so β must not
be converted to FP16."""
import copy

import chainer
import chainer.functions as F
import numpy as np
import pytest

from ada_loss import links as AL
from ada_loss.adaptive import AdaLossScaled


class TinyWeightNet(chainer.Chain):
    """A conv path and a linear path whose last GEMMs have tiny weights and
    receive the (small) loss gradient directly: their β is huge."""

    def __init__(self):
        super(TinyWeightNet, self).__init__()
        tiny = chainer.initializers.Normal(1e-5)
        with self.init_scope():
            self.conv1 = AL.Convolution2D(2, 4, 3, pad=1)
            self.conv2 = AL.Convolution2D(4, 4, 3, pad=1, initialW=tiny)
            self.l1 = AL.Linear(8, 8)
            self.l2 = AL.Linear(8, 4, initialW=tiny)

    def forward(self, x, v):
        yc = F.average(self.conv2(F.relu(self.conv1(x))), axis=(2, 3))
        return yc + self.l2(F.relu(self.l1(v)))


@pytest.fixture(scope='module')
def setup():
    np.random.seed(0)
    with chainer.using_config('dtype', chainer.mixed16):
        model = TinyWeightNet()
    rng = np.random.RandomState(0)
    x = rng.randn(4, 2, 4, 4).astype(np.float16)
    v = rng.randn(4, 8).astype(np.float16)
    t = rng.randint(0, 4, 4).astype(np.int32)
    return model, (x, v), t


def _grads(model, x, t, gemm_mode):
    m = copy.deepcopy(model)
    ada = AdaLossScaled(m, verbose=False)
    with chainer.using_config('dtype', chainer.mixed16), \
            chainer.using_config('fp16_gemm', gemm_mode):
        m.cleargrads()
        loss = F.softmax_cross_entropy(F.cast(m(*x), np.float32), t)
        ada.backward(loss * 2.0 ** -12)
    grads = {n: p.grad.astype(np.float64) / (p._loss_scale or 1.0)
             for n, p in m.namedparams()}
    finite = all(np.isfinite(p.grad).all() for p in m.params())
    return ada, grads, finite


@pytest.mark.parametrize('gemm_mode', ['emulated', 'native'])
def test_beta_beyond_fp16_range(setup, gemm_mode):
    model, x, t = setup
    ada, grads, finite = _grads(model, x, t, gemm_mode)
    betas = ada.layer_scales()
    assert betas['l2'] >= 2.0 ** 16 and betas['conv2'] >= 2.0 ** 16, betas
    assert finite
    assert all(np.abs(g).max() > 0 for g in grads.values())


def test_native_matches_emulated(setup):
    model, x, t = setup
    ada_e, ge, _ = _grads(model, x, t, 'emulated')
    ada_n, gn, finite = _grads(model, x, t, 'native')
    assert finite
    assert dict(ada_e.layer_scales()) == dict(ada_n.layer_scales())
    for n in ge:
        # FP16 vs FP32 accumulation: close, not equal
        err = np.linalg.norm(gn[n] - ge[n]) / np.linalg.norm(ge[n])
        assert err < 2e-2, (n, err)
