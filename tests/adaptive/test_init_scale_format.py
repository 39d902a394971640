"""``init_scale='format'`` (issue 47 item 5, the pre-registered candidate
default, docs/depth_study.md): α_{N+1} follows the amax rule where the loss
gradient's format cannot hold 1/B as a normal number, else stays 1. Where it
stays 1 the run must be bit-identical to today's default; in E4M3 at B = 128
bit-identical to ``init_scale=amax``."""
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
    a normal number: the candidate changes nothing there, to the bit
    (docs/depth_study.md's registration names all three)."""
    default = _train(precision, 'adaptive', 128)
    assert set(default[1]) == {1.0}
    _same(_train(precision, 'adaptive:init_scale=format', 128), default)


def test_format_rule_is_amax_in_e4m3_at_batch_128():
    precision = 'fp8_e4m3:recipe=current,grad=loss'
    amax = _train(precision, 'adaptive:init_scale=amax', 128)
    assert max(amax[1]) > 1.0          # it did scale the loss gradient
    _same(_train(precision, 'adaptive:init_scale=format', 128), amax)
    # at B = 64, 1/B is E4M3's smallest normal: the default's α_{N+1} = 1
    _same(_train(precision, 'adaptive:init_scale=format', 64),
          _train(precision, 'adaptive', 64))


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
    range at α_{N+1} = 1, so the run is the default's to the bit (a review
    of issue 47 found the first version of the rule took amax here)."""
    default = _train_head('adaptive', 8, 64)
    assert set(default[1]) == {1.0}
    _same(_train_head('adaptive:init_scale=format', 8, 64), default)
    _same(_train_head('adaptive:init_scale=format', 8, 32),
          _train_head('adaptive', 8, 32))
