"""The per-GEMM probe of the FP8 diagnosis (ada_loss/analysis/gemm_probe.py):
its quantities against independent NumPy/ml_dtypes computations on a
two-layer MLP in emulated FP8 E4M3."""
import math

import chainer
import chainer.functions as F
import chainer.links as L
import ml_dtypes
import numpy as np
import pytest

from ada_loss.analysis.gemm_probe import (
    FIELDS, GemmProbe, ProbingLossScaling, set_by)
from ada_loss.functions.gemm import GemmFunction
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import apply_precision


class MLP(chainer.Chain):
    def __init__(self):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(12, 16)
            self.l2 = L.Linear(16, 5)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def e4m3(a):
    return np.asarray(a, np.float32).astype(ml_dtypes.float8_e4m3fn).astype(
        np.float64)


def _model(seed=0):
    np.random.seed(seed)
    model = MLP()
    apply_precision(model, 'fp8_e4m3')
    return model


def test_set_by():
    assert set_by(10.0, 4.0) == 'upper'
    assert set_by(10.0, 20.0) == 'lower'
    assert set_by(0.5, 20.0) == 'one'
    assert set_by(0.5, 0.25) == 'upper'
    assert set_by(None, None) == 'one'


@pytest.mark.parametrize('scale', [1.0, 256.0])
def test_probe_of_a_fixed_scale_against_numpy(scale):
    model = _model()
    rng = np.random.RandomState(1)
    x = rng.randn(8, 12).astype(np.float32)
    t = rng.randint(0, 5, 8).astype(np.int32)
    scaling = ProbingLossScaling(
        make_loss_scaling('fixed:{:g}'.format(scale), 'fp8_e4m3'),
        'fixed', every=1)
    scaling.bind(model)
    model.cleargrads()
    scaling.backward(F.softmax_cross_entropy(model(x), t))
    rows = {r['layer']: r for r in scaling.records}
    assert sorted(rows) == ['l1', 'l2'] and set(FIELDS) <= set(
        rows['l2']) | {'mode'}
    # the loss gradient entering l2, unrounded, at the fixed scale
    y = model(x).array.astype(np.float64)
    p = np.exp(y - y.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    gy = (p - np.eye(5)[t]) / 8 * scale
    nz = gy != 0
    want_uf_in = float((nz & (e4m3(gy) == 0)).sum()) / nz.sum()
    r = rows['l2']
    assert r['uf_in'] == pytest.approx(want_uf_in, abs=1.5 / nz.sum())
    assert r['alpha'] == scale and r['beta'] == 1.0
    # what l2 produces: the stored gradient times W, FP32-accumulated
    W2 = model.l2.W.array.astype(np.float64)
    gx = e4m3(gy) @ e4m3(W2)
    assert r['peak'] == pytest.approx(np.abs(gx).max(), rel=1e-5)
    assert r['headroom_log2'] == pytest.approx(
        math.log2(448.0 / np.abs(gx).max()), rel=1e-5)
    nzx = gx != 0
    assert r['uf_out'] == pytest.approx(
        float((nzx & (e4m3(gx) == 0)).sum()) / nzx.sum(), abs=1e-9)
    assert r['of_in'] == 0.0 and r['k'] == 0.0
    assert r['set_by'] == ''
    assert 0 <= r['err_w'] < 1


def test_probe_of_adaptive_records_beta_and_restores_the_class():
    model = _model(2)
    rng = np.random.RandomState(3)
    x = rng.randn(8, 12).astype(np.float32)
    t = rng.randint(0, 5, 8).astype(np.int32)
    inner = make_loss_scaling('adaptive', 'fp8_e4m3')
    scaling = ProbingLossScaling(inner, 'adaptive', every=2, bound='output')
    scaling.bind(model)
    original = GemmFunction.quantize_grad_output
    for it in range(3):
        model.cleargrads()
        scaling.backward(F.softmax_cross_entropy(model(x), t))
    assert GemmFunction.quantize_grad_output is original
    # probed: iteration 1 and 2 (every 2), not 3
    assert sorted({r['iteration'] for r in scaling.records}) == [1, 2]
    betas = inner.ada.layer_scales()
    alphas = inner.ada.loss_scales()
    last = {r['layer']: r for r in scaling.records if r['iteration'] == 2}
    for k in ('l1', 'l2'):
        assert last[k]['alpha'] == alphas[k]
        assert last[k]['beta'] == betas[k]
        assert last[k]['set_by'] in ('lower', 'upper', 'one')
        # the output bound guarantees its own prediction
        assert last[k]['pred_output'] >= last[k]['peak'] * (1 - 1e-6)


def test_probe_hook_alone_is_a_function_hook():
    assert isinstance(GemmProbe(), chainer.FunctionHook)
