"""The single-process N-worker simulator: one worker in FP32 is the plain
updater; the hybrid schedule; bad input before anything runs."""
import numpy
import pytest

import chainer

from ada_loss.communication import CommPolicy
from ada_loss.communication.simulator import (
    SimulatedDataParallelUpdater, split_batch)
from ada_loss.datasets import get_digits
from ada_loss.experiment.optimization import build_optimizer
from ada_loss.models import build_model
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import Classifier
from ada_loss.training.updater import MixedPrecisionUpdater

TRAIN = {'lr': 0.05, 'momentum': 0.9, 'weight_decay': 1e-4}


@pytest.fixture(scope='module')
def data():
    train, _ = get_digits(size=8)
    return [train[i] for i in range(64)]


def model_opt():
    numpy.random.seed(0)
    model = Classifier(build_model('small_cnn', 10, in_channels=1, width=4))
    return model, build_optimizer(model, 'float32', **TRAIN)


def params(model):
    return {n: p.array.copy() for n, p in model.namedparams()}


def run(data, n_workers, policy, steps=3, batch=16, mode='fp32'):
    model, opt = model_opt()
    it = chainer.iterators.SerialIterator(data, batch, shuffle=False)
    scaling = make_loss_scaling(mode, 'float32')
    if n_workers is None:
        up = MixedPrecisionUpdater(it, opt, scaling, mode=mode)
    else:
        up = SimulatedDataParallelUpdater(it, opt, scaling, n_workers,
                                          policy, mode=mode)
    for _ in range(steps):
        up.update()
    return params(model)


def test_one_fp32_worker_is_the_plain_updater(data):
    ref = run(data, None, None)
    sim = run(data, 1, CommPolicy('float32', aps=False))
    assert all(numpy.array_equal(ref[k], sim[k]) for k in ref)


def test_aps_is_invariant_to_a_power_of_two_loss_scale(data):
    """Gradients arrive loss-scaled: in float32 a fixed scale of 2^10 makes
    them exactly 1024x larger, APS's shift absorbs it, and the parameters
    are bit-identical to the unscaled run. Without APS the e4m3 cast of the
    scaled gradients overflows (max 240): NaN weights."""
    aps = CommPolicy('e4m3')
    a = run(data, 4, aps, mode='fp32')
    b = run(data, 4, aps, mode='fixed:1024')
    assert all(numpy.array_equal(a[k], b[k]) for k in a)
    with numpy.errstate(all='ignore'):
        c = run(data, 4, CommPolicy('e4m3', aps=False), mode='fixed:1024',
                steps=1)
    assert not all(numpy.isfinite(v).all() for v in c.values())
    # (the next step's gradients are then non-finite: fixed scaling raises)


def test_hybrid_schedule_is_fp32_first(data):
    """fp32_epochs=1 with 64 examples and batch 16: the first 4 steps are
    FP32 communication; afterwards e3m0 differs."""
    fp32 = CommPolicy('float32', aps=False)
    hybrid = CommPolicy('e3m0', fp32_epochs=1)
    a = run(data, 4, fp32, steps=4)
    b = run(data, 4, hybrid, steps=4)
    assert all(numpy.array_equal(a[k], b[k]) for k in a)
    a = run(data, 4, fp32, steps=5)
    b = run(data, 4, hybrid, steps=5)
    assert not all(numpy.array_equal(a[k], b[k]) for k in a)


def test_bad_input_before_anything_runs(data):
    model, opt = model_opt()
    scaling = make_loss_scaling('fp32')
    it = chainer.iterators.SerialIterator(data, 10, shuffle=False)
    with pytest.raises(ValueError, match='cannot be split into 4 equal'):
        SimulatedDataParallelUpdater(it, opt, scaling, 4, CommPolicy())
    it = chainer.iterators.SerialIterator(data, 12, shuffle=False)
    with pytest.raises(ValueError, match='groups of 4'):
        SimulatedDataParallelUpdater(
            it, opt, scaling, 6,
            CommPolicy('e5m2', order='hierarchical', group_size=4))
    with pytest.raises(ValueError, match='positive integer'):
        SimulatedDataParallelUpdater(it, opt, scaling, 0, CommPolicy())
    with pytest.raises(ValueError, match='unknown floating-point format'):
        CommPolicy('fp7')
    with pytest.raises(ValueError, match='cannot be split into 3 equal'):
        split_batch(list(range(10)), 3)
