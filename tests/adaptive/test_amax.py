"""The ``amax`` mode (max-based layer-wise scaling on the ⟨α, δ⟩ backward):
bit-exact against plain backprop in float32 (all scales are powers of two),
its β from the amax history as the formula says, its weight-gradient scale
γ ≤ 1, and its state saved and restored."""
import copy

import chainer
import numpy as np
import pytest

from ada_loss.adaptive import AmaxLossScaled
from ada_loss.loss_scale.amax import amax_loss_scale

from test_ada_exactness import (
    MLP, MultiHeadNet, ResBlockNet, _mlp_loss, _multihead_loss, _run_both)


def _batches(rng, shape, n=3, classes=5):
    return [(rng.randn(*shape).astype(np.float32),
             rng.randint(0, classes, shape[0]).astype(np.int32))
            for _ in range(n)]


@pytest.mark.parametrize('margin', [0, 8])
def test_amax_bit_exact_mlp(margin):
    batches = _batches(np.random.RandomState(0), (16, 20))
    _, model, amax, records = _run_both(MLP, batches, _mlp_loss,
                                        scaler=AmaxLossScaled, margin=margin)
    alphas, betas = records[-1]
    assert max(betas.values()) > 1 and len(set(alphas.values())) > 1


def test_amax_bit_exact_resblock_and_multihead():
    rng = np.random.RandomState(2)
    _run_both(ResBlockNet, _batches(rng, (4, 3, 6, 6)), _mlp_loss, seed=2,
              scaler=AmaxLossScaled)
    batches = [(rng.randn(2, 3, 8, 8).astype(np.float32),) for _ in range(3)]
    _, _, _, records = _run_both(MultiHeadNet, batches, _multihead_loss,
                                 seed=3, scaler=AmaxLossScaled)
    assert max(records[-1][1].values()) > 1


def test_beta_from_history_and_serialize():
    rng = np.random.RandomState(5)
    batches = _batches(rng, (16, 20), n=4)
    _, model, amax, records = _run_both(
        MLP, batches, _mlp_loss, scaler=AmaxLossScaled, history=2,
        margin=3, max_accum_scale=None)
    # β of l3 (α = 1) from the history of max|δx| of l3 (kept unscaled):
    # one more backward uses the current history
    hist = list(amax._amax['l3#x'])
    assert len(hist) == 2
    model.cleargrads()
    amax.backward(_mlp_loss(*batches[0])(model))
    beta = amax.layer_scales()['l3']
    assert beta == amax_loss_scale(max(hist), 1.0, 'float16', 3)
    assert beta * max(hist) <= 65504.0 / 8 < 2 * beta * max(hist)
    # with the default cap, α·β stays within 2^24
    capped = AmaxLossScaled(copy.deepcopy(model), verbose=False)
    capped._amax = copy.deepcopy(amax._amax)
    capped.backward(_mlp_loss(*batches[0])(capped.model))
    assert capped.layer_scales()['l3'] == min(beta, 2.0 ** 24)
    saved = {}

    class Ser(chainer.serializer.Serializer):
        def __getitem__(self, k):
            return self

        def __call__(self, k, v):
            saved[k] = copy.deepcopy(v)
            return v

    class De(chainer.serializer.Deserializer):
        def __getitem__(self, k):
            return self

        def __call__(self, k, v):
            return saved[k]

    amax.serialize(Ser())
    other = AmaxLossScaled(copy.deepcopy(model), history=2, margin=3,
                           verbose=False)
    other.serialize(De())
    assert {k: list(v) for k, v in other._amax.items()} == \
        {k: list(v) for k, v in amax._amax.items()}
    assert other.iteration == amax.iteration


def test_amax_formula_and_bad_options():
    assert amax_loss_scale(0.01, 1.0, 'fp8_e4m3', 0) == 32768.0  # 448/0.01
    assert amax_loss_scale(0.01, 4.0, 'fp8_e4m3', 2) == 2048.0
    assert amax_loss_scale(0.0, 1.0) == 1.0
    assert amax_loss_scale(float('inf'), 1.0) == 1.0
    with pytest.raises(ValueError, match='margin'):
        amax_loss_scale(1.0, 1.0, margin=-1)
    with pytest.raises(ValueError, match='history'):
        AmaxLossScaled(chainer.Chain(), history=0, verbose=False)
