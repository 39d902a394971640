"""Run under ``mpiexec -n 2`` by test_distributed.py; prints one JSON line
(rank 0) with what the test asserts.

Scenarios (argv[1]):

* ``identical``: mixed16 training with the distributed updater, scattered
  data, modes fixed:128 / dynamic / adaptive; reports the largest difference
  between the ranks' parameters and FP32 master weights after a few steps,
  and whether the ranks' local per-layer α ever differed (adaptive).
* ``reference``: float32 adaptive on a BN-free network, each rank holding
  half of a batch; compares with one process training on the whole batch in
  fp32 (the mean of the two half-batch gradients is the full-batch
  gradient). Also runs ChainerMN's plain averaging of the scaled gradients
  (no α sync) to show the comparison would catch it.
"""
import json
import sys

import numpy

import chainer
import chainermn
from mpi4py import MPI

from ada_loss.datasets import get_digits
from ada_loss.models import build_model
from ada_loss.experiment.optimization import build_optimizer
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import Classifier, dtype_config
from ada_loss.training.distributed import (
    DistributedMixedPrecisionUpdater, prime_multi_node_optimizer)
from ada_loss.training.updater import MixedPrecisionUpdater

TRAIN = {'lr': 0.05, 'momentum': 0.9, 'weight_decay': 1e-4}


def make_model(name, dtype, seed, **kw):
    numpy.random.seed(seed)
    with dtype_config(dtype):
        return Classifier(build_model(name, 10, in_channels=1, **kw), dtype)


def local_scales(model):
    return numpy.array([p._loss_scale or 1.0
                        for _, p in sorted(model.namedparams())])


def params(model, master=False):
    out = {}
    for name, p in sorted(model.namedparams()):
        rule = p.update_rule
        if master and rule is not None and rule._fp32_param is not None:
            out[name] = rule._fp32_param.array.copy()
        else:
            out[name] = p.array.astype(numpy.float64)
    return out


def identical(comm):
    train, _ = get_digits(size=16)
    result = {}
    for mode in ('fixed:128', 'dynamic:init_scale=65536', 'adaptive'):
        # no batch normalization: gradients shrink towards the input, so
        # adaptive β > 1 and the ranks' α can differ
        model = make_model('plain_cnn', 'mixed16', seed=comm.rank, depth=6,
                           width=8)
        opt = build_optimizer(model, 'mixed16', comm=comm, **TRAIN)
        data = chainermn.scatter_dataset(train, comm, shuffle=True, seed=0)
        it = chainer.iterators.SerialIterator(data, 16)
        scaling = make_loss_scaling(mode)
        if mode == 'adaptive':
            scaling.bind = lambda m, f=scaling.bind: f(m, verbose=False)
        up = DistributedMixedPrecisionUpdater(it, opt, scaling, comm,
                                              mode=mode)
        prime_multi_node_optimizer(opt, comm)
        differed = False
        # observe the local α just before ChainerMN's mean (which runs in
        # _MultiNodeOptimizer.update, before actual_optimizer.update)
        comm_mean = opt.communicator.multi_node_mean_grad

        def mean(model_, zero_fill=False):
            nonlocal differed
            scales = comm.mpi_comm.allgather(local_scales(model_))
            differed |= not numpy.array_equal(scales[0], scales[1])
            return comm_mean(model_, zero_fill)
        opt.communicator.multi_node_mean_grad = mean
        for _ in range(4):
            up.update()
        mine = (params(model), params(model, master=True))
        theirs = comm.mpi_comm.gather(mine, root=0)
        if comm.rank == 0:
            diff = max(float(numpy.abs(a[k] - b[k]).max())
                       for a, b in zip(theirs[0], theirs[1]) for k in a)
            result[mode] = {'max_diff': diff, 'alpha_differed': differed,
                            'skipped': up.skipped_steps,
                            'iterations': up.iteration}
    return result


def _batches(train, steps, per_rank, rank=None):
    for s in range(steps):
        lo = s * 2 * per_rank
        if rank is None:
            idx = range(lo, lo + 2 * per_rank)
        else:
            idx = range(lo + rank * per_rank, lo + (rank + 1) * per_rank)
        yield chainer.dataset.concat_examples([train[i] for i in idx])


def _train_ranks(comm, train, steps, per_rank, sync):
    model = make_model('plain_cnn', 'float32', seed=0, depth=8, width=8)
    train_cfg = dict(TRAIN)
    if sync:
        opt = build_optimizer(model, 'float32', comm=comm, **train_cfg)
    else:   # ChainerMN as is: averages the scaled gradients
        opt = chainermn.create_multi_node_optimizer(
            chainer.optimizers.MomentumSGD(TRAIN['lr'], TRAIN['momentum']),
            comm)
        opt.setup(model)
        from ada_loss.training.hooks import add_weight_decay
        add_weight_decay(model, TRAIN['weight_decay'])
    prime_multi_node_optimizer(opt, comm)
    scaling = make_loss_scaling('adaptive')
    scaling.bind(model, verbose=False)
    differed = False
    for x, t in _batches(train, steps, per_rank, comm.rank):
        model.cleargrads()
        scaling.backward(model(x, t))
        scales = comm.mpi_comm.allgather(local_scales(model))
        differed |= not numpy.array_equal(scales[0], scales[1])
        opt.update()
    return params(model), differed


def reference(comm):
    train, _ = get_digits(size=16)
    steps, per_rank = 3, 16
    synced, differed = _train_ranks(comm, train, steps, per_rank, sync=True)
    naive, _ = _train_ranks(comm, train, steps, per_rank, sync=False)
    gathered = comm.mpi_comm.gather(synced, root=0)
    if comm.rank != 0:
        return None
    model = make_model('plain_cnn', 'float32', seed=0, depth=8, width=8)
    opt = build_optimizer(model, 'float32', **TRAIN)
    it = iter(_batches(train, steps, per_rank))
    up = MixedPrecisionUpdater(chainer.iterators.SerialIterator([0], 1),
                               opt, make_loss_scaling('fp32'), mode='fp32')
    for x, t in it:
        model.cleargrads()
        up.loss_scaling.backward(model(x, t))
        opt.update()
    ref = params(model)

    def rel(a):
        return max(float(numpy.abs(a[k] - ref[k]).max() /
                         (numpy.abs(ref[k]).max() + 1e-30)) for k in ref)
    return {'synced_vs_ref': rel(synced), 'naive_vs_ref': rel(naive),
            'ranks_diff': max(float(numpy.abs(gathered[0][k] -
                                              gathered[1][k]).max())
                              for k in ref),
            'alpha_differed': differed}


def unit(comm):
    """Per-rank α of 2^10 and 2^11 for the same FP16 parameter: the synced
    mean, unscaled, must be the mean of the unscaled gradients; ChainerMN's
    plain mean of the scaled arrays is not."""
    from ada_loss.training.distributed import sync_loss_scales_and_mean
    rng = numpy.random.RandomState(0)
    grads = [rng.uniform(-1, 1, (64,)).astype(numpy.float16) for _ in
             range(2)]
    alpha = [1024.0, 2048.0][comm.rank]
    expected = (grads[0].astype(numpy.float64) + grads[1]) / 2

    def model_with_grad():
        model = chainer.Chain()
        with model.init_scope():
            model.w = chainer.Parameter(numpy.zeros(64, numpy.float16))
            model.unused = chainer.Parameter(numpy.zeros(3, numpy.float16))
        model.w.grad = (grads[comm.rank].astype(numpy.float32)
                        * alpha).astype(numpy.float16)
        model.w._loss_scale = alpha
        return model
    model = model_with_grad()
    common = sync_loss_scales_and_mean(model, comm.mpi_comm)
    synced = model.w.grad.astype(numpy.float64) / model.w._loss_scale
    naive_model = model_with_grad()
    comm.multi_node_mean_grad(naive_model)
    naive = naive_model.w.grad.astype(numpy.float64) / alpha
    out = {'common': [float(c) for c in common],
           'loss_scale': model.w._loss_scale,
           'unused_grad_zero': bool((model.unused.grad == 0).all()),
           'synced_err': float(numpy.abs(synced - expected).max()),
           'naive_err': float(numpy.abs(naive - expected).max()),
           'dtype': str(model.w.grad.dtype)}
    return comm.mpi_comm.gather(out, root=0)


def main():
    comm = chainermn.create_communicator('naive')
    assert comm.size == 2, 'run with mpiexec -n 2'
    out = {'identical': identical, 'reference': reference,
           'unit': unit}[sys.argv[1]](comm)
    if comm.rank == 0:
        print('RESULT ' + json.dumps(out))
    MPI.COMM_WORLD.Barrier()


if __name__ == '__main__':
    main()
