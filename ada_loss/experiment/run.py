"""One training run of a table cell on Chainer's Trainer (paper §4.1).

:func:`run_one` builds the model in the run's precision (float32 for ``fp32``,
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
import os
import random
import sys

import numpy

import chainer
from chainer import training
from chainer.training import extensions as E

from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import trainer as T
from ada_loss.experiment.data import dataset_info, load_datasets
from ada_loss.experiment.grid import run_name
from ada_loss.experiment.models import build
from ada_loss.scaling import make_loss_scaling, parse_mode, resolve_precision
from ada_loss.training import Classifier, dtype_config, setup_optimizer
from ada_loss.training import extensions as AE
from ada_loss.training.hooks import add_weight_decay
from ada_loss.training.triggers import StopAt

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
    precision = resolve_precision(cell.mode, c['train']['precision'])
    out = {'run': {'model': cell.model, 'dataset': cell.dataset,
                   'mode': cell.mode, 'seed': cell.seed,
                   'precision': precision}}
    out.update((k, v) for k, v in c.items()
               if k not in ('grid', 'per_model'))
    return out


def build_optimizer(model, precision, train_cfg, comm=None):
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
    setup_optimizer(opt, model, precision)
    if train_cfg['weight_decay'] > 0:
        add_weight_decay(model, train_cfg['weight_decay'])
    return opt


def _summarize(info, trainer, updater, scaling, diverged_error):
    tests = trainer.get_extension('TestHistory')
    acc_key, loss_key = 'validation/main/accuracy', 'validation/main/loss'
    train_loss = T.last(trainer.get_extension('LogReport').log, 'main/loss')
    test_loss = tests.last(loss_key)
    error = diverged_error
    if error is None and not (T.finite(train_loss) and T.finite(test_loss)):
        error = 'non-finite loss at the end (train {}, test {})'.format(
            train_loss, test_loss)
    T.summarize(info, trainer, updater, scaling, error, lambda diverged: [
        ('final_test_accuracy', None if diverged else tests.last(acc_key)),
        ('best_test_accuracy', None if diverged else tests.best(acc_key)),
        ('last_test_accuracy', tests.last(acc_key)),
        ('final_test_loss', test_loss), ('final_train_loss', train_loss)])
    if hasattr(scaling, 'loss_scales') and scaling.loss_scales():
        alphas = list(scaling.loss_scales().values())
        info['alpha_min'], info['alpha_max'] = min(alphas), max(alphas)
    return info


def _reporters(log_cfg):
    """PrintReport / ProgressBar / PlotReport (``loss.png``,
    ``accuracy.png``) as configured in ``log``."""
    def reporters(every):
        out = T.print_report(PRINT_KEYS, every, log_cfg['progress'] in (
            'report', 'both'), out=_Console())
        if log_cfg['progress'] in ('bar', 'both'):
            out.append((E.ProgressBar(update_interval=10), None, None))
        if log_cfg['plot'] and E.PlotReport.available():
            x_key = log_cfg['log_interval'][1]
            out.append((AE.PlotReport(
                ['main/loss', 'validation/main/loss'], x_key,
                trigger=every('log_interval'), filename='loss.png'),
                None, 'PlotLoss'))
            out.append((AE.PlotReport(
                ['main/accuracy', 'validation/main/accuracy'], x_key,
                trigger=every('log_interval'), filename='accuracy.png'),
                None, 'PlotAccuracy'))
        return out
    return reporters


def _add_extensions(trainer, cfg, model, optimizer, scaling, test_iter,
                    comm, resuming, stop):
    """Registers the extensions (:func:`ada_loss.experiment.trainer.
    extend_trainer`); writers only on rank 0."""
    log_cfg, train_cfg = cfg['log'], cfg['train']
    evaluator = E.Evaluator(test_iter, model)
    if comm is not None:
        import chainermn
        evaluator = chainermn.create_multi_node_evaluator(evaluator, comm)
    T.extend_trainer(
        trainer, stop, log_cfg, evaluator, AE.StepLearningRate(
            train_cfg['lr'], train_cfg['lr_steps'], train_cfg['lr_decay'],
            train_cfg['warmup_iterations'], train_cfg['warmup_lr'],
            optimizer=optimizer),
        optimizer, scaling, resuming, comm,
        history=['validation/main/accuracy', 'validation/main/loss'],
        reporters=_reporters(log_cfg))


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
    precision = rcfg['run']['precision']
    spec = parse_mode(cell.mode)
    folder = run_folder(out_root, cfg, cell)
    writer = T.is_writer(comm)
    info, resuming = T.open_run(folder, [
        ('name', run_name(cell)), ('table', cfg['table']),
        ('model', cell.model), ('dataset', cell.dataset), ('mode', str(spec)),
        ('mode_name', spec.name), ('mode_options', spec.options),
        ('seed', cell.seed), ('precision', precision)], cfg['description'],
        C.dump_config(rcfg), resume, comm)
    if comm is not None:
        comm.mpi_comm.Barrier()

    random.seed(cell.seed)
    numpy.random.seed(cell.seed)
    train, test = datasets or load_datasets(cell.dataset, rcfg['data'])
    num_classes, in_channels = dataset_info(cell.dataset)
    mcfg = rcfg['model']
    with dtype_config(precision):
        model = Classifier(build(
            cell.model, num_classes, mcfg['in_channels'] or in_channels,
            mcfg['width'], mcfg['shortcut']), precision)
    optimizer = build_optimizer(model, precision, train_cfg, comm)

    train, test, batchsize = T.scatter(train, test, train_cfg['batchsize'],
                                       comm, cell.seed, 'train.batchsize')
    train_iter = T.make_iterator(train, batchsize)
    test_iter = T.make_iterator(test, train_cfg['eval_batchsize'],
                                repeat=False, shuffle=False)

    scaling = make_loss_scaling(cell.mode, precision)
    updater = T.make_updater(train_iter, optimizer, scaling, spec, comm,
                             os.path.join(folder, 'scaling.txt'))

    stop = StopAt(epochs=train_cfg['epochs'],
                  iterations=train_cfg['max_iterations'])
    trainer = training.Trainer(updater, stop, out=folder)
    _add_extensions(trainer, rcfg, model, optimizer, scaling, test_iter,
                    comm, resuming, stop)

    T.run_trainer(trainer, updater, info, folder, lambda info, error:
                  _summarize(info, trainer, updater, scaling, error), comm,
                  threads=T.blas_threads(cfg))
    if not writer:
        return info
    if info['status'] == R.FINISHED and 'alpha_min' in info and \
            rcfg['log']['plot']:
        from ada_loss.experiment.plots import plot_loss_scales
        plot_loss_scales(os.path.join(folder, 'loss_scales.csv'),
                         os.path.join(folder, 'loss_scales.png'),
                         title=info['name'])
    return info
