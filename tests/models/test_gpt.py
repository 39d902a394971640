"""The GPT (ada_loss/models/gpt.py): shapes, causality, weight tying, bad
input; every precision builds it and trains a step with a finite loss, its
attention GEMMs cast by the precision (or kept in a higher precision with
``attention_format``)."""
import chainer
import ml_dtypes
import numpy as np
import pytest

from ada_loss.formats import get_format
from ada_loss.models.gpt import DEFAULTS, GPT, lm_accuracy, lm_loss
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import apply_precision, dtype_config, setup_optimizer

V, T = 19, 8


def _tiny(**kw):
    np.random.seed(0)
    shape = dict(n_layer=1, n_head=2, n_embd=16, block_size=T)
    shape.update(kw)
    return GPT(V, **shape)


def _batch(seed=0, B=3):
    rng = np.random.RandomState(seed)
    return (rng.randint(0, V, (B, T)).astype(np.int32),
            rng.randint(0, V, (B, T)).astype(np.int32))


def test_defaults_are_nanogpts_cpu_shape():
    assert DEFAULTS == dict(n_layer=4, n_head=4, n_embd=128, block_size=64)
    m = GPT(65)
    assert len(m.blocks) == 4 and m.wpe.W.shape == (64, 128)
    assert m.blocks[0].attn.n_head == 4


def test_shapes_loss_and_accuracy():
    m = _tiny()
    x, t = _batch()
    y = m(x)
    assert y.shape == (3, T, V) and y.dtype == np.float32
    loss = lm_loss(y, t)
    # at initialization (std 0.02) the logits are near 0: loss ~ log V
    assert abs(float(loss.array) - np.log(V)) < 0.1
    acc = float(lm_accuracy(y, t).array)
    assert 0 <= acc <= 1


def test_causal():
    """The logits at position i do not depend on tokens after i."""
    m = _tiny(n_layer=2)
    x, _ = _batch()
    x2 = x.copy()
    x2[:, 5:] = (x2[:, 5:] + 1) % V
    with chainer.no_backprop_mode():
        y, y2 = m(x).array, m(x2).array
    np.testing.assert_array_equal(y[:, :5], y2[:, :5])
    assert not np.array_equal(y[:, 5:], y2[:, 5:])


def test_tied_weights_share_one_parameter():
    tied, untied = _tiny(tie_weights=True), _tiny()
    names = dict(tied.namedparams())
    assert '/lm_head/W' not in names
    assert '/lm_head/W' in dict(untied.namedparams())
    n = sum(p.size for p in tied.params())
    assert n == sum(p.size for p in untied.params()) - V * 16
    # the readout is the embedding's transpose
    assert tied.lm_head.W is tied.wte.W


@pytest.mark.parametrize('kw, match', [
    (dict(n_embd=15), 'multiple of n_head'),
    (dict(attention_stat='row'), 'attention_stat'),
    (dict(n_layer=0), 'n_layer must be a positive integer'),
])
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        _tiny(**kw)


def test_bad_input():
    m = _tiny()
    with pytest.raises(ValueError, match='batch, time'):
        m(np.zeros(T, np.int32))
    with pytest.raises(ValueError, match='block size'):
        m(np.zeros((1, T + 1), np.int32))


#: (precision, mode): every precision family; a scaled recipe with its own
#: gradient scaling (mode None: its default, none) and with grad=loss and
#: adaptive
PRECISIONS = [
    ('float32', 'adaptive'), ('mixed16', 'adaptive'), ('bf16', 'adaptive'),
    ('fp8', 'adaptive'), ('fp8_e4m3', 'adaptive'),
    ('fp8_e4m3', 'adaptive:init_scale=amax'),
    ('fp8:recipe=current', None), ('fp8:recipe=delayed', None),
    ('fp8:recipe=blockwise', None),
    ('fp8_e4m3:recipe=current,grad=loss', 'adaptive'),
    ('mxfp8', None), ('mxfp8:grad=loss', 'adaptive'), ('nvfp4', None),
]


def _train(precision, mode, steps=2, tie=True, **kw):
    with dtype_config(precision):
        m = _tiny(tie_weights=tie, **kw)
    paths = apply_precision(m, precision)
    opt = setup_optimizer(chainer.optimizers.Adam(alpha=1e-2), m, precision)
    scaling = make_loss_scaling(mode, precision)
    scaling.bind(m)
    before = {n: p.array.copy() for n, p in m.namedparams()}
    losses = []
    for s in range(steps):
        x, t = _batch(s)
        m.cleargrads()
        with dtype_config(precision):
            loss = lm_loss(m(x), t)
        scaling.backward(loss)
        finite = all(np.isfinite(p.grad).all() for p in m.params())
        scaling.update(not finite)
        assert finite, (precision, mode, s)
        opt.update()
        losses.append(float(loss.array))
    assert np.isfinite(losses).all()
    changed = [n for n, p in m.namedparams()
               if not np.array_equal(before[n], p.array)]
    assert len(changed) == len(before)
    return m, paths, scaling


@pytest.mark.parametrize('precision, mode', PRECISIONS)
def test_every_precision_trains_a_step(precision, mode):
    m, paths, _ = _train(precision, mode)
    attn = m.blocks[0].attn
    assert {'blocks/0/attn/qk', 'blocks/0/attn/pv', 'lm_head'} <= set(paths)
    if precision in ('float32', 'mixed16'):
        assert attn.qk.gemm_formats is None and attn.qk.gemm_scaling is None
    elif ':' in precision or precision.startswith(('mx', 'nv')):
        # the attention GEMMs get the recipe's casts, each its own state
        assert attn.qk.gemm_scaling is not None
        assert attn.qk.gemm_scaling is not attn.pv.gemm_scaling
    else:
        assert attn.qk.gemm_formats == m.blocks[0].mlp.c_fc.gemm_formats


def _qk_output(m, precision):
    attn = m.blocks[0].attn
    rng = np.random.RandomState(5)
    q = rng.randn(2, 2, T, 8).astype(np.float32)
    kt = rng.randn(2, 2, 8, T).astype(np.float32)
    with dtype_config(precision):
        return q, kt, attn.qk(q, kt).array


def test_attention_gemms_are_rounded_in_an_emulated_precision():
    with dtype_config('fp8_e4m3'):
        m = _tiny()
    apply_precision(m, 'fp8_e4m3')
    q, kt, s = _qk_output(m, 'fp8_e4m3')
    e4 = ml_dtypes.float8_e4m3fn

    def r(a):
        return a.astype(e4).astype(np.float32)
    np.testing.assert_array_equal(s, r(np.matmul(r(q), r(kt))))


def test_attention_gemms_cast_by_a_per_tensor_recipe():
    with dtype_config('fp8:recipe=current'):
        m = _tiny()
    apply_precision(m, 'fp8:recipe=current')
    q, kt, s = _qk_output(m, 'fp8:recipe=current')
    # one scale per operand, amax → E4M3's 448: not the FP32 product
    assert not np.array_equal(s, np.matmul(q, kt))
    from ada_loss.formats.per_tensor import quantize_per_tensor
    e4 = get_format('fp8_e4m3')
    want = np.matmul(quantize_per_tensor(q, e4)[0],
                     quantize_per_tensor(kt, e4)[0])
    np.testing.assert_array_equal(s, want)


@pytest.mark.parametrize('precision', ['nvfp4', 'fp8_e4m3'])
def test_attention_format_keeps_attention_in_bf16(precision):
    """``attention_format='bfloat16'``: the attention GEMMs round to BF16
    and take no recipe cast, the other GEMMs keep the precision's."""
    m, _, _ = _train(precision, 'adaptive' if precision == 'fp8_e4m3'
                     else None, steps=1, attention_format='bfloat16')
    attn = m.blocks[0].attn
    bf16 = get_format('bfloat16')
    assert attn.qk.gemm_formats == (bf16, bf16) and \
        attn.qk.gemm_scaling is None
    assert m.blocks[0].mlp.c_fc.gemm_formats != (bf16, bf16)
    q, kt, s = _qk_output(m, precision)
    b = ml_dtypes.bfloat16

    def r(a):
        return a.astype(b).astype(np.float32)
    np.testing.assert_array_equal(s, r(np.matmul(r(q), r(kt))))


def test_attention_format_float32_leaves_attention_unrounded():
    m, _, _ = _train('fp8_e4m3', 'adaptive', steps=1,
                     attention_format='float32')
    q, kt, s = _qk_output(m, 'fp8_e4m3')
    np.testing.assert_array_equal(s, np.matmul(q, kt))


def test_nvfp4_bf16_layers_may_name_attention_gemms():
    m = _tiny()
    apply_precision(m, 'nvfp4:bf16=blocks/0/attn/qk+blocks/0/attn/pv')
    bf16 = get_format('bfloat16')
    for link in (m.blocks[0].attn.qk, m.blocks[0].attn.pv):
        assert link.gemm_formats == (bf16, bf16) and link.gemm_scaling is None
    assert m.blocks[0].attn.c_attn.gemm_scaling is not None


@pytest.mark.parametrize('precision, mode', [
    ('float32', 'fp32'), ('fp8_e4m3', 'adaptive:init_scale=amax')])
def test_learns_a_sequence_it_must_attend_to(precision, mode):
    """Each sequence repeats a random 4-token pattern twice: the second half
    is predictable only by attending back to the first. After 150 Adam steps
    the loss on the second half is far below chance (log V) — the mask,
    positions and attention work — in FP32 and in E4M3 under adaptive with
    the loss gradient scaled (``init_scale=amax``; with α_{N+1} = 1 this
    toy run diverges: docs/transformer.md, scripts/gpt_copy_task.py)."""
    with dtype_config(precision):
        m = _tiny(n_embd=32)
    apply_precision(m, precision)
    opt = setup_optimizer(chainer.optimizers.Adam(alpha=1e-2), m, precision)
    scaling = make_loss_scaling(mode, precision)
    scaling.bind(m)
    rng = np.random.RandomState(0)

    def batch():
        pat = rng.randint(0, V, (16, 4))
        x = np.concatenate([pat, pat], axis=1).astype(np.int32)
        return x[:, :-1], x[:, 1:]
    for _ in range(150):
        x, t = batch()
        m.cleargrads()
        with dtype_config(precision):
            scaling.backward(lm_loss(m(x), t))
        opt.update()
    x, t = batch()
    with chainer.no_backprop_mode(), dtype_config(precision):
        y = m(x)
    second = lm_loss(y[:, 3:], t[:, 3:])
    assert float(second.array) < 0.25 * np.log(V), float(second.array)


def test_tied_linear_needs_a_weight():
    from ada_loss.links import TiedLinear
    with pytest.raises(ValueError, match='link with a weight W'):
        TiedLinear(chainer.Link())


def test_no_bias_is_the_biased_model_with_zero_biases():
    """bias=False drops every Linear bias and LayerNorm β; at
    initialization (biases 0, β 0) the two models compute the same logits
    and weight gradients, so the β-less LayerNorm is LayerNorm with β=0."""
    x, t = _batch()
    plain, biased = _tiny(bias=False), _tiny(bias=True)
    names = {n for n, _ in plain.namedparams()}
    assert not any(n.endswith(('/b', '/beta')) for n in names)
    assert names < {n for n, _ in biased.namedparams()}
    for m in (plain, biased):
        m.cleargrads()
        lm_loss(m(x), t).backward()
    np.testing.assert_array_equal(plain(x).array, biased(x).array)
    biased_params = dict(biased.namedparams())
    for n, p in plain.namedparams():
        np.testing.assert_array_equal(p.grad, biased_params[n].grad, n)
