"""One training run of a table cell on Chainer's Trainer (paper §4.1).

:func:`run_one` builds the model in the run's dtype (float32 for ``fp32``,
mixed16 otherwise), MomentumSGD with FP32 master weights and a per-parameter
weight-decay hook (it runs inside the update rule, after the gradient is
unscaled in FP32), the loss-scaling method of the mode, and a Trainer with:
Evaluator on the test set (``train=False``), StepLearningRate, LogReport +
``log.csv``, PrintReport / ProgressBar, PlotReport (``loss.png``,
``accuracy.png``), a trainer snapshot ``snapshot_latest`` (autoloaded by
``--resume``), FP32 master weights inside the snapshot and, for
``adaptive``, ``loss_scales.csv``.

A run whose gradients overflow in a mode that cannot skip steps
(:class:`~ada_loss.scaling.NonFiniteGradientError`), or whose final loss is
not finite, ends with status ``diverged`` instead of stopping the grid.
"""
import contextlib
import datetime
import io
import math
import os
import random
import shutil
import sys

import numpy

import chainer
from chainer import training
from chainer.training import extensions as E

from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment.data import dataset_info, load_datasets
from ada_loss.experiment.grid import run_name
from ada_loss.experiment.models import build
from ada_loss.scaling import (NonFiniteGradientError, make_loss_scaling,
                              parse_mode, resolve_dtype)
from ada_loss.training import Classifier, MixedPrecisionUpdater, \
    dtype_config, setup_optimizer
from ada_loss.training import extensions as AE
from ada_loss.training.hooks import add_weight_decay
from ada_loss.training.triggers import IntervalOrEnd, StopAt

PRINT_KEYS = ['epoch', 'iteration', 'main/loss', 'validation/main/loss',
              'main/accuracy', 'validation/main/accuracy', 'lr',
              'loss_scale', 'skipped_steps', 'elapsed_time']


class _Console(object):
    """stdout for PrintReport without its ANSI erase code when not a tty."""

    def write(self, text):
        if not sys.stdout.isatty():
            text = text.replace('\033[J', '')
        sys.stdout.write(text)

    def flush(self):
        sys.stdout.flush()


def run_folder(out_root, cfg, cell):
    return os.path.join(out_root, cfg['table'], run_name(cell))


def run_config(cfg, cell):
    """The resolved config of one run (what ``config.yaml`` holds)."""
    c = C.config_for_model(cfg, cell.model)
    dtype = resolve_dtype(cell.mode, c['train']['dtype'])
    out = {'run': {'model': cell.model, 'dataset': cell.dataset,
                   'mode': cell.mode, 'seed': cell.seed, 'dtype': dtype}}
    out.update((k, v) for k, v in c.items()
               if k not in ('grid', 'per_model'))
    return out


def _now():
    return datetime.datetime.now().isoformat(timespec='seconds')


def build_optimizer(model, dtype, train_cfg, comm=None):
    """MomentumSGD (+ ChainerMN wrapper) with FP32 master weights for
    mixed16 and weight decay as a hook of every parameter's update rule:
    there it sees the gradient after the FP32 unscaling (an optimizer-level
    hook would see the loss-scaled FP16 gradient; Chainer's own WeightDecay
    would multiply its rate by the loss scale there, see
    :mod:`ada_loss.training.hooks`)."""
    opt = chainer.optimizers.MomentumSGD(lr=train_cfg['lr'],
                                         momentum=train_cfg['momentum'])
    if comm is not None:
        from ada_loss.training.distributed import create_multi_node_optimizer
        opt = create_multi_node_optimizer(opt, comm)
    setup_optimizer(opt, model, dtype)
    if train_cfg['weight_decay'] > 0:
        add_weight_decay(model, train_cfg['weight_decay'])
    return opt


def _last(log, key):
    for entry in reversed(log):
        if key in entry:
            return entry[key]
    return None


def _finite(x):
    return x is not None and math.isfinite(x)


def _summarize(info, trainer, updater, scaling, diverged_error):
    tests = trainer.get_extension('TestHistory')
    acc_key, loss_key = 'validation/main/accuracy', 'validation/main/loss'
    train_loss = _last(trainer.get_extension('LogReport').log, 'main/loss')
    test_loss = tests.last(loss_key)
    error = diverged_error
    if error is None and not (_finite(train_loss) and _finite(test_loss)):
        error = 'non-finite loss at the end (train {}, test {})'.format(
            train_loss, test_loss)
    diverged = error is not None
    info.update(
        status=R.DIVERGED if diverged else R.FINISHED,
        final_test_accuracy=None if diverged else tests.last(acc_key),
        best_test_accuracy=None if diverged else tests.best(acc_key),
        last_test_accuracy=tests.last(acc_key),
        final_test_loss=test_loss, final_train_loss=train_loss,
        skipped_steps=updater.skipped_steps, iterations=updater.iteration,
        epoch=updater.epoch_detail, wall_time_s=trainer.elapsed_time,
        loss_scale=scaling.scale, error=error, updated=_now())
    if hasattr(scaling, 'loss_scales') and scaling.loss_scales():
        alphas = list(scaling.loss_scales().values())
        info['alpha_min'], info['alpha_max'] = min(alphas), max(alphas)
    return info


def _add_extensions(trainer, cfg, model, optimizer, scaling, test_iter,
                    comm, resuming, stop):
    """Registers the extensions; writers only on rank 0 (``comm`` None or
    rank 0). Names match on every rank, so a snapshot written by rank 0
    loads everywhere."""
    log_cfg, train_cfg = cfg['log'], cfg['train']
    writer = comm is None or comm.rank == 0

    def every(key):
        n, unit = log_cfg[key]
        return IntervalOrEnd(n, unit, stop)

    evaluator = E.Evaluator(test_iter, model)
    if comm is not None:
        import chainermn
        evaluator = chainermn.create_multi_node_evaluator(evaluator, comm)
    trainer.extend(evaluator, name='validation', trigger=every(
        'eval_interval'))
    trainer.extend(AE.StepLearningRate(
        train_cfg['lr'], train_cfg['lr_steps'], train_cfg['lr_decay'],
        train_cfg['warmup_iterations'], train_cfg['warmup_lr'],
        optimizer=optimizer))
    trainer.extend(E.observe_lr(), trigger=(1, 'iteration'))
    trainer.extend(AE.FP32MasterWeights(optimizer))
    trainer.extend(E.snapshot(filename=R.SNAPSHOT, autoload=resuming),
                   trigger=every('snapshot_interval') if writer
                   else (lambda _: False))
    if not writer:
        return
    trainer.extend(AE.ObservationRecorder(['validation/main/accuracy',
                                           'validation/main/loss']),
                   name='TestHistory')
    trainer.extend(E.LogReport(trigger=every('log_interval')))
    trainer.extend(AE.LogCSV(), trigger=every('log_interval'))
    if log_cfg['progress'] in ('report', 'both'):
        trainer.extend(E.PrintReport(PRINT_KEYS, out=_Console()),
                       trigger=every('log_interval'))
    if log_cfg['progress'] in ('bar', 'both'):
        trainer.extend(E.ProgressBar(update_interval=10))
    if log_cfg['plot'] and E.PlotReport.available():
        x_key = log_cfg['log_interval'][1]
        trainer.extend(E.PlotReport(
            ['main/loss', 'validation/main/loss'], x_key,
            trigger=every('log_interval'), filename='loss.png'),
            name='PlotLoss')
        trainer.extend(E.PlotReport(
            ['main/accuracy', 'validation/main/accuracy'], x_key,
            trigger=every('log_interval'), filename='accuracy.png'),
            name='PlotAccuracy')
    if hasattr(scaling, 'loss_scales'):
        trainer.extend(AE.LossScaleRecorder(
            scaling, interval=log_cfg['loss_scale_interval']))


def run_one(cfg, cell, out_root, resume=False, comm=None, datasets=None):
    """Trains one cell and writes its folder; returns its ``run.json`` dict
    (on ranks other than 0: the same dict, not written).

    Args:
        cfg (dict): validated config (:func:`ada_loss.experiment.config.
            load_config`).
        cell (ada_loss.experiment.grid.Cell): model, dataset, mode, seed.
        out_root (str): results root (the run goes to
            ``<out_root>/<table>/<run name>/``).
        resume (bool): continue from ``snapshot_latest`` if there is one
            (else start afresh). Without it an existing folder is replaced.
        comm: ChainerMN communicator for data-parallel training, or None.
        datasets (tuple): ``(train, test)`` already loaded, or None.
    """
    rcfg = run_config(cfg, cell)
    train_cfg = rcfg['train']
    dtype = rcfg['run']['dtype']
    spec = parse_mode(cell.mode)
    folder = run_folder(out_root, cfg, cell)
    writer = comm is None or comm.rank == 0
    resuming = resume and os.path.exists(os.path.join(folder, R.SNAPSHOT))
    old = R.read_run(folder) if resuming else None
    info = {
        'name': run_name(cell), 'table': cfg['table'], 'model': cell.model,
        'dataset': cell.dataset, 'mode': str(spec), 'mode_name': spec.name,
        'mode_options': spec.options, 'seed': cell.seed, 'dtype': dtype,
        'git_commit': R.git_commit(), 'status': R.RUNNING,
        'world_size': 1 if comm is None else comm.size,
        'started': (old or {}).get('started', _now()),
        'resumed': bool(resuming),
        'description': cfg['description'],
    }
    if writer:
        if not resuming and os.path.isdir(folder):
            shutil.rmtree(folder)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, R.CONFIG_YAML), 'w') as f:
            f.write(C.dump_config(rcfg))
        R.write_run(folder, info)
    if comm is not None:
        comm.mpi_comm.Barrier()

    random.seed(cell.seed)
    numpy.random.seed(cell.seed)
    train, test = datasets or load_datasets(cell.dataset, rcfg['data'])
    num_classes, in_channels = dataset_info(cell.dataset)
    mcfg = rcfg['model']
    with dtype_config(dtype):
        model = Classifier(build(
            cell.model, num_classes, mcfg['in_channels'] or in_channels,
            mcfg['width'], mcfg['shortcut']), dtype)
    optimizer = build_optimizer(model, dtype, train_cfg, comm)

    batchsize = train_cfg['batchsize']
    if comm is not None:
        import chainermn
        if batchsize % comm.size:
            raise ValueError('train.batchsize {} is not divisible by the {} '
                             'ranks'.format(batchsize, comm.size))
        batchsize //= comm.size
        train = chainermn.scatter_dataset(train, comm, shuffle=True,
                                          seed=cell.seed)
        test = chainermn.scatter_dataset(test, comm)
    train_iter = chainer.iterators.SerialIterator(train, batchsize)
    test_iter = chainer.iterators.SerialIterator(
        test, train_cfg['eval_batchsize'], repeat=False, shuffle=False)

    scaling = make_loss_scaling(cell.mode)
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):   # AdaLossScaled's layer list
        if comm is None:
            updater = MixedPrecisionUpdater(train_iter, optimizer, scaling,
                                            mode=str(spec))
        else:
            from ada_loss.training import distributed
            updater = distributed.DistributedMixedPrecisionUpdater(
                train_iter, optimizer, scaling, comm, mode=str(spec))
            distributed.prime_multi_node_optimizer(optimizer, comm)
    if writer and summary.getvalue():
        with open(os.path.join(folder, 'scaling.txt'), 'w') as f:
            f.write(summary.getvalue())

    stop = StopAt(epochs=train_cfg['epochs'],
                  iterations=train_cfg['max_iterations'])
    trainer = training.Trainer(updater, stop, out=folder)
    _add_extensions(trainer, rcfg, model, optimizer, scaling, test_iter,
                    comm, resuming, stop)

    error = None
    try:
        trainer.run(show_loop_exception_msg=False)
    except NonFiniteGradientError as e:
        error = str(e)
    if not writer:
        info.update(status=R.DIVERGED if error else R.FINISHED,
                    iterations=updater.iteration)
        return info
    _summarize(info, trainer, updater, scaling, error)
    R.write_run(folder, info)
    if info['status'] == R.FINISHED and 'alpha_min' in info and \
            rcfg['log']['plot']:
        from ada_loss.experiment.plots import plot_loss_scales
        plot_loss_scales(os.path.join(folder, 'loss_scales.csv'),
                         os.path.join(folder, 'loss_scales.png'),
                         title=info['name'])
    return info
