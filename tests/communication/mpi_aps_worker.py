"""Run under ``mpiexec -n P`` by test_mpi_simulator.py: trains a few steps
with the APS ChainerMN communicator, then (rank 0) the same steps with the
single-process simulator of P workers, and prints one ``RESULT`` JSON line.
Arguments: the case names (default: all).

Each case: (loss-scaling mode, precision, CommPolicy options). Rank r's
iterator yields shard r of every global batch, which is what the simulator
cuts from the global batch. A case name prefixed ``wire:`` runs the
communicator in wire mode (codes on the wire). Every shard's loss of every
step is recorded on both sides and compared too.
"""
import json
import sys

import numpy

import chainer
import chainermn
from mpi4py import MPI

from ada_loss.communication import CommPolicy
from ada_loss.communication.communicator import APSDistributedUpdater
from ada_loss.communication.simulator import SimulatedDataParallelUpdater
from ada_loss.datasets import get_digits
from ada_loss.experiment.optimization import build_optimizer
from ada_loss.models import build_model
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import Classifier, dtype_config
from ada_loss.training.distributed import prime_multi_node_optimizer

TRAIN = {'lr': 0.05, 'momentum': 0.9, 'weight_decay': 1e-4}
PER_RANK, STEPS = 8, 4
CASES = {
    'adaptive_e5m2_kahan': ('adaptive', 'mixed16', 'plain_cnn',
                            dict(fmt='e5m2', kahan=True)),
    'fixed_e4m3_noaps': ('fixed:128', 'mixed16', 'small_cnn',
                         dict(fmt='e4m3', aps=False)),
    'fp32_e3m0_hier_fc32': ('fp32', 'float32', 'small_cnn',
                            dict(fmt='e3m0', order='hierarchical',
                                 group_size=2, fp32_layers=['*/fc/*'])),
    'dynamic_e4m3_hier_kahan': ('dynamic:init_scale=1024', 'mixed16',
                                'small_cnn',
                                dict(fmt='e4m3', order='hierarchical',
                                     group_size=2, kahan=True)),
    # hybrid: FP32 for the first half epoch (2 steps), then 4-bit FP4
    'hybrid_fp4_e2m1': ('fp32', 'float32', 'small_cnn',
                        dict(fmt='fp4_e2m1', fp32_epochs=0.5)),
}


class LossRecorder(object):
    """The model as a loss function that keeps every loss it returns."""

    def __init__(self, model):
        self.model = model
        self.losses = []

    def __call__(self, *args):
        loss = self.model(*args)
        self.losses.append(float(loss.array))
        return loss


def make_model(name, precision):
    numpy.random.seed(0)
    with dtype_config(precision):
        return Classifier(build_model(name, 10, in_channels=1, width=8),
                          precision)


def params(model):
    out = {}
    for name, p in sorted(model.namedparams()):
        out[name] = p.array.copy()
        rule = p.update_rule
        if rule is not None and getattr(rule, '_fp32_param', None) is not None:
            out[name + '@master'] = rule._fp32_param.array.copy()
    return out


def scaling_for(mode):
    s = make_loss_scaling(mode)
    if mode.startswith('adaptive'):
        s.bind = lambda m, f=s.bind: f(m, verbose=False)
    return s


def run_case(comm, train, mode, precision, model_name, options,
             wire=False):
    n = comm.size
    policy = CommPolicy(**options)
    total = PER_RANK * n * STEPS
    mine = [train[g * PER_RANK * n + comm.rank * PER_RANK + i]
            for g in range(STEPS) for i in range(PER_RANK)]
    model = make_model(model_name, precision)
    opt = build_optimizer(model, precision, comm=comm, aps_policy=policy,
                          wire=wire, **TRAIN)
    it = chainer.iterators.SerialIterator(mine, PER_RANK, shuffle=False)
    recorder = LossRecorder(model)
    up = APSDistributedUpdater(it, opt, scaling_for(mode), comm, mode=mode,
                               loss_func=recorder)
    prime_multi_node_optimizer(opt, comm)
    for _ in range(STEPS):
        up.update()
    gathered = comm.mpi_comm.gather(params(model), root=0)
    rank_losses = comm.mpi_comm.gather(recorder.losses, root=0)
    if comm.rank != 0:
        return None

    def simulate(pol):
        sim_model = make_model(model_name, precision)
        sim_opt = build_optimizer(sim_model, precision, **TRAIN)
        sim_it = chainer.iterators.SerialIterator(
            [train[i] for i in range(total)], PER_RANK * n, shuffle=False)
        sim_rec = LossRecorder(sim_model)
        sim = SimulatedDataParallelUpdater(sim_it, sim_opt, scaling_for(mode),
                                           n, pol, mode=mode,
                                           loss_func=sim_rec)
        for _ in range(STEPS):
            sim.update()
        return params(sim_model), sim.skipped_steps, sim_rec.losses

    sim, skipped, sim_losses = simulate(policy)
    fp32, _, _ = simulate(CommPolicy('float32', aps=False))
    # the simulator runs the shards of a step in rank order
    mpi_losses = [rank_losses[r][t] for t in range(STEPS) for r in range(n)]

    def maxdiff(a, b):
        return max(float(numpy.abs(a[k].astype(numpy.float64) - b[k]).max())
                   for k in a)
    return {'ranks': n,
            'ranks_identical': all(numpy.array_equal(gathered[0][k],
                                                     gathered[r][k])
                                   for r in range(1, n) for k in gathered[0]),
            'sim_identical': all(numpy.array_equal(sim[k], gathered[r][k])
                                 for r in range(n) for k in sim),
            'keys': len(sim), 'sim_vs_mpi': maxdiff(sim, gathered[0]),
            'lowp_vs_fp32': maxdiff(sim, fp32), 'skipped': skipped,
            'losses': len(sim_losses),
            'losses_equal': sim_losses == mpi_losses,
            'wire': wire,
            'iterations': up.iteration}


def main():
    comm = chainermn.create_communicator('naive')
    train, _ = get_digits(size=16)
    out = {}
    for name in (sys.argv[1:] or sorted(CASES)):
        wire = name.startswith('wire:')
        out[name] = run_case(comm, train, *CASES[name[5:] if wire else name],
                             wire=wire)
    if comm.rank == 0:
        print('RESULT ' + json.dumps(out))
    MPI.COMM_WORLD.Barrier()


if __name__ == '__main__':
    main()
