"""The prototype α_{N+1} of ada_loss/analysis/auto_init_scale.py: Eq. 1 on
the loss gradient, against an independent float64/SciPy computation, and
its effect on an adaptive backward in emulated FP8 E4M3."""
import math

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest
from scipy import special

from ada_loss.analysis.auto_init_scale import AutoInitScale, eq1_scale
from ada_loss.formats import get_format
from ada_loss.functions.gemm import GemmFunction
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import apply_precision

E4M3 = get_format('fp8_e4m3')


def reference(g, t_uf, u, u_max):
    g = np.asarray(g, np.float64)
    lower = u / (math.sqrt(np.mean(g * g)) * math.sqrt(2.0)
                 * float(special.erfinv(t_uf)))
    x = min(max(lower, 1.0), u_max / np.abs(g).max())
    return 2.0 ** math.floor(math.log2(x))


@pytest.mark.parametrize('std', [1e-4, 3e-3, 1e-1, 30.0])
def test_eq1_scale_against_scipy(std):
    g = np.random.RandomState(0).randn(64, 10) * std
    assert eq1_scale(g, 1e-3, E4M3) == reference(g, 1e-3, 2.0 ** -9, 448.0)


def test_eq1_scale_degenerate():
    assert eq1_scale(np.zeros((3, 3)), 1e-3, E4M3) == 1.0
    assert eq1_scale(np.array([np.nan, 1.0]), 1e-3, E4M3) == 1.0
    # large gradients: the cap u_max / max|g| wins, below 1
    assert eq1_scale(np.array([1000.0, -1.0]), 1e-3, E4M3) == 0.25


def test_auto_init_scale_follows_the_loss_gradient():
    np.random.seed(0)
    model = chainer.Sequential(L.Linear(12, 16), F.relu, L.Linear(16, 10))
    apply_precision(model, 'fp8_e4m3')
    inner = make_loss_scaling('adaptive', 'fp8_e4m3')
    auto = AutoInitScale(inner)
    auto.bind(model)
    rng = np.random.RandomState(1)
    x = rng.randn(64, 12).astype(np.float32)
    t = rng.randint(0, 10, 64).astype(np.int32)
    original = GemmFunction.quantize_grad_output
    for step in range(2):
        model.cleargrads()
        loss = F.softmax_cross_entropy(model(x), t)
        y = model(x).array.astype(np.float64)
        p = np.exp(y - y.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        g = (p - np.eye(10)[t]) / 64         # the unscaled loss gradient
        auto.backward(loss)
        assert GemmFunction.quantize_grad_output is original
        want = reference(g, 1e-3, 2.0 ** -9, 448.0)
        assert inner.ada.init_scale == want > 1
    # the second pass started at the scale the first one chose
    assert auto.scales == [1.0, want]
    assert inner.loss_scales()[list(inner.loss_scales())[0]] == want
