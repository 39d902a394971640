"""The one training recipe of the harness: how a study's cell becomes a run
on Chainer's Trainer (paper §4.1 CIFAR, §4.2 ImageNet, §4.3 SSD, the APS
and figures studies).

:class:`TrainingStudy` is the base class of every study that trains. Its
:meth:`~TrainingStudy.run` is the fixed sequence every run goes through, and
the only place in :mod:`ada_loss.experiment` that constructs a
``chainer.training.Trainer``:

1. :meth:`~TrainingStudy.setup` (hook): what the study resolves for the cell
   (its config, loss-scaling mode, precision, seed, log section), a
   :class:`Run`;
2. :func:`~.run_folder.open_run`: its folder, ``config.yaml`` and the
   first ``run.json`` (status ``running``; ``--resume`` keeps
   ``started``), with the fields of :meth:`~TrainingStudy.run_fields`
   (hook);
3. seeding (:meth:`~TrainingStudy.seed`), data
   (:meth:`~TrainingStudy.load_data`), the model
   (:meth:`~TrainingStudy.model`), the datasets
   (:meth:`~TrainingStudy.datasets`), the optimizer
   (:meth:`~TrainingStudy.optimizer`), all hooks;
4. data parallelism (:func:`~.iterators.scatter`), the iterators
   (:meth:`~TrainingStudy.iterators`), the loss scaling
   (:func:`~.optimization.make_scaling`), the updater
   (:meth:`~TrainingStudy.updater`, by default
   :func:`~.optimization.make_updater`: the mixed-precision updater of the
   mode, ChainerMN's data-parallel one with a communicator), the stop
   trigger (:meth:`~TrainingStudy.stop`);
5. the Trainer and :func:`~.trainer_extensions.extend_trainer`: the
   standard extensions (the study's evaluator and learning-rate schedule
   (hooks), ``observe_lr``, FP32 master weights and random streams in the
   snapshot,
   ``snapshot_latest`` + ``snapshot_previous`` written atomically
   (:mod:`ada_loss.training.snapshot`), LogReport + ``log.csv``, the console
   reporters of :attr:`~TrainingStudy.print_keys`, the PlotReports of
   :attr:`~TrainingStudy.plots` and, for layer-wise modes,
   ``loss_scales.csv``), then the study's own (:meth:`~TrainingStudy.extend`);
6. :func:`~.run_folder.run_trainer`: the training loop; a
   :class:`~ada_loss.errors.NonFiniteGradientError` (overflow in a mode that
   cannot skip steps) ends the run as ``diverged``, as does a value of
   :meth:`~TrainingStudy.final_values` that is not finite at the end; the
   study's :meth:`~TrainingStudy.metrics` and the updater's counters go into
   ``run.json`` (:func:`~.summaries.summarize`).

Writers (LogReport, snapshot, ``run.json``) are only on rank 0 (``comm``
None or rank 0); extension names match on every rank, so a snapshot written
by rank 0 loads everywhere.

The helpers the recipe calls live in modules named for what they hold:
:mod:`.run_folder` (a run's folder at its start and end), :mod:`.iterators`
(datasets, shards, iterators), :mod:`.optimization` (loss scaling,
optimizer, updater), :mod:`.trainer_extensions` (the standard extensions),
:mod:`.summaries` (``run.json``'s final fields), :mod:`.settings` (the
settings every training study shares) and :mod:`.devices` (where a run
trains).
"""
import os
import random

import chainer
import numpy

from ada_loss.experiment import config as C
from ada_loss.experiment import provenance
from ada_loss.experiment import runinfo as R
from ada_loss.experiment.devices import training_device
from ada_loss.experiment.iterators import make_iterator, scatter
from ada_loss.experiment.optimization import (
    build_optimizer, make_scaling, make_updater)
from ada_loss.experiment.run_folder import (
    is_writer, now, open_run, run_trainer)
from ada_loss.experiment.runner import Study
from ada_loss.experiment.summaries import finite, summarize
from ada_loss.experiment.trainer_extensions import (
    evaluator, extend_trainer, final_loss_scales)
from ada_loss.precision import parse_precision
from ada_loss.scaling import resolve_precision, resolved_mode
from ada_loss.training.cuda_graph import install as install_cuda_graph
from ada_loss.training.triggers import StopAt


# -- the recipe ----------------------------------------------------------------------
class Run(object):
    """One run being built: what :meth:`TrainingStudy.setup` resolved for a
    cell (``cfg``, ``cell``, ``config``: the cell's config, ``mode``: the
    :class:`~ada_loss.scaling.LossScalingSpec`, ``precision``: the
    :class:`~ada_loss.precision.Precision` (:func:`run_precision`),
    ``seed``, ``log``: the log
    section, and whatever else the study's hooks need), plus ``folder``,
    ``comm`` and ``device`` (the Chainer device of the config's ``device``
    setting, None: the CPU), set by the recipe. Hooks may add attributes."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def run_precision(mode, precision=None):
    """The :class:`~ada_loss.precision.Precision` a run of ``mode`` trains in
    (:func:`ada_loss.scaling.resolve_precision`: ``precision``, or the
    mode's default)."""
    return parse_precision(resolve_precision(mode, precision))


def mode_fields(spec, precision=None):
    """The ``run.json`` fields of a loss-scaling mode: its canonical text
    (options at their default left out), name and options, and
    ``mode_resolved``, the text with every option's value, defaults
    included, in the run's ``precision``
    (:func:`ada_loss.scaling.resolved_mode`): a default that changes later
    cannot change what a recorded run meant (issue 47: ``adaptive``'s
    ``init_scale`` was 1 before it became ``format``)."""
    return [('mode', str(spec)), ('mode_name', spec.name),
            ('mode_options', spec.options),
            ('mode_resolved', resolved_mode(spec, None if precision is None
                                            else str(precision)))]


class TrainingStudy(Study):
    """A study whose cells train on Chainer's Trainer: :meth:`run` is the one
    recipe (see the module's docstring); a study overrides the hooks where
    its runs differ (model, data, evaluator, learning-rate schedule,
    metrics, report keys)."""

    #: PrintReport columns (``log.progress``)
    print_keys = ('epoch', 'iteration', 'main/loss', 'validation/main/loss',
                  'main/accuracy', 'validation/main/accuracy', 'lr',
                  'loss_scale', 'skipped_steps', 'elapsed_time')
    #: PlotReports ``(name, keys)``: ``<name>.png`` (``log.plot``)
    plots = (('Loss', ('main/loss', 'validation/main/loss')),
             ('Accuracy', ('main/accuracy', 'validation/main/accuracy')))
    #: observation keys recorded every iteration (``TestHistory``), or None
    history = None
    #: what :meth:`final_values` are, in the error of a run they end
    final_what = 'loss'
    #: whether ``run.json`` holds the epoch reached
    records_epoch = True
    #: the file of what the loss scaling prints while wrapping the model
    scaling_summary = 'scaling.txt'
    #: whether ChainerMN ranks evaluate a shard of the test set each (else
    #: every rank sees all of it)
    scatter_test = True

    # -- the recipe ------------------------------------------------------------------
    def run(self, cfg, cell, out, resume=False, comm=None, cache=None):
        """Trains one cell; writes its folder, returns its ``run.json``
        dict."""
        run = self.setup(cfg, cell, comm)
        run.comm = comm
        spec = getattr(cfg, 'device', None)
        run.device = training_device(spec)
        run.folder = folder = self.folder(out, cfg, cell)
        data = provenance.run_data(self.data_record(cfg, cell), folder,
                                   resume)      # run.json: data
        info, resuming = open_run(
            folder, self.run_fields(run) + [('device', spec or '@numpy')] +
            ([('data', data)] if data is not None else []),
            getattr(cfg, 'description', ''),
            C.dump(self.run_config(cfg, cell)), resume, comm)
        if comm is not None:
            comm.mpi_comm.Barrier()

        self.seed(run)
        data = self.load_data(run, cache)
        model = self.model(run, data)
        if run.device is not None:
            # before the optimizer: its update rules (FP32 master weights,
            # momentum) are then made on the device from the start
            run.device.use()
            model.to_device(run.device)
        train, test = self.datasets(run, data, model)
        optimizer = self.optimizer(run, model)
        train, scattered, batchsize = scatter(
            train, test if self.scatter_test else None, self.batchsize(run),
            comm, run.seed, self.batchsize_key)
        test = scattered if self.scatter_test else test
        train_iter, test_iter = self.iterators(run, train, test, batchsize)
        scaling = make_scaling(run.mode, run.precision, run.log, comm)
        updater = self.updater(run, train_iter, optimizer, scaling)
        stop = self.stop(run)
        trainer = chainer.training.Trainer(updater, stop, out=folder)
        extend_trainer(
            trainer, stop, run.log,
            self.evaluator(run, model, test, test_iter),
            self.lr_schedule(run, optimizer), optimizer, scaling, resuming,
            comm, history=self.history, print_keys=self.print_keys,
            plots=self.plots)
        self.extend(run, trainer)

        def finalize(info, error):
            values = self.final_values(run, trainer, updater)
            if error is None and not all(finite(v) for _, v in values):
                error = 'non-finite {} at the end ({})'.format(
                    self.final_what, ', '.join(
                        str(v) if k is None else '{} {}'.format(k, v)
                        for k, v in values))
            run.error = error
            summarize(info, trainer, updater, scaling, error,
                      lambda diverged: self.metrics(run, trainer, updater,
                                                    diverged),
                      epoch=self.records_epoch)
            run.loss_scales = final_loss_scales(trainer)
            self.summarized(run, info, scaling)

        try:
            return run_trainer(trainer, updater, info, folder, finalize,
                               run.log, comm,
                               threads=getattr(cfg, 'blas_threads', 1))
        except KeyboardInterrupt:
            # Ctrl-C: not "running" any more; --resume continues it
            if is_writer(comm):
                info.update(status=R.INTERRUPTED, updated=now(),
                            iterations=updater.iteration)
                R.write_run(folder, info)
            raise

    # -- hooks -----------------------------------------------------------------------
    def setup(self, cfg, cell, comm=None):
        """The :class:`Run` of a cell (default: ``cfg`` itself as its config,
        the cell's ``mode`` and ``seed``, the precision of ``train.precision``
        resolved for the mode, ``cfg.log``)."""
        precision = getattr(getattr(cfg, 'train', None), 'precision', None)
        return Run(cfg=cfg, cell=cell, config=cfg, mode=cell.mode,
                   precision=run_precision(cell.mode, precision),
                   seed=cell.seed, log=cfg.log)

    def run_fields(self, run):
        """The first fields of ``run.json`` (name, table, the cell, mode,
        seed, precision, ...), in order."""
        raise NotImplementedError

    def seed(self, run):
        """Seeds Python's and NumPy's global random streams (model
        initialization, shuffling, augmentation)."""
        random.seed(run.seed)
        numpy.random.seed(run.seed)

    def load_data(self, run, cache):
        """The run's data as :meth:`~Study.preload` returned it
        (``cache``), or loaded now."""
        raise NotImplementedError

    def model(self, run, data):
        """The link the optimizer trains and the evaluator runs, in the run's
        precision."""
        raise NotImplementedError

    def datasets(self, run, data, model):
        """``(train, test)`` datasets (``test`` may be None): by default the
        data as loaded."""
        return data

    def optimizer(self, run, model):
        """MomentumSGD with FP32 master weights and weight decay
        (:func:`build_optimizer`) of ``run.config.train``."""
        t = run.config.train
        return build_optimizer(model, run.precision, t.lr, t.momentum,
                               t.weight_decay, run.comm)

    #: the setting the global batch size comes from (named in errors)
    batchsize_key = 'batchsize'

    def batchsize(self, run):
        """The global batch size."""
        return run.config.train.batchsize

    def iterators(self, run, train, test, batchsize):
        """``(train_iter, test_iter)``: by default serial iterators on the
        global random streams (:func:`make_iterator`)."""
        t = run.config.train
        return (make_iterator(train, batchsize),
                make_iterator(test, t.eval_batchsize, repeat=False,
                              shuffle=False))

    def updater(self, run, train_iter, optimizer, scaling):
        """The (distributed) mixed-precision updater (:func:`make_updater`);
        what the scaling prints goes to :attr:`scaling_summary`."""
        summary = self.scaling_summary and os.path.join(
            run.folder, self.scaling_summary)
        updater = make_updater(train_iter, optimizer, scaling, run.mode,
                               run.comm, summary, device=run.device)
        if run.comm is None:        # (ChainerMN: its own finite check)
            # studies without a train section (the figures') never replay
            train = getattr(run.config, 'train', None)
            install_cuda_graph(updater, getattr(train, 'cuda_graph', 'off'),
                               run.device)
        return updater

    def stop(self, run):
        """The stop trigger: ``train.epochs`` or ``train.max_iterations``."""
        t = run.config.train
        return StopAt(epochs=t.epochs, iterations=t.max_iterations)

    def evaluator(self, run, model, test, test_iter):
        """The ``validation`` extension (Chainer's Evaluator), or None."""
        return evaluator(test_iter, model, run.comm, run.device)

    def lr_schedule(self, run, optimizer):
        """The learning-rate extension, or None."""
        return None

    def extend(self, run, trainer):
        """Extensions of the study's own, after the standard ones."""

    def final_values(self, run, trainer, updater):
        """``[(label, value)]`` that must be finite at the end of a run that
        did not diverge (else it is ``diverged``)."""
        return []

    def metrics(self, run, trainer, updater, diverged):
        """``[(key, value)]`` of ``run.json`` at the end (before the
        updater's counters); ``run.error`` is the message of a diverged
        run."""
        return []

    def summarized(self, run, info, scaling):
        """Adds to ``run.json`` after the updater's counters."""
