"""Overflow in ``adaptive`` mode with MixedPrecisionUpdater: the step is
skipped (FP16 weights and FP32 master copies untouched), counted, and
training goes on with the next clean batch."""
import chainer
import chainer.functions as F
import numpy as np
import pytest

from ada_loss import links as AL
from ada_loss.scaling import NonFiniteGradientError, make_loss_scaling
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, setup_optimizer)


class MLP(chainer.Chain):
    def __init__(self):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = AL.Linear(12, 16)
            self.l2 = AL.Linear(16, 3)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def _setup(mode, batches):
    np.random.seed(0)
    with chainer.using_config('dtype', chainer.mixed16):
        model = Classifier(MLP(), 'mixed16')
    data = [(x, t) for xs, ts in batches for x, t in zip(xs, ts)]
    it = chainer.iterators.SerialIterator(data, len(batches[0][0]),
                                          repeat=False, shuffle=False)
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(lr=0.1), model,
                          'mixed16')
    scaling = make_loss_scaling(mode)
    updater = MixedPrecisionUpdater(it, opt, scaling, mode=mode)
    return model, updater, scaling


def _snapshot(model):
    fp16 = {n: p.array.copy() for n, p in model.namedparams()}
    master = {}
    for n, p in model.namedparams():
        fp32 = getattr(p.update_rule, '_fp32_param', None)
        master[n] = None if fp32 is None else fp32.array.copy()
    return fp16, master


def _batch(rng, n=4):
    return (rng.randn(n, 12).astype(np.float32),
            rng.randint(0, 3, n).astype(np.int32))


def _assert_same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        if a[k] is None or b[k] is None:
            assert a[k] is None and b[k] is None, k
        else:
            assert np.array_equal(a[k], b[k]), k


def _assert_all_changed(a, b):
    for k in a:
        assert not np.array_equal(a[k], b[k]), k


def test_inf_input_skips_step_and_training_continues():
    rng = np.random.RandomState(0)
    clean1, bad, clean2 = _batch(rng), _batch(rng), _batch(rng)
    bad[0][1, 3] = np.inf
    model, updater, scaling = _setup('adaptive', [clean1, bad, clean2])
    assert scaling.recovers

    fp16_0, _ = _snapshot(model)
    updater.update()                       # clean: a real step
    fp16_1, master_1 = _snapshot(model)
    _assert_all_changed(fp16_0, fp16_1)
    assert all(v is not None and v.dtype == np.float32
               for v in master_1.values())
    assert all(v.dtype == np.float16 for k, v in fp16_1.items() if
               k.endswith('/W'))
    assert updater.skipped_steps == 0

    with np.errstate(invalid='ignore'):    # the Inf in the data: NaN
        updater.update()                   # Inf: skipped
    fp16_2, master_2 = _snapshot(model)
    assert updater.skipped_steps == 1
    _assert_same(fp16_1, fp16_2)
    _assert_same(master_1, master_2)
    assert all(p.grad is None for p in model.params())   # cleared
    assert all(np.isfinite(v).all() for v in master_2.values())

    updater.update()                       # clean again: trains
    fp16_3, master_3 = _snapshot(model)
    assert updater.skipped_steps == 1
    _assert_all_changed(master_2, master_3)
    assert all(np.isfinite(v).all() for v in master_3.values())
    assert all(np.isfinite(v).all() for v in fp16_3.values())
    assert scaling.loss_scales()           # the adaptive pass really ran


@pytest.mark.filterwarnings('error::RuntimeWarning')   # expected: silent
@pytest.mark.parametrize('method', ['adaptive', 'dynamic'])
def test_huge_init_scale_overflows_and_is_skipped(method):
    rng = np.random.RandomState(1)
    batches = [_batch(rng) for _ in range(3)]
    mode = '{}:init_scale={}'.format(method, 2 ** 40)
    model, updater, scaling = _setup(mode, batches)
    assert scaling.scale == 2 ** 40
    fp16_0, master_0 = _snapshot(model)
    assert all(v is None for v in master_0.values())
    for i in range(2):
        updater.update()
        assert updater.skipped_steps == i + 1
        fp16, master = _snapshot(model)
        _assert_same(fp16_0, fp16)
        # no update ever ran: no FP32 master copy was even created
        assert all(v is None for v in master.values())


def test_modes_without_recovery_raise():
    rng = np.random.RandomState(2)
    bad = _batch(rng)
    bad[0][0, 0] = np.inf
    model, updater, _ = _setup('none', [bad])
    fp16_0, _ = _snapshot(model)
    with pytest.raises(NonFiniteGradientError), \
            np.errstate(invalid='ignore'):     # the Inf in the data: NaN
        updater.update()
    fp16_1, _ = _snapshot(model)
    _assert_same(fp16_0, fp16_1)
