"""Training pieces used by the runs: weight decay on unscaled gradients,
the learning-rate schedule and the stateless triggers."""
import types

import numpy
import pytest

import chainer

from ada_loss.experiment.data import load_datasets
from ada_loss.experiment.config import load
from ada_loss.experiment.studies.classification import Config
from ada_loss.experiment.optimization import build_optimizer
from ada_loss.models import SmallCNN
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import Classifier, MixedPrecisionUpdater, dtype_config
from ada_loss.training.extensions import StepLearningRate
from ada_loss.training.triggers import IntervalOrEnd, StopAt


def one_update(mode, weight_decay, chainer_hook=False):
    cfg = load(Config, raw={'data': {'train_size': 64}})
    train, _ = load_datasets('digits', cfg.data)
    numpy.random.seed(0)
    with dtype_config('mixed16'):
        model = Classifier(SmallCNN(width=4), 'mixed16')
    opt = build_optimizer(model, 'mixed16', cfg.train.lr, cfg.train.momentum,
                          0.0 if chainer_hook else weight_decay)
    if chainer_hook:
        for p in model.params():
            p.update_rule.add_hook(
                chainer.optimizer_hooks.WeightDecay(weight_decay))
    before = {n: p.array.astype(numpy.float64)
              for n, p in model.namedparams()}
    it = chainer.iterators.SerialIterator(train, 32, shuffle=False)
    MixedPrecisionUpdater(it, opt, make_loss_scaling(mode)).update()
    return {n: p.array.astype(numpy.float64) - before[n]
            for n, p in model.namedparams()}


def test_weight_decay_does_not_depend_on_loss_scale():
    """BN's γ (an FP32 parameter in mixed16) gets the same update at loss
    scales 2^7 and 2^15. Chainer's WeightDecay, as an update-rule hook,
    multiplies its rate by the loss scale (here: 1e-2 * 32768)."""
    a = one_update('fixed:128', 1e-2)
    b = one_update('fixed:32768', 1e-2)
    for k in a:
        numpy.testing.assert_allclose(a[k], b[k], rtol=1e-3, atol=1e-6,
                                      err_msg=k)
    wrong = one_update('fixed:32768', 1e-2, chainer_hook=True)
    gamma = '/predictor/bn1/gamma'
    assert numpy.abs(wrong[gamma] - b[gamma]).max() > 10 * numpy.abs(
        b[gamma]).max()


def test_step_learning_rate():
    s = StepLearningRate(0.1, steps=[81, 122], decay=0.1,
                         warmup_iterations=400, warmup_lr=0.01)
    assert s.value(0, 0.0) == 0.01 and s.value(399, 1.0) == 0.01
    assert s.value(400, 1.1) == 0.1
    assert s.value(10 ** 5, 80.99) == 0.1
    assert s.value(10 ** 5, 81.0) == pytest.approx(0.01)
    assert s.value(10 ** 5, 130.0) == pytest.approx(0.001)


def fake_trainer(iteration, epoch_detail, previous):
    updater = types.SimpleNamespace(iteration=iteration,
                                    epoch_detail=epoch_detail,
                                    previous_epoch_detail=previous)
    return types.SimpleNamespace(updater=updater)


def test_triggers_are_stateless():
    stop = StopAt(epochs=2)
    assert not stop(fake_trainer(10, 1.9, 1.8))
    assert stop(fake_trainer(11, 2.05, 1.9))
    assert stop(fake_trainer(11, 2.05, 1.9))    # again: no hidden state
    assert StopAt(epochs=2, iterations=4)(fake_trainer(4, 0.1, 0.05))
    assert StopAt(iterations=4).get_training_length() == (4, 'iteration')
    every = IntervalOrEnd(1, 'epoch', stop)
    assert every(fake_trainer(5, 1.02, 0.98))
    assert not every(fake_trainer(6, 1.2, 1.02))
    assert every(fake_trainer(11, 2.05, 1.9))
    it3 = IntervalOrEnd(3, 'iteration', StopAt(iterations=7))
    assert [i for i in range(1, 8) if it3(fake_trainer(i, 0, 0))] == \
        [3, 6, 7]
