"""``init_scale='format'``, ``adaptive``'s default since issue 47 item 5
(the pre-registered test, docs/depth_study.md): α_{N+1} follows the amax
rule where the loss gradient's format cannot hold 1/B as a normal number,
else stays 1. Where it stays 1 the run must be bit-identical to the paper's
constant α_{N+1} = 1 (``init_scale=1``, the default before); in E4M3 at
B = 128 bit-identical to ``init_scale=amax``. ``init_scale=1`` keeps the
constant path; a snapshot of a constant-α_{N+1} run resumes under the new
default only where the two agree."""
import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np
import pytest

import ada_loss
from ada_loss.adaptive.ada_loss_scaled import format_rule
from ada_loss.formats import get_format
from ada_loss.training import (Classifier, MixedPrecisionUpdater,
                               dtype_config, setup_optimizer)


@pytest.mark.parametrize('fmt, rows, rule', [
    ('float8_e4m3fn', 128, 'amax'),     # 2^-6 > 2^-7: all subnormal at α = 1
    ('float8_e4m3fn', 64, None),        # 1/64 = 2^-6 is normal
    ('float8_e4m3fn', 768, 'amax'),     # the GPT's 12 × 64 tokens
    ('float16', 128, None), ('float16', 16384, None),
    # FP16's range or more: always α_{N+1} = 1 (a dense head's rows)
    ('float16', 32768, None), ('float8_e5m2', 2 ** 20, None),
    ('float8_e5m2', 128, None), ('bfloat16', 10 ** 6, None),
    ('fp6_e3m2', 4, None), ('fp6_e3m2', 8, 'amax'),    # normal from 2^-2
    ('float8_e4m3fn', 0, None)])
def test_format_rule_from_the_smallest_normal(fmt, rows, rule):
    assert format_rule(get_format(fmt), rows) == rule


class MLP(chainer.Chain):
    def __init__(self):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = L.Linear(12, 16)
            self.l2 = L.Linear(16, 10)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def _train(precision, mode, batchsize, steps=6):
    np.random.seed(0)
    with dtype_config(precision):
        model = Classifier(MLP(), precision)
    rng = np.random.RandomState(1)
    n = batchsize * steps
    data = list(zip(rng.randn(n, 12).astype(np.float32),
                    rng.randint(10, size=n).astype(np.int32)))
    it = chainer.iterators.SerialIterator(data, batchsize, shuffle=False)
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), model,
                          precision)
    scaling = ada_loss.make_loss_scaling(mode, precision)
    updater = MixedPrecisionUpdater(it, opt, scaling, mode=mode)
    alphas = []
    for _ in range(steps):
        updater.update()
        alphas.append(scaling.scale)
    return {name: p.array.copy() for name, p in model.namedparams()}, alphas


def _same(a, b):
    assert a[1] == b[1]
    for k in a[0]:
        assert a[0][k].tobytes() == b[0][k].tobytes(), k


@pytest.mark.parametrize('precision', [
    'mixed16', 'bf16', 'fp8:recipe=current,grad=loss'])
def test_format_rule_leaves_fp16_and_e5m2_gradients_bit_identical(precision):
    """FP16 (mixed16), BF16 and the hybrid's E5M2 gradients hold 1/128 as
    a normal number: the default changes nothing there, to the bit
    (docs/depth_study.md's registration names all three)."""
    constant = _train(precision, 'adaptive:init_scale=1', 128)
    assert set(constant[1]) == {1.0}
    _same(_train(precision, 'adaptive:init_scale=format', 128), constant)
    _same(_train(precision, 'adaptive', 128), constant)


def test_format_rule_is_amax_in_e4m3_at_batch_128():
    precision = 'fp8_e4m3:recipe=current,grad=loss'
    amax = _train(precision, 'adaptive:init_scale=amax', 128)
    assert max(amax[1]) > 1.0          # it did scale the loss gradient
    _same(_train(precision, 'adaptive:init_scale=format', 128), amax)
    _same(_train(precision, 'adaptive', 128), amax)     # the default
    # at B = 64, 1/B is E4M3's smallest normal: α_{N+1} = 1, the constant
    constant = _train(precision, 'adaptive:init_scale=1', 64)
    assert set(constant[1]) == {1.0}
    _same(_train(precision, 'adaptive', 64), constant)


class _PixelHead(chainer.Chain):
    """A 1×1 convolution head whose loss gradient has N·H·W rows (a
    per-pixel or per-anchor loss: SSD's heads), with a loss summed over the
    pixels and divided by a count that is not their number (SSD divides by
    its positive matches)."""

    def __init__(self):
        super(_PixelHead, self).__init__()
        with self.init_scope():
            self.c = ada_loss.links.Convolution2D(2, 4, 1)

    def forward(self, x, t):
        y = self.c(x.astype(self.c.W.dtype))
        return F.sum(F.softmax_cross_entropy(y, t, reduce='no')) / 100.0


def _train_head(mode, n, side, precision='mixed16', steps=2):
    np.random.seed(0)
    with dtype_config(precision):
        model = _PixelHead()
    rng = np.random.RandomState(0)
    data = [(rng.randn(2, side, side).astype(np.float32),
             rng.randint(4, size=(side, side)).astype(np.int32))
            for _ in range(n * steps)]
    it = chainer.iterators.SerialIterator(data, n, shuffle=False)
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(lr=0.01), model,
                          precision)
    scaling = ada_loss.make_loss_scaling(mode, precision)
    updater = MixedPrecisionUpdater(it, opt, scaling, mode=mode,
                                    loss_func=model)
    alphas = []
    for _ in range(steps):
        updater.update()
        alphas.append(scaling.scale)
    return {name: p.array.copy() for name, p in model.namedparams()}, alphas


def test_format_rule_leaves_fp16_bit_identical_at_a_dense_heads_rows():
    """FP16 at 8 × 64 × 64 = 2^15 rows (SSD512's first head at batch 8,
    configs/table3_ssd.yaml), where 1/rows is below FP16's smallest normal
    but this loss, divided by a count and not by the rows, has a loss
    gradient FP16 holds as normal numbers: the rule leaves formats of FP16's
    range at α_{N+1} = 1, so the run is the constant α_{N+1} = 1's to the bit (a review
    of issue 47 found the first version of the rule took amax here)."""
    constant = _train_head('adaptive:init_scale=1', 8, 64)
    assert set(constant[1]) == {1.0}
    _same(_train_head('adaptive:init_scale=format', 8, 64), constant)
    _same(_train_head('adaptive', 8, 64), constant)
    _same(_train_head('adaptive:init_scale=format', 8, 32),
          _train_head('adaptive:init_scale=1', 8, 32))


@pytest.mark.parametrize('precision', [
    'fp8_e4m3:recipe=current', 'mxfp8', 'nvfp4', 'fp8:recipe=blockwise'])
def test_scaled_casts_absorb_the_default_alpha(precision):
    """In a scaled precision without ``grad=loss`` the default does scale
    the loss gradient (E4M3 / E2M1 cannot hold 1/128 as a normal number),
    but the recipe's per-tensor or per-block cast of each gradient takes a
    power of two through exactly: the run equals ``init_scale=1`` to the
    bit. (Not so with ``recipe=delayed``: its amax history mixes the steps'
    α_{N+1}, docs/modes.md.)"""
    default = _train(precision, 'adaptive', 128)
    assert max(default[1]) > 1.0
    constant = _train(precision, 'adaptive:init_scale=1', 128)
    for k in default[0]:
        assert default[0][k].tobytes() == constant[0][k].tobytes(), k


def test_init_scale_1_is_the_papers_constant_in_e4m3():
    """``adaptive:init_scale=1`` (the default before issue 47): α_{N+1}
    stays 1 in E4M3 at B = 128, where the default scales the loss gradient,
    and the run is bit-identical to AdaLossScaled(init_scale=1.0) driven
    by hand (the constant path: no rule, nothing measured)."""
    precision = 'fp8_e4m3:recipe=current,grad=loss'
    constant = _train(precision, 'adaptive:init_scale=1', 128)
    assert set(constant[1]) == {1.0}
    default = _train(precision, 'adaptive', 128)
    assert max(default[1]) > 1.0
    assert any(constant[0][k].tobytes() != default[0][k].tobytes()
               for k in constant[0])
    scaling = ada_loss.make_loss_scaling('adaptive:init_scale=1', precision)
    assert scaling.options['init_scale'] == 1.0
    np.random.seed(0)
    with dtype_config(precision):
        model = Classifier(MLP(), precision)
    ada = ada_loss.AdaLossScaled(model, init_scale=1.0, fmt=scaling.fmt,
                                 verbose=False)
    assert ada.init_rule is None and not ada.auto_init
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), model,
                          precision)
    rng = np.random.RandomState(1)
    x = rng.randn(128 * 6, 12).astype(np.float32)
    t = rng.randint(10, size=128 * 6).astype(np.int32)
    for i in range(6):
        model.cleargrads()
        sl = slice(128 * i, 128 * (i + 1))
        with dtype_config(precision):
            ada.backward(model(x[sl], t[sl]))
        assert ada.init_scale == 1.0
        opt.update()
    _same(({k: p.array.copy() for k, p in model.namedparams()},
           constant[1]), constant)


def test_a_constant_snapshot_resumes_under_format_only_where_equal():
    """A snapshot of a run with the constant α_{N+1} (no ``init_scale``
    key: ``adaptive`` before issue 47) loads under the new default; where
    the rule keeps α_{N+1} = 1 (FP16) training goes on, where it would
    switch to amax (E4M3 at B = 128) the first backward refuses and names
    ``init_scale=1``."""
    for fmt, refused in (('float16', False), ('float8_e4m3fn', True)):
        old = ada_loss.AdaLossScaled(MLP(), init_scale=1.0, fmt=fmt,
                                     verbose=False)
        target = {}
        chainer.serializers.DictionarySerializer(target).save(old)
        assert 'init_scale' not in target
        new = ada_loss.AdaLossScaled(MLP(), fmt=fmt, verbose=False)
        assert new.init_rule == 'format'
        chainer.serializers.NpzDeserializer(target).load(new)
        x = np.random.RandomState(0).randn(128, 12).astype(np.float32)
        t = np.zeros(128, np.int32)
        loss = F.softmax_cross_entropy(new.model(x), t)
        if refused:
            with pytest.raises(ValueError, match='init_scale=1'):
                new.backward(loss)
        else:
            new.backward(loss)
            assert new.init_scale == 1.0
        # the new default writes α_{N+1} into its snapshots
        saved = {}
        chainer.serializers.DictionarySerializer(saved).save(
            ada_loss.AdaLossScaled(MLP(), fmt=fmt, verbose=False))
        assert 'init_scale' in saved
