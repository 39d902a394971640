#!/usr/bin/env python
"""Overhead of the APS low-precision all-reduce relative to FP32 averaging.

Single process (default): CIFAR ResNet-20 (fp32 compute, random 32x32 RGB
batch of 128 = 8 simulated workers x 16), :class:`SimulatedDataParallelUpdater`
with FP32 communication vs APS in (5, 2) (ring; + Kahan; without APS) and
(4, 3) hierarchical k = 4. Per policy, round-robin: the whole step, and the
reduction alone (loss-scale sync packing + exponents + shift + cast +
emulated sum + unshift, i.e. ``simulated_mean``).

``mpiexec -n 2 python scripts/bench_aps.py --mpi``: each rank holds its
ResNet-20 gradients (batch 16); times ``multi_node_mean_grad`` of the
loss-scale-sync communicator (FP32 Allreduce) vs the APS communicator
(Allreduce of the exponent bytes + Allgather of the payload + emulated sum).

Prints ratios from one run; not a test. The emulated sum is extra work a
real low-precision all-reduce would not do on the host; what it saves on
the network is in experiments/aps_cost.py.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as B  # NOQA: E402

import numpy  # NOQA: E402

import chainer  # NOQA: E402

POLICIES = [('fp32 (FP32 averaging)', dict(fmt='float32', aps=False)),
            ('e5m2 APS ring', dict(fmt='e5m2')),
            ('e5m2 APS ring Kahan', dict(fmt='e5m2', kahan=True)),
            ('e5m2 no APS ring', dict(fmt='e5m2', aps=False)),
            ('e4m3 APS hier. k=4', dict(fmt='e4m3', order='hierarchical',
                                        group_size=4))]


def model_and_data(batch, seed=0):
    from ada_loss.models import build_model
    from ada_loss.training import Classifier
    numpy.random.seed(seed)
    model = Classifier(build_model('resnet20', 10))
    rng = numpy.random.RandomState(seed)
    x = rng.standard_normal((batch, 3, 32, 32)).astype(numpy.float32)
    t = rng.randint(0, 10, size=batch).astype(numpy.int32)
    return model, [(x[i], t[i]) for i in range(batch)]


def single(args):
    from ada_loss.communication import CommPolicy
    from ada_loss.communication import simulator as S
    from ada_loss.experiment.run import build_optimizer
    from ada_loss.scaling import make_loss_scaling
    n, batch = args.workers, args.workers * args.per_worker
    runs = []
    for name, kw in POLICIES:
        model, data = model_and_data(batch)
        opt = build_optimizer(model, 'float32', {'lr': 0.01, 'momentum': 0.9,
                                                 'weight_decay': 1e-4})
        it = chainer.iterators.SerialIterator(data, batch, shuffle=False)
        up = S.SimulatedDataParallelUpdater(
            it, opt, make_loss_scaling('fp32'), n, CommPolicy(**kw),
            mode='fp32')
        runs.append((name, up, {'step': [], 'reduce': []}))
    inner = S.simulated_mean
    last = {}

    def timed_mean(*a, **k):
        t0 = time.perf_counter()
        out = inner(*a, **k)
        last['reduce'] = time.perf_counter() - t0
        return out
    S.simulated_mean = timed_mean
    print('settings: ResNet-20 fp32, {} workers x {} = batch {}, {} timed '
          'steps per policy, round-robin, {} warm-up'.format(
              n, args.per_worker, batch, args.steps, args.warmup))
    for i in range(args.warmup + args.steps):
        for name, up, times in runs:
            t = B.timed(up.update)
            if i >= args.warmup:
                times['step'].append(t)
                times['reduce'].append(last['reduce'])
    S.simulated_mean = inner
    print('\n  {:26s} {:>9s} {:>11s}   reduce times [s]'.format(
        'policy (medians)', 'step [s]', 'reduce [s]'))
    for name, _, t in runs:
        print('  {:26s} {:9.3f} {:11.4f}   {}'.format(
            name, B.median(t['step']), B.median(t['reduce']),
            ' '.join('{:.4f}'.format(x) for x in t['reduce'])))
    base = runs[0][2]
    b_step, b_red = B.median(base['step']), B.median(base['reduce'])
    print('\nratios vs FP32 averaging (medians; "implied" = FP32 step + the '
          'difference in reduction time, robust to load noise):')
    for name, _, t in runs[1:]:
        red = B.median(t['reduce'])
        print('  {:26s} step {:.3f}   implied step {:.4f}   reduction alone '
              '{:.2f}x   reduction share of the step {:.1%}'.format(
                  name, B.median(t['step']) / b_step,
                  (b_step + red - b_red) / b_step, red / b_red,
                  red / B.median(t['step'])))


def mpi(args):
    import chainermn
    from mpi4py import MPI
    from ada_loss.communication import CommPolicy
    from ada_loss.communication.communicator import APSCommunicator
    from ada_loss.training.distributed import LossScaleSyncCommunicator
    comm = chainermn.create_communicator('naive')
    model, data = model_and_data(args.per_worker, seed=comm.rank)
    x, t = chainer.dataset.concat_examples(data)
    model.cleargrads()
    model(x, t).backward()
    saved = {n: p.grad.copy() for n, p in model.namedparams()}
    comms = [('fp32 (FP32 Allreduce)', LossScaleSyncCommunicator(comm))]
    for name, kw in POLICIES[1:]:
        k = kw.get('group_size')
        if k is not None and comm.size % k:     # e.g. 2 ranks: one group
            kw = dict(kw, group_size=comm.size)
            name = name.replace('k={}'.format(k), 'k={}'.format(comm.size))
        comms.append((name, APSCommunicator(comm, CommPolicy(**kw))))
    times = {name: [] for name, _ in comms}
    for i in range(args.warmup + args.repeats):
        for name, c in comms:
            for n, p in model.namedparams():
                p.grad = saved[n].copy()
            comm.mpi_comm.Barrier()
            t = B.timed(lambda: c.multi_node_mean_grad(model))
            t = comm.mpi_comm.allreduce(t, op=MPI.MAX)
            if i >= args.warmup:
                times[name].append(t)
    if comm.rank == 0:
        print('settings: ResNet-20 gradients ({} per rank), {} ranks, {} '
              'repeats, round-robin'.format(args.per_worker, comm.size,
                                            args.repeats))
        base = B.median(times[comms[0][0]])
        for name, _ in comms:
            m = B.median(times[name])
            print('  {:26s} mean_grad {:.4f} s   ratio {:.2f}x   all: {}'
                  .format(name, m, m / base, ' '.join(
                      '{:.4f}'.format(v) for v in times[name])))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--workers', type=int, default=8)
    p.add_argument('--per-worker', type=int, default=16)
    p.add_argument('--steps', type=int, default=3)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--repeats', type=int, default=10, help='--mpi only')
    p.add_argument('--mpi', action='store_true')
    args = p.parse_args()
    if args.mpi:
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 0:
            print('bench_aps (--mpi): APS all-reduce vs FP32 averaging')
            B.print_machine_info()
        mpi(args)
    else:
        print('bench_aps: APS all-reduce vs FP32 averaging, simulated '
              'workers')
        B.print_machine_info()
        single(args)
        print('load avg at end: {}'.format(B.load_average()))


if __name__ == '__main__':
    main()
