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
    # the flushed entries' share of the gradient's L1 norm
    lost = np.abs(gy)[nz & (e4m3(gy) == 0)].sum() / np.abs(gy).sum()
    assert r['uf_mass_in'] == pytest.approx(lost, rel=1e-4, abs=1e-7)
    assert (r['uf_mass_in'] > 0) == (r['uf_in'] > 0)
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


def test_probe_sees_the_attention_gemms_of_a_tiny_gpt():
    """A tiny GPT in E4M3 under adaptive: every GEMM gets a row, attention's
    two activation × activation GEMMs one per input gradient (``:a``,
    ``:b``), with the β and α the pass used, the entering gradient's flush
    share shared by both operands, and the output bound's guarantee holding
    for each attention gradient (its gain sums the right axis)."""
    from ada_loss.models.gpt import GPT, lm_loss
    np.random.seed(0)
    model = GPT(13, n_layer=1, n_head=2, n_embd=16, block_size=8)
    apply_precision(model, 'fp8_e4m3')
    rng = np.random.RandomState(1)
    x = rng.randint(0, 13, (3, 8)).astype(np.int32)
    t = rng.randint(0, 13, (3, 8)).astype(np.int32)
    inner = make_loss_scaling('adaptive', 'fp8_e4m3')
    scaling = ProbingLossScaling(inner, 'adaptive', every=1, bound='output')
    scaling.bind(model)
    model.cleargrads()
    scaling.backward(lm_loss(model(x), t))
    rows = {r['layer']: r for r in scaling.records}
    attn = ['blocks/0/attn/{}:{}'.format(g, o) for g in ('qk', 'pv')
            for o in 'ab']
    assert set(attn) <= set(rows)
    assert {'blocks/0/attn/c_attn', 'blocks/0/mlp/c_fc', 'lm_head'} <= set(
        rows)
    betas, alphas = inner.ada.layer_scales(), inner.ada.loss_scales()
    for k in attn:
        r = rows[k]
        assert r['beta'] == betas[k] and r['alpha'] == alphas[k]
        assert 0 <= r['uf_in'] <= 1 and r['of_in'] == 0
        assert r['pred_output'] >= r['peak'] * (1 - 1e-6)
        assert r['err_x'] < 0.5 and math.isnan(r['err_w'])
    for g in ('qk', 'pv'):
        a, b = rows['blocks/0/attn/{}:a'.format(g)], rows[
            'blocks/0/attn/{}:b'.format(g)]
        assert a['uf_in'] == b['uf_in']
    # P·V's entering gradient is c_proj's input gradient, rounded to E4M3
    # already where c_proj produced it (its uf_out): nothing more flushes
    assert rows['blocks/0/attn/pv:a']['uf_in'] == 0
    # Q·Kᵀ's is the softmax backward's FP32 result: rounded here
    assert rows['blocks/0/attn/qk:a']['log2_hist']


@pytest.mark.parametrize('mode', ['fixed:1', 'dynamic', 'adaptive'])
def test_probe_names_every_gemm_of_a_tied_gpt_in_every_mode(mode):
    """On Chainer's own backward (fixed, dynamic) as on the ⟨α, δ⟩ one, the
    tied readout and attention's GEMMs are named by their paths (before,
    Chainer's backward named them ``LinearFunction`` and ``matmul@<id>``)."""
    from ada_loss.models.gpt import GPT, lm_loss
    np.random.seed(0)
    model = GPT(13, n_layer=1, n_head=2, n_embd=16, block_size=8,
                tie_weights=True)
    apply_precision(model, 'fp8_e4m3')
    rng = np.random.RandomState(1)
    x = rng.randint(0, 13, (3, 8)).astype(np.int32)
    t = rng.randint(0, 13, (3, 8)).astype(np.int32)
    scaling = ProbingLossScaling(make_loss_scaling(mode, 'fp8_e4m3'), mode,
                                 every=1)
    scaling.bind(model)
    model.cleargrads()
    scaling.backward(lm_loss(model(x), t))
    assert {r['layer'] for r in scaling.records} == {
        'lm_head', 'blocks/0/mlp/c_proj', 'blocks/0/mlp/c_fc',
        'blocks/0/attn/c_proj', 'blocks/0/attn/pv:a', 'blocks/0/attn/pv:b',
        'blocks/0/attn/qk:a', 'blocks/0/attn/qk:b', 'blocks/0/attn/c_attn'}
