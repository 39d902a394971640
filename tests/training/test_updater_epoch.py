"""``optimizer.epoch`` under MixedPrecisionUpdater (ada_loss/training/
updater.py) advances as under Chainer's ``StandardUpdater``: one
``new_epoch(auto=True)`` each time the iterator starts a new epoch, skipped
steps included, none with ``auto_new_epoch=False``; and a snapshot restores
it."""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import chainer
import chainer.links as L
from chainer import training
from chainer.training import updaters

from ada_loss.scaling import make_loss_scaling
from ada_loss.training import MixedPrecisionUpdater
from ada_loss.training.snapshot import load_with_fallback, write_snapshot

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')

N_EXAMPLES = 5      # batch 2: epochs end inside a batch, as in real runs
BATCH = 2


def _dataset(inf_at=()):
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (N_EXAMPLES, 3)).astype(np.float32)
    for i in inf_at:
        x[i, 0] = np.inf
    t = rng.randint(0, 2, N_EXAMPLES).astype(np.int32)
    return chainer.datasets.TupleDataset(x, t)


def _model():
    predictor = L.Linear(3, 2, initialW=np.full((2, 3), 0.1, np.float32))
    return L.Classifier(predictor)


def _optimizer(model):
    opt = chainer.optimizers.MomentumSGD(0.01)
    opt.setup(model)
    return opt


def _iterator(dataset):
    return chainer.iterators.SerialIterator(dataset, BATCH, shuffle=False)


def _mixed(mode, dataset=None, **kwargs):
    opt = _optimizer(_model())
    up = MixedPrecisionUpdater(_iterator(dataset or _dataset()), opt,
                               make_loss_scaling(mode), mode=mode, **kwargs)
    return up, opt


def _standard(dataset=None, **kwargs):
    opt = _optimizer(_model())
    up = updaters.StandardUpdater(_iterator(dataset or _dataset()), opt,
                                  **kwargs)
    return up, opt


def _epochs(updater, optimizer, n):
    """optimizer.epoch after each of n updates."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')     # Inf inputs overflow on purpose
        for _ in range(n):
            updater.update()
            out.append(optimizer.epoch)
    return out


@pytest.mark.parametrize('mode', ['fp32', 'fixed:8', 'dynamic',
                                  'adaptive'])
def test_epoch_advances_as_in_standard_updater(mode):
    up, opt = _mixed(mode)
    ref_up, ref_opt = _standard()
    trace = _epochs(up, opt, 9)
    ref = _epochs(ref_up, ref_opt, 9)
    assert ref == [0, 0, 1, 1, 2, 2, 2, 3, 3]     # Chainer's own count
    assert trace == ref
    assert opt.use_auto_new_epoch


def test_skipped_steps_still_count_epochs():
    """Chainer counts epochs of the iterator, not applied updates: a step
    skipped for overflow that ends an epoch still starts the next."""
    data = _dataset(inf_at=(1, 4))      # the steps ending epochs 1 and 2
    up, opt = _mixed('dynamic', data)
    trace = _epochs(up, opt, 6)
    assert up.skipped_steps >= 2
    assert trace == _epochs(*_standard(data), 6)
    assert opt.epoch == 2


def test_auto_new_epoch_false_leaves_the_epoch_to_the_user():
    up, opt = _mixed('fp32', auto_new_epoch=False)
    assert _epochs(up, opt, 6) == [0] * 6
    assert not opt.use_auto_new_epoch
    opt.new_epoch()     # allowed only when the updater does not call it
    assert opt.epoch == 1


_DISTRIBUTED = textwrap.dedent('''
    import json, sys, warnings
    import numpy as np
    import chainer
    sys.path.insert(0, 'tests/training')
    import test_updater_epoch as base
    from ada_loss.scaling import make_loss_scaling
    from ada_loss.training.distributed import (
        DistributedMixedPrecisionUpdater, create_communicator,
        create_multi_node_optimizer, prime_multi_node_optimizer)
    comm = create_communicator('naive')
    opt = create_multi_node_optimizer(
        chainer.optimizers.MomentumSGD(0.01), comm)
    opt.setup(base._model())
    prime_multi_node_optimizer(opt, comm)
    up = DistributedMixedPrecisionUpdater(
        base._iterator(base._dataset()), opt, make_loss_scaling('dynamic'),
        comm)
    print(json.dumps(base._epochs(up, opt, 9)))
''')


def test_distributed_updater_counts_epochs():
    """DistributedMixedPrecisionUpdater (one rank; ChainerMN's naive
    communicator) inherits the count. A child process: MPI starts once per
    process."""
    pytest.importorskip('mpi4py', reason='mpi4py not installed '
                        '(./scripts/install.sh mpi)')
    res = subprocess.run([sys.executable, '-c', _DISTRIBUTED], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
    trace = json.loads(res.stdout.strip().splitlines()[-1])
    assert trace == _epochs(*_standard(), 9)


def _trainer(updater, out, epochs):
    return training.Trainer(updater, (epochs, 'epoch'), out=str(out))


def test_trainer_epochs_and_snapshot_resume(tmp_path):
    """A 3-epoch Trainer run leaves optimizer.epoch at 3 (as Chainer's);
    a run interrupted after 4 iterations and resumed from its snapshot
    reads the epoch back and ends at 3 as well."""
    whole_up, whole_opt = _mixed('dynamic')
    _trainer(whole_up, tmp_path / 'whole', 3).run()
    ref_up, ref_opt = _standard()
    _trainer(ref_up, tmp_path / 'ref', 3).run()
    assert ref_opt.epoch == 3
    assert whole_opt.epoch == 3

    out = tmp_path / 'resumed'
    first_up, first_opt = _mixed('dynamic')
    first = training.Trainer(first_up, (4, 'iteration'), out=str(out))
    first.run()
    assert first_opt.epoch == 1
    write_snapshot(first, str(out))
    with np.load(str(out / 'snapshot_latest')) as npz:
        assert int(npz['updater/optimizer:main/epoch']) == 1

    again_up, again_opt = _mixed('dynamic')
    again = _trainer(again_up, out, 3)
    assert load_with_fallback(again, str(out),
                              log=lambda text: None) == 'snapshot_latest'
    assert again_opt.epoch == 1 and again_up.iteration == 4
    again.run()
    assert again_opt.epoch == 3
    assert again_up.iteration == whole_up.iteration
    np.testing.assert_array_equal(again_opt.target.predictor.W.array,
                                  whole_opt.target.predictor.W.array)
