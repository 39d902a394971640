"""The ⟨α, δ⟩ backward through a transformer (ada_loss/models/gpt.py): in
float32 with power-of-two scales every update is bit for bit plain
backprop's — through attention's two activation × activation GEMMs (a β
per input gradient), softmax, LayerNorm, GELU, the embedding gather, the
residual sums (Algorithm 5), the q/k/v split (a node with three outputs)
and the readout, with the token embedding tied to the readout or not."""
import copy

import chainer
import numpy as np
import pytest

from ada_loss.adaptive import AdaLossScaled, AmaxLossScaled
from ada_loss.models.gpt import GPT, lm_loss

from ada_test_helpers import (
    assert_params_bit_equal, assert_params_changed, is_pow2, params_dict)

V, T = 19, 8


def _tiny(tie, stat='tensor'):
    np.random.seed(0)
    return GPT(V, n_layer=2, n_head=2, n_embd=16, block_size=T,
               tie_weights=tie, attention_stat=stat)


def _batches(n=2, seed=0):
    rng = np.random.RandomState(seed)
    return [(rng.randint(0, V, (3, T)).astype(np.int32),
             rng.randint(0, V, (3, T)).astype(np.int32)) for _ in range(n)]


def _run_both(tie, loss_factor, stat='tensor', scaler=AdaLossScaled,
              **options):
    plain = _tiny(tie, stat)
    ada_model = copy.deepcopy(plain)
    ada = scaler(ada_model, verbose=False, **options)
    opts = []
    for m in (plain, ada_model):
        opt = chainer.optimizers.Adam(alpha=1e-2)
        opt.setup(m)
        opts.append(opt)
    records = []
    for x, t in _batches():
        before = params_dict(plain)
        for model, opt, a in ((plain, opts[0], None),
                              (ada_model, opts[1], ada)):
            model.cleargrads()
            loss = lm_loss(model(x), t) * loss_factor
            if a is None:
                loss.backward()
            else:
                a.backward(loss)
            opt.update()
        assert_params_changed(before, plain)
        assert_params_bit_equal(plain, ada_model)
        # σ of each softmax (attention's), backward order
        records.append((ada.loss_scales(), ada.layer_scales(),
                        [s for label, s in ada.nonlinear_scales()
                         if label == 'Softmax']))
        assert all(is_pow2(s) for _, s in ada.nonlinear_scales())
        for v in list(records[-1][0].values()) + list(
                records[-1][1].values()) + records[-1][2]:
            assert is_pow2(v), v
    return ada, records


@pytest.mark.parametrize('tie', [False, True])
def test_gpt_bit_exact_under_adaptive(tie):
    ada, records = _run_both(tie, 1e-4)
    alphas, betas, _ = records[-1]
    attention = [k for k in betas if k.endswith((':a', ':b'))]
    # both operands of both attention GEMMs of both blocks
    assert len(attention) == 8
    assert max(betas[k] for k in attention) > 1
    assert max(betas.values()) > 1 and len(set(alphas.values())) > 1
    for alphas, betas, sigmas in records:
        # one σ per softmax (1 where nothing flushed beyond T_uf)
        assert len(sigmas) == 2
        for blk, sigma in zip(('blocks/1/attn/', 'blocks/0/attn/'),
                              sigmas):
            # gP leaves P·V at α·β_pv:a and reaches Q·Kᵀ through the
            # softmax (which sends it on at α·σ), the mask and 1/√d
            # (which pass the scale through)
            assert alphas[blk + 'qk:a'] == alphas[blk + 'qk:b'] == \
                alphas[blk + 'pv:a'] * betas[blk + 'pv:a'] * sigma
            # gq, gk, gv meet at the split of c_attn's output (a node with
            # three outputs): c_attn's gradient is at Algorithm 5's common
            # scale, one of theirs (split_scales defers the rescaling of
            # each slice until c_attn has stored it, not the scale)
            assert alphas[blk + 'c_attn'] in (
                alphas[blk + 'qk:a'] * betas[blk + 'qk:a'],
                alphas[blk + 'qk:b'] * betas[blk + 'qk:b'],
                alphas[blk + 'pv:b'] * betas[blk + 'pv:b'])
    # the loss scaled by 1e-4 leaves a softmax's input gradient flushing
    # in FP16 on some pass: σ > 1 was taken, and the update is still exact
    assert max(s for _, _, sigmas in records for s in sigmas) > 1 or \
        not tie


def test_gpt_attention_operands_get_different_betas():
    """The two input gradients of one attention GEMM are scaled apart
    (their operands differ), and still the update is plain backprop's."""
    _, records = _run_both(False, 1e-4, fmt='fp8_e4m3')
    pairs = [(b[k], b[k[:-1] + 'b']) for _, b, _ in records for k in b
             if k.endswith(':a')]
    assert any(x != y for x, y in pairs), pairs


def test_gpt_bit_exact_with_softmax_and_split_scales_taken():
    """Targeting E4M3's range (float32 arrays, so nothing is rounded)
    both of this project's scale changes inside a block are taken — a
    σ > 1 at a softmax and at a GELU, and at a Q/K/V split slices at
    scales apart, some brought down to c_attn's α only after c_attn
    stores them — and the update is plain backprop's bit for bit
    (checked in _run_both)."""
    ada, records = _run_both(False, 1.0, fmt='fp8_e4m3')
    assert max(s for _, _, sigmas in records for s in sigmas) > 1
    # GELU's input gradient too (nonlinear_scale), on the last pass
    assert any(label == 'GELU' and s > 1
               for label, s in ada.nonlinear_scales())
    deferred = 0
    for alphas, betas, sigmas in records:
        assert len(sigmas) == 2
        for blk in ('blocks/0/attn/', 'blocks/1/attn/'):
            slices = {alphas[blk + k] * betas[blk + k]
                      for k in ('qk:a', 'qk:b', 'pv:b')}
            assert alphas[blk + 'c_attn'] in slices
            deferred += alphas[blk + 'c_attn'] < max(slices)
    assert deferred


def test_gpt_tied_readout_scales_the_shared_weight_once():
    """Tied: one parameter wte/W, its gradient the sum of the readout's and
    the lookup's, merged to one α at the leaf (bit for bit above)."""
    ada, _ = _run_both(True, 1e-4)
    names = [n for n, _ in ada.model.namedparams()]
    assert '/wte/W' in names and not any('lm_head' in n for n in names)
    assert ada.model.wte.W._loss_scale is not None


@pytest.mark.parametrize('tie', [False, True])
def test_gpt_bit_exact_with_per_head_statistics(tie):
    _, records = _run_both(tie, 1e-4, stat='head')
    assert max(records[-1][1].values()) > 1


def test_gpt_bit_exact_under_amax():
    _, records = _run_both(True, 1e-4, scaler=AmaxLossScaled,
                           fmt='fp8_e4m3')
    assert max(records[-1][1].values()) > 1


def test_embeddings_are_gathers_not_unconverted_gemms():
    """An EmbedID (a parametric Link that is not a Chain) used to stop the
    conversion with an AttributeError; it is a gather, not a GEMM, so it
    is not listed as a layer left unconverted either."""
    model = _tiny(False)
    ada = AdaLossScaled(model, verbose=False)
    assert ada.not_converted == []
    assert 'lm_head' in ada.converted and 'blocks/0/attn/qk' in \
        ada.converted and 'wte' not in ada.converted


def test_attention_betas_and_backoff_saved_and_resumed(tmp_path):
    """The β cache (attention's ``<layer>:a``/``:b`` keys included) and the
    backoff go through an .npz snapshot, and the resumed scaler reuses the
    cached β's exactly as the original does."""
    model = _tiny(True)
    ada = AdaLossScaled(copy.deepcopy(model), update_interval=4,
                        verbose=False)
    (x, t), = _batches(1)
    ada.model.cleargrads()
    ada.backward(lm_loss(ada.model(x), t) * 1e-4)
    ada._backoff['blocks/0/attn/qk:b'] = 2
    keys = sorted(ada._betas)
    assert 'blocks/0/attn/qk:a' in keys and 'blocks/1/attn/pv:b' in keys
    path = str(tmp_path / 'ada.npz')
    chainer.serializers.save_npz(path, ada)
    resumed = AdaLossScaled(copy.deepcopy(model), update_interval=4,
                            verbose=False)
    chainer.serializers.load_npz(path, resumed)
    assert resumed._betas == ada._betas and resumed.iteration == 1
    assert resumed.backoff() == {'blocks/0/attn/qk:b': 2}
    for a in (ada, resumed):
        a.model.cleargrads()
        a.backward(lm_loss(a.model(x), t) * 1e-2)
    assert resumed.layer_scales() == ada.layer_scales()
    for (n, p), (_, q) in zip(sorted(ada.model.namedparams()),
                              sorted(resumed.model.namedparams())):
        assert np.array_equal(p.grad, q.grad), n
        assert p._loss_scale == q._loss_scale, n
