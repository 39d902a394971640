"""Small shared helpers of the training/scaling tests (tiny real models on
scikit-learn's digits; no mocks)."""
import functools

import numpy

import chainer
import chainer.functions as F

from ada_loss import links as AL
from ada_loss.datasets import get_digits
from ada_loss.models import SmallCNN
from ada_loss.scaling import make_loss_scaling, resolve_precision
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, dtype_config, setup_optimizer)


@functools.lru_cache(maxsize=None)
def _digits(size):
    return get_digits(size=size)


def digits_subset(n, size=16):
    """A fresh (mutable) dataset with the first ``n`` training digits."""
    train, _ = _digits(size)
    from ada_loss.datasets.image_label_dataset import ImageLabelDataset
    return ImageLabelDataset(train.images[:n].copy(), train.labels[:n].copy())


def digits_split(size=16):
    return _digits(size)


class MLP(chainer.Chain):
    """Linear - ReLU - Linear on flattened 8x8 digits (no BN: no state is
    touched by a non-finite forward)."""

    def __init__(self, n_in=64, n_hidden=16, n_out=10):
        super(MLP, self).__init__()
        with self.init_scope():
            self.l1 = AL.Linear(n_in, n_hidden)
            self.l2 = AL.Linear(n_hidden, n_out)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def build(mode, predictor_fn, dtype=None, optimizer=None, batch=16,
          dataset=None, seed=0, hooks=()):
    """Parses ``mode`` first, then builds model, optimizer and updater.

    Returns (updater, model, scaling, dataset).
    """
    dtype = resolve_precision(mode, dtype)
    scaling = make_loss_scaling(mode, dtype)
    numpy.random.seed(seed)
    with dtype_config(dtype):
        model = Classifier(predictor_fn(), dtype)
    optimizer = optimizer or chainer.optimizers.MomentumSGD(0.05)
    setup_optimizer(optimizer, model, dtype)
    for hook in hooks:
        optimizer.add_hook(hook)
    if dataset is None:
        dataset = digits_subset(batch, size=8)
    it = chainer.iterators.SerialIterator(dataset, batch, shuffle=False)
    updater = MixedPrecisionUpdater(it, optimizer, scaling, mode=mode)
    return updater, model, scaling, dataset


def step(updater, model):
    """One update; returns the reported observation (floats)."""
    obs = {}
    reporter = chainer.reporter.Reporter()
    reporter.add_observer('main', model)
    with reporter.scope(obs):
        with chainer.using_config('train', True):
            updater.update()
    return {k: float(getattr(v, 'array', v)) for k, v in obs.items()}


def snapshot(model, optimizer):
    """Copies of every parameter, FP32 master, optimizer state and t."""
    snap = {}
    for name, p in model.namedparams():
        rule = p.update_rule
        master = getattr(rule, '_fp32_param', None)
        snap[name] = dict(
            array=p.array.copy(),
            master=None if master is None or master.array is None
            else master.array.copy(),
            state={k: v.copy() for k, v in (rule.state or {}).items()},
            t=rule.t)
    snap['__t__'] = optimizer.t
    return snap


def assert_snapshot_equal(a, b):
    assert a.keys() == b.keys()
    assert a['__t__'] == b['__t__']
    for name in a:
        if name == '__t__':
            continue
        x, y = a[name], b[name]
        numpy.testing.assert_array_equal(x['array'], y['array'], err_msg=name)
        assert (x['master'] is None) == (y['master'] is None), name
        if x['master'] is not None:
            numpy.testing.assert_array_equal(x['master'], y['master'],
                                             err_msg=name)
        assert x['state'].keys() == y['state'].keys(), name
        for k in x['state']:
            numpy.testing.assert_array_equal(x['state'][k], y['state'][k],
                                             err_msg='{} {}'.format(name, k))
        assert x['t'] == y['t'], name


def small_cnn(width=4):
    return lambda: SmallCNN(10, 1, width=width)
