"""AdaLossScaled options (update_interval, caps), report keys, foreign GEMM
warnings and serialization."""
import copy
import warnings

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

from ada_loss.adaptive import AdaLossScaled
from ada_loss.models import resnet20
from ada_loss.scaling import make_loss_scaling

from ada_test_helpers import (
    assert_params_bit_equal, assert_params_changed, is_pow2, params_dict)


class MLP(chainer.Chain):
    def __init__(self):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(10, 32)
            self.l2 = L.Linear(32, 32)
            self.l3 = L.Linear(32, 32)
            self.l4 = L.Linear(32, 4)

    def forward(self, x):
        h = F.relu(self.l1(x))
        h = F.relu(self.l2(h))
        h = F.relu(self.l3(h))
        return self.l4(h)


def _data(seed=0, n=16):
    rng = np.random.RandomState(seed)
    return (rng.randn(n, 10).astype(np.float32),
            rng.randint(0, 4, n).astype(np.int32))


def _backward(ada, model, x, t, factor):
    model.cleargrads()
    ada.backward(F.softmax_cross_entropy(model(x), t) * factor)


def _fresh_betas(model, x, t, factor):
    m = copy.deepcopy(model)
    a = AdaLossScaled(m, verbose=False)
    _backward(a, m, x, t, factor)
    return dict(a.layer_scales())


def test_update_interval_reuses_beta():
    np.random.seed(0)
    model = MLP()
    x, t = _data()
    model(x)
    ada = AdaLossScaled(copy.deepcopy(model), update_interval=3,
                        verbose=False)
    m = ada.model
    # gradient magnitude changes by 2^10 between iterations 1 and 2, and by
    # 2^5 between 4 and 5; β is recomputed only on iterations 1, 4, 7.
    factors = [1e-2, 1e-2 * 2 ** -10, 1e-2 * 2 ** -10, 1e-2 * 2 ** -10,
               1e-2 * 2 ** -5, 1e-2 * 2 ** -5, 1e-2 * 2 ** -5]
    fresh = {f: _fresh_betas(model, x, t, f) for f in set(factors)}
    assert fresh[factors[0]] != fresh[factors[1]]
    assert fresh[factors[1]] != fresh[factors[4]]
    seen = []
    for it, f in enumerate(factors, 1):
        _backward(ada, m, x, t, f)
        assert ada.iteration == it
        seen.append(dict(ada.layer_scales()))
        # whatever β is used, the unscaled gradients are exact
        ref = copy.deepcopy(model)
        ref.cleargrads()
        (F.softmax_cross_entropy(ref(x), t) * f).backward()
        for (n, p), (n2, q) in zip(sorted(m.namedparams()),
                                   sorted(ref.namedparams())):
            np.testing.assert_array_equal(
                p.grad / np.float32(p._loss_scale or 1.0), q.grad)
    assert seen[0] == fresh[factors[0]]
    assert seen[1] == seen[0] and seen[2] == seen[0]      # stale on 2, 3
    assert seen[3] == fresh[factors[3]] != seen[0]        # recomputed on 4
    assert seen[4] == seen[3] and seen[5] == seen[3]      # stale on 5, 6
    assert seen[6] == fresh[factors[6]] != seen[3]        # recomputed on 7


def test_update_interval_one_recomputes_every_time():
    np.random.seed(1)
    model = MLP()
    x, t = _data(1)
    model(x)
    ada = AdaLossScaled(model, update_interval=1, verbose=False)
    _backward(ada, model, x, t, 1e-4)
    b1 = dict(ada.layer_scales())
    _backward(ada, model, x, t, 1e-4 * 2 ** -10)
    b2 = dict(ada.layer_scales())
    # β of the last layer follows 1/σ_g; the layers below see a gradient
    # already rescaled by it, so their β stays the same
    assert b1['l4'] > 1 and b2['l4'] == b1['l4'] * 2 ** 10
    assert all(b2[k] == b1[k] for k in ('l3', 'l2', 'l1'))


def test_caps_on_beta_and_alpha():
    np.random.seed(2)
    model = MLP()
    x, t = _data(2)
    model(x)
    free = AdaLossScaled(copy.deepcopy(model), verbose=False)
    _backward(free, free.model, x, t, 1e-4)
    assert max(free.layer_scales().values()) > 4
    assert max(free.loss_scales().values()) > 64

    capped_b = AdaLossScaled(copy.deepcopy(model), max_layer_scale=4,
                             verbose=False)
    _backward(capped_b, capped_b.model, x, t, 1e-4)
    assert max(capped_b.layer_scales().values()) == 4.0
    assert all(b <= 4 for b in capped_b.layer_scales().values())

    capped_a = AdaLossScaled(copy.deepcopy(model), max_accum_scale=64,
                             verbose=False)
    _backward(capped_a, capped_a.model, x, t, 1e-4)
    alphas, betas = capped_a.loss_scales(), capped_a.layer_scales()
    assert max(alphas.values()) == 64.0
    for k in alphas:
        assert alphas[k] <= 64
        assert alphas[k] * betas[k] <= 64
        assert is_pow2(alphas[k]) and is_pow2(betas[k])

    # and the capped runs still give the exact plain update (float32)
    for ada in (capped_b, capped_a):
        plain = copy.deepcopy(model)
        for m, a in ((plain, None), (ada.model, ada)):
            opt = chainer.optimizers.MomentumSGD(lr=0.5)
            opt.setup(m)
            m.cleargrads()
            loss = F.softmax_cross_entropy(m(x), t) * 1e-4
            loss.backward() if a is None else a.backward(loss)
            opt.update()
        assert_params_bit_equal(plain, ada.model)


@pytest.mark.parametrize('kwargs', [
    dict(init_scale=0), dict(init_scale=-1), dict(init_scale=float('inf')),
    dict(t_uf=0), dict(t_uf=1), dict(update_interval=0),
    dict(update_interval=1.5), dict(max_layer_scale=0.5),
    dict(max_accum_scale=0), dict(fmt='int8'),
])
def test_invalid_options(kwargs):
    with pytest.raises(ValueError):
        AdaLossScaled(chainer.Chain(), verbose=False, **kwargs)


def test_non_power_of_two_init_scale_warns():
    with pytest.warns(UserWarning, match='power of two'):
        AdaLossScaled(chainer.Chain(), init_scale=3.0, verbose=False)


def test_resnet20_loss_scale_keys():
    np.random.seed(3)
    model = resnet20(10)
    gemm_paths = sorted(p.lstrip('/') for p, link in model.namedlinks()
                        if isinstance(link, (L.Linear, L.Convolution2D)))
    assert len(gemm_paths) == 20
    ada = AdaLossScaled(model, verbose=False)
    assert sorted(ada.converted) == gemm_paths
    x = np.random.randn(2, 3, 32, 32).astype(np.float32)
    t = np.array([1, 7], np.int32)
    model.cleargrads()
    ada.backward(F.softmax_cross_entropy(model(x), t) * 1e-3)
    alphas, betas = ada.loss_scales(), ada.layer_scales()
    assert sorted(alphas) == gemm_paths == sorted(betas)
    assert 'res2/0/conv1' in alphas and 'res4/2/conv2' in alphas
    assert not any(k.startswith('/') for k in alphas)
    for d in (alphas, betas):
        for v in d.values():
            assert type(v) is float and is_pow2(v)
    assert max(betas.values()) > 1
    # the fc layer sees the loss gradient at the initial scale
    assert alphas['fc'] == 1.0
    # the mode API reports the same dict
    scaling = make_loss_scaling('adaptive')
    scaling.bind(model, verbose=False)
    model.cleargrads()
    scaling.backward(F.softmax_cross_entropy(model(x), t) * 1e-3)
    assert dict(scaling.loss_scales()) == dict(alphas)


class WithRawConv(chainer.Chain):
    """A scale-aware conv, then a raw ``F.convolution_2d`` on a bare
    parameter, then a scale-aware linear head."""

    def __init__(self):
        super(WithRawConv, self).__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(3, 6, 3, pad=1)
            self.raw_w = chainer.Parameter(
                chainer.initializers.HeNormal(), (6, 6, 3, 3))
            self.fc = L.Linear(6 * 5 * 5, 4)

    def forward(self, x):
        h = F.relu(self.conv(x))
        h = F.relu(F.convolution_2d(h, self.raw_w, pad=1))
        return self.fc(h)


def test_raw_chainer_gemm_warns_and_stays_exact():
    np.random.seed(4)
    rng = np.random.RandomState(4)
    x = rng.randn(4, 3, 5, 5).astype(np.float32)
    t = rng.randint(0, 4, 4).astype(np.int32)
    plain = WithRawConv()
    plain(x)
    plain.cleargrads()
    model = copy.deepcopy(plain)
    ada = AdaLossScaled(model, verbose=False)
    assert sorted(ada.converted) == ['conv', 'fc']
    opts = []
    for m in (plain, model):
        o = chainer.optimizers.MomentumSGD(lr=0.1)
        o.setup(m)
        opts.append(o)

    def loss_of(m):
        return F.softmax_cross_entropy(m(x), t) * 1e-4

    for step in range(2):
        before = params_dict(plain)
        plain.cleargrads()
        loss_of(plain).backward()
        opts[0].update()
        model.cleargrads()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            ada.backward(loss_of(model))
        msgs = [str(i.message) for i in w]
        if step == 0:
            assert any('Convolution2DFunction' in s and 'beta = 1' in s
                       for s in msgs), msgs
        else:
            assert not any('Convolution2DFunction' in s for s in msgs), msgs
        # the raw conv's weight gradient is carried at the head's α·β
        alphas, betas = ada.loss_scales(), ada.layer_scales()
        assert model.raw_w._loss_scale == alphas['fc'] * betas['fc'] > 1
        # β = 1 through the raw conv: conv sees the same α
        assert alphas['conv'] == alphas['fc'] * betas['fc']
        opts[1].update()
        assert_params_changed(before, plain)
        assert_params_bit_equal(plain, model)


def _serialized(obj):
    s = chainer.serializers.DictionarySerializer()
    obj.serialize(s)
    return s.target


def test_serialize_round_trip(tmp_path):
    np.random.seed(5)
    model = MLP()
    x, t = _data(5)
    model(x)
    ada = AdaLossScaled(copy.deepcopy(model), update_interval=3,
                        verbose=False)
    _backward(ada, ada.model, x, t, 1e-2)
    _backward(ada, ada.model, x, t, 1e-2)
    # l1's input needs no gradient: no β is computed (nor cached) for it
    assert ada.iteration == 2 and sorted(ada._betas) == ['l2', 'l3', 'l4']

    target = _serialized(ada)
    restored = AdaLossScaled(copy.deepcopy(model), update_interval=3,
                             verbose=False)
    assert restored.iteration == 0 and not restored._betas
    restored.serialize(chainer.serializers.NpzDeserializer(target))
    assert restored.iteration == 2
    assert restored._betas == ada._betas
    assert all(type(v) is float for v in restored._betas.values())

    # through an .npz file as well
    path = str(tmp_path / 'ada.npz')
    chainer.serializers.save_npz(path, ada)
    from_file = AdaLossScaled(copy.deepcopy(model), update_interval=3,
                              verbose=False)
    chainer.serializers.load_npz(path, from_file)
    assert from_file.iteration == 2 and from_file._betas == ada._betas

    # resuming uses the cached β on iteration 3 exactly like the original
    for a in (ada, restored, from_file):
        _backward(a, a.model, x, t, 1e-2 * 2 ** -10)
    assert ada.iteration == restored.iteration == from_file.iteration == 3
    assert dict(restored.layer_scales()) == dict(ada.layer_scales()) == \
        dict(from_file.layer_scales())
    assert dict(ada.layer_scales()) != _fresh_betas(model, x, t,
                                                    1e-2 * 2 ** -10)


def test_serialize_empty_cache_round_trip():
    ada = AdaLossScaled(chainer.Chain(), verbose=False)
    target = _serialized(ada)
    other = AdaLossScaled(chainer.Chain(), verbose=False)
    other.iteration = 7
    other._betas = {'x': 2.0}
    other.serialize(chainer.serializers.NpzDeserializer(target))
    assert other.iteration == 0 and other._betas == {}
