"""The skip report: which layer overflowed (ada_loss/training/skips.py and
the SkipRecorder extension), on Chainer's Trainer."""
import csv
import os

import chainer
import chainer.functions as F
import chainer.links as L
import numpy as np

import tensorboard_events as TB

from ada_loss import links as AL
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, setup_optimizer)
from ada_loss.training.extensions import SkipRecorder
from ada_loss.training.tensorboard import TensorBoardWriter
from ada_loss.training.skips import backward_order, locate_nonfinite


class ThreeLayers(chainer.Chain):
    def __init__(self):
        super(ThreeLayers, self).__init__()
        with self.init_scope():
            self.a = L.Linear(3, 4)
            self.b = L.Linear(4, 4)
            self.c = L.Linear(4, 2)

    def forward(self, x):
        return self.c(F.relu(self.b(F.relu(self.a(x)))))


def _names(model, leaves):
    by_node = {id(p.node): n for n, p in model.namedparams()}
    return [by_node[id(n)] for n in leaves if id(n) in by_node]


def test_backward_order_is_output_first():
    model = ThreeLayers()
    loss = F.sum(model(np.ones((2, 3), np.float32)))
    order = _names(model, backward_order(loss))
    assert [n.rsplit('/', 1)[0] for n in order][::2] == ['/c', '/b', '/a']
    assert sorted(order) == sorted(n for n, _ in model.namedparams())


def test_locate_names_the_first_nonfinite_parameter_in_backward_order():
    model = ThreeLayers()
    loss = F.sum(model(np.ones((2, 3), np.float32)))
    loss.backward()
    for p in model.params():       # own finite arrays
        p.grad = np.zeros_like(p.array)
    model.a.W.grad[0, 0] = np.inf      # b's is finite, a's is not, c too
    model.c.b.grad[0] = np.nan
    layer, alpha, peak = locate_nonfinite(
        model, loss, lambda p, g: not np.isfinite(g).all(), 8.0)
    assert layer == 'c' and alpha == 8.0 and np.isnan(peak)
    model.c.b.grad[0] = 0
    layer, _, peak = locate_nonfinite(
        model, loss, lambda p, g: not np.isfinite(g).all(), 8.0)
    assert layer == 'a' and peak == np.inf
    model.a.W.grad[0, 0] = 0
    assert locate_nonfinite(model, loss,
                            lambda p, g: not np.isfinite(g).all(),
                            8.0)[0] == ''


class Amplified(chainer.Chain):
    """The backward of ×2^14 overflows FP16 inside an element-wise node."""

    def __init__(self):
        super(Amplified, self).__init__()
        with self.init_scope():
            self.l1 = AL.Linear(6, 8)
            self.l2 = AL.Linear(8, 3)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)) * 2.0 ** 14)


def test_skips_csv_on_the_trainer(tmp_path):
    rng = np.random.RandomState(0)
    np.random.seed(0)
    with chainer.using_config('dtype', chainer.mixed16):
        model = Classifier(Amplified(), 'mixed16')
    data = [(rng.randn(6).astype(np.float32) * 1e-3,
             np.int32(rng.randint(3))) for _ in range(40)]
    it = chainer.iterators.SerialIterator(data, 4, shuffle=False)
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(lr=1e-6), model,
                          'mixed16')
    mode = 'adaptive:init_scale=1024'
    updater = MixedPrecisionUpdater(it, opt, make_loss_scaling(mode),
                                    mode=mode)
    trainer = chainer.training.Trainer(updater, (8, 'iteration'),
                                       out=str(tmp_path))
    trainer.extend(SkipRecorder(echo=False), trigger=(1, 'iteration'))
    trainer.extend(TensorBoardWriter(updater.loss_scaling))
    trainer.run()
    with open(os.path.join(str(tmp_path), 'skips.csv')) as f:
        rows = list(csv.DictReader(f))
    assert updater.skipped_steps == len(rows) >= 1
    assert [int(r['iteration']) for r in rows] == \
        list(range(1, len(rows) + 1))      # the first steps, then clean
    assert {r['layer'] for r in rows} == {'predictor/l1'}
    assert all(float(r['alpha']) > 0 and not np.isfinite(
        float(r['max_abs'])) for r in rows)
    assert dict(updater.skipped_by_layer) == {'predictor/l1': len(rows)}
    # TensorBoard: skipped/<layer> at each skipped step, the running count
    events = TB.scalars(str(tmp_path))['skipped/predictor/l1']
    assert events == [(i, float(i)) for i in range(1, len(rows) + 1)]
