"""The standard extensions of a run's Trainer (:func:`extend_trainer`): the
evaluator (:func:`evaluator`), snapshots, logs, console reporters, plots,
the loss-scale and skip records, TensorBoard, on the ``log`` section's
intervals (:func:`interval_triggers`), and :class:`LastLossScales`, which
keeps the last step's per-layer α in the snapshot
(:func:`final_loss_scales`)."""
import sys

import chainer
import numpy
from chainer.training import extensions as E

from ada_loss.analysis.observing import ObservingLossScaling
from ada_loss.experiment import runinfo as R
from ada_loss.experiment.run_folder import is_writer
from ada_loss.training import extensions as AE
from ada_loss.training.random_states import RandomStates
from ada_loss.training.snapshot import Snapshot
from ada_loss.training.tensorboard import TensorBoardWriter, run_hparams
from ada_loss.training.triggers import IntervalOrEnd


def evaluator(test_iter, model, comm=None, device=None):
    """Chainer's Evaluator (ChainerMN's multi-node one with ``comm``); its
    converter sends each batch to ``device`` (None: the CPU)."""
    ev = E.Evaluator(test_iter, model, device=device)
    if comm is not None:
        import chainermn        # optional: needs mpi4py
        ev = chainermn.create_multi_node_evaluator(ev, comm)
    return ev


class _Console(object):
    """stdout for PrintReport without its ANSI erase code when not a tty
    (log files, the runner's workers)."""

    def write(self, text):
        if not sys.stdout.isatty():
            text = text.replace('\033[J', '')
        sys.stdout.write(text)

    def flush(self):
        sys.stdout.flush()


def interval_triggers(log_cfg, stop):
    """``every(key)``: the trigger of the ``log`` interval ``key``, also
    firing at the stop point."""
    def every(key):
        n, unit = getattr(log_cfg, key)
        return IntervalOrEnd(n, unit, stop)
    return every


def extend_trainer(trainer, stop, log_cfg, evaluator, lr_schedule,
                   optimizer, scaling, resuming=False, comm=None,
                   history=None, print_keys=(), plots=()):
    """Registers the standard extensions of a run.

    On every rank: ``evaluator`` (name ``validation``, every
    ``log.eval_interval``) and ``lr_schedule`` (each unless None: the
    figures' short runs have neither), ``observe_lr``,
    :class:`~ada_loss.training.extensions.FP32MasterWeights`,
    :class:`~ada_loss.training.random_states.RandomStates` and the snapshot
    ``snapshot_latest`` (:class:`~ada_loss.training.snapshot.Snapshot`;
    autoloaded, with fallback to ``snapshot_previous``, when ``resuming``;
    written every ``log.snapshot_interval`` on rank 0 only). On rank 0 also: an
    ObservationRecorder ``TestHistory`` of the keys ``history`` (if given),
    LogReport and ``log.csv`` (every ``log.log_interval``), the console
    reporters of ``log.progress`` (PrintReport of ``print_keys``,
    ProgressBar), one PlotReport ``<name>.png`` per ``(name, keys)`` of
    ``plots`` (if ``log.plot``), for layer-wise scaling ``loss_scales.csv``,
    ``probe.csv`` / ``records.csv`` (``log.probe_every`` /
    ``log.record_every``, see :func:`make_scaling`) and, unless
    ``log.tensorboard`` is false, TensorBoard's event files
    (:class:`~ada_loss.training.tensorboard.TensorBoardWriter`).
    """
    every = interval_triggers(log_cfg, stop)
    if evaluator is not None:
        trainer.extend(evaluator, name='validation',
                       trigger=every('eval_interval'))
    if lr_schedule is not None:
        trainer.extend(lr_schedule)
    trainer.extend(E.observe_lr(), trigger=(1, 'iteration'))
    trainer.extend(AE.FP32MasterWeights(optimizer))
    trainer.extend(RandomStates(), name='RandomStates')
    if hasattr(scaling, 'loss_scales'):
        trainer.extend(LastLossScales(scaling), name='LastLossScales',
                       trigger=lambda _: False)
    writer = is_writer(comm)
    trainer.extend(Snapshot(autoload=resuming), name='snapshot',
                   trigger=every('snapshot_interval') if writer
                   else (lambda _: False))
    if not writer:
        return
    if history is not None:
        trainer.extend(AE.ObservationRecorder(history), name='TestHistory')
    trainer.extend(E.LogReport(trigger=every('log_interval')))
    trainer.extend(AE.LogCSV(), trigger=every('log_interval'))
    if log_cfg.progress in ('report', 'both'):
        trainer.extend(E.PrintReport(list(print_keys), out=_Console()),
                       trigger=every('log_interval'))
    if log_cfg.progress in ('bar', 'both'):
        trainer.extend(E.ProgressBar(update_interval=10))
    if log_cfg.plot and E.PlotReport.available():
        for name, keys in plots:
            trainer.extend(AE.PlotReport(
                list(keys), log_cfg.log_interval[1],
                trigger=every('log_interval'),
                filename=name.lower() + '.png'), name='Plot' + name)
    trainer.extend(AE.SkipRecorder(echo=log_cfg.progress != 'none'),
                   trigger=(1, 'iteration'))
    if getattr(scaling, 'ada', None) is not None:
        trainer.extend(AE.LossScaleRecorder(
            scaling, interval=log_cfg.loss_scale_interval))
    if isinstance(scaling, ObservingLossScaling):
        trainer.extend(scaling.writer(), trigger=(1, 'iteration'))
    if log_cfg.tensorboard:
        trainer.extend(TensorBoardWriter(
            scaling, log_cfg.loss_scale_interval, metrics=print_keys,
            hparams=lambda: run_hparams(R.read_run(trainer.out))))


class LastLossScales(chainer.training.Extension):
    """The per-layer α of the last step in the snapshot, so that a run
    resumed from its final snapshot (killed before ``run.json`` was final:
    no step left to train) still reports them (issue 39 item 10; the
    method's records exist only after a backward). Never triggered: it
    only serializes."""

    def __init__(self, scaling):
        self.scaling = scaling
        self.alphas = {}

    def __call__(self, trainer):
        pass

    def last(self):
        """{layer: α} of the last step (live, else as loaded)."""
        return dict(self.scaling.loss_scales() or self.alphas)

    def serialize(self, serializer):
        if isinstance(serializer, chainer.serializer.Serializer):
            alphas = self.last()
            serializer('layers', '\n'.join(alphas))
            serializer('alphas', numpy.array(list(alphas.values()),
                                             dtype=numpy.float64))
            return
        try:
            layers = [k for k in str(serializer('layers', '')).split('\n')
                      if k]
            values = serializer('alphas', None)
        except KeyError:    # a snapshot written before this extension
            return
        self.alphas = {k: float(v) for k, v in zip(layers, values)}


def final_loss_scales(trainer):
    """{layer: α} of the run's last step (:class:`LastLossScales`), or
    {} (a mode without per-layer scales)."""
    try:
        return trainer.get_extension('LastLossScales').last()
    except ValueError:
        return {}
