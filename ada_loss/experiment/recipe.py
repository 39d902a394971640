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
2. :func:`open_run`: its folder, ``config.yaml`` and the first ``run.json``
   (status ``running``; ``--resume`` keeps ``started``), with the fields of
   :meth:`~TrainingStudy.run_fields` (hook);
3. seeding (:meth:`~TrainingStudy.seed`), data
   (:meth:`~TrainingStudy.load_data`), the model
   (:meth:`~TrainingStudy.model`), the datasets
   (:meth:`~TrainingStudy.datasets`), the optimizer
   (:meth:`~TrainingStudy.optimizer`), all hooks;
4. data parallelism (:func:`scatter`), the iterators
   (:meth:`~TrainingStudy.iterators`), the loss scaling
   (:func:`make_scaling`), the updater (:meth:`~TrainingStudy.updater`,
   by default :func:`make_updater`: the mixed-precision updater of the mode,
   ChainerMN's data-parallel one with a communicator), the stop trigger
   (:meth:`~TrainingStudy.stop`);
5. the Trainer and :func:`extend_trainer`: the standard extensions
   (the study's evaluator and learning-rate schedule (hooks), ``observe_lr``,
   FP32 master weights and random streams in the snapshot,
   ``snapshot_latest`` + ``snapshot_previous`` written atomically
   (:mod:`ada_loss.training.snapshot`), LogReport + ``log.csv``, the console
   reporters of :attr:`~TrainingStudy.print_keys`, the PlotReports of
   :attr:`~TrainingStudy.plots` and, for layer-wise modes,
   ``loss_scales.csv``), then the study's own (:meth:`~TrainingStudy.extend`);
6. :func:`run_trainer`: the training loop; a
   :class:`~ada_loss.errors.NonFiniteGradientError` (overflow in a mode that
   cannot skip steps) ends the run as ``diverged``, as does a value of
   :meth:`~TrainingStudy.final_values` that is not finite at the end; the
   study's :meth:`~TrainingStudy.metrics` and the updater's counters go into
   ``run.json`` (:func:`summarize`).

Writers (LogReport, snapshot, ``run.json``) are only on rank 0 (``comm``
None or rank 0); extension names match on every rank, so a snapshot written
by rank 0 loads everywhere.
"""
import contextlib
import dataclasses
import datetime
import io
import math
import os
import random
import shutil
import sys
from typing import Literal, Optional

import chainer
import numpy
import threadpoolctl
from chainer.training import extensions as E

from ada_loss import atomic
from ada_loss.analysis.gemm_probe import ProbingLossScaling
from ada_loss.analysis.observing import ObservingLossScaling
from ada_loss.analysis.recorder import RecordingLossScaling
from ada_loss.communication.communicator import (
    APSDistributedUpdater, create_aps_multi_node_optimizer)
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment.config import setting
from ada_loss.experiment.plots import plot_loss_scales
from ada_loss.experiment.runner import Study
from ada_loss.errors import NonFiniteGradientError
from ada_loss.functions.scales import host_float
from ada_loss.precision import parse_precision
from ada_loss.scaling import make_loss_scaling, parse_mode, resolve_precision
from ada_loss.training import MixedPrecisionUpdater
from ada_loss.training import extensions as AE
from ada_loss.training.random_states import RandomStates, SerialIterator
from ada_loss.training.seeded_iterator import SeededIterator
from ada_loss.training.snapshot import Snapshot, snapshot_candidates
from ada_loss.training.tensorboard import TensorBoardWriter, run_hparams
from ada_loss.training.hooks import add_weight_decay
from ada_loss.training.precision_setup import setup_optimizer
from ada_loss.training.distributed import (
    DistributedMixedPrecisionUpdater, create_multi_node_optimizer,
    prime_multi_node_optimizer)
from ada_loss.training.faults import fault_point
from ada_loss.training.triggers import IntervalOrEnd, StopAt


def now():
    return datetime.datetime.now().isoformat(timespec='seconds')


def last(log, key):
    """The last value of ``key`` in a LogReport log (None if never)."""
    for entry in reversed(log):
        if key in entry:
            return entry[key]
    return None


def finite(x):
    return x is not None and math.isfinite(x)


def subset(dataset, size, seed):
    """A random subset of ``size`` examples (the whole set if ``size`` is
    None/0 or not smaller)."""
    if not size or size >= len(dataset):
        return dataset
    order = numpy.random.RandomState(seed).permutation(len(dataset))[:size]
    return chainer.datasets.SubDataset(dataset, 0, size, order=order)


def make_iterator(dataset, batchsize, jobs=0, repeat=True, shuffle=True,
                  seed=None):
    """The iterator of a run; every kind resumes exactly (its random
    streams are in the snapshot). Fault point ``train_batch`` (``repeat``)
    or ``eval_batch``.

    With a ``seed`` (ImageNet, SSD): a
    :class:`~ada_loss.training.seeded_iterator.SeededIterator` computing
    examples in ``jobs`` worker processes (0: in this process), each with
    its own seed, so the numbers do not depend on ``jobs``. Without (the
    CIFAR-style runs): a
    :class:`~ada_loss.training.random_states.SerialIterator` shuffling and
    augmenting from the global streams the run seeded, which the snapshot
    holds (``jobs`` must be 0).
    """
    fault = 'train_batch' if repeat else 'eval_batch'
    if seed is not None:
        return SeededIterator(dataset, batchsize, repeat=repeat,
                              shuffle=shuffle, seed=seed, n_processes=jobs,
                              fault=fault)
    if jobs:
        raise ValueError('worker processes need a seed per example')
    return SerialIterator(dataset, batchsize, repeat=repeat, shuffle=shuffle,
                          fault=fault)


def iterator_seed(seed, comm=None):
    """The seed of a run's :class:`SeededIterator` on this rank."""
    rank = 0 if comm is None else comm.rank
    return int(numpy.random.SeedSequence([seed, rank]).generate_state(1)[0])


def is_writer(comm):
    return comm is None or comm.rank == 0


def open_run(folder, fields, description, config_text, resume=False,
             comm=None):
    """Starts a run: returns ``(info, resuming)``.

    ``info`` is the ``run.json`` dict: ``fields`` (name, table, model, ...,
    dtype, in order) then git commit, status ``running``, world size, start
    time (kept from the old ``run.json`` when resuming), ``resumed`` and
    ``description``. ``resuming`` is ``resume`` and a snapshot exists. On
    rank 0 the folder is created (replaced unless resuming) with
    ``config.yaml`` (``config_text``) and ``run.json``.
    """
    resuming = bool(resume and snapshot_candidates(folder))
    old = R.read_run(folder) if resuming else None
    info = dict(fields)
    info.update([
        ('git_commit', R.git_commit()), ('status', R.RUNNING),
        ('world_size', 1 if comm is None else comm.size),
        ('started', (old or {}).get('started', now())),
        ('resumed', bool(resuming)), ('description', description),
        ('environment', R.environment())])
    if is_writer(comm):
        if not resuming and os.path.isdir(folder):
            shutil.rmtree(folder)
        os.makedirs(folder, exist_ok=True)
        atomic.write_text(os.path.join(folder, R.CONFIG_YAML), config_text)
        R.write_run(folder, info)
    return info, resuming


def make_scaling(mode, precision, log_cfg, comm=None):
    """The loss scaling of ``mode`` in ``precision``
    (:func:`ada_loss.scaling.make_loss_scaling`), wrapped in a
    :class:`~ada_loss.analysis.gemm_probe.ProbingLossScaling` when
    ``log.probe_every`` is set, or a
    :class:`~ada_loss.analysis.recorder.RecordingLossScaling` when
    ``log.record_every`` is (:func:`extend_trainer` then writes
    ``probe.csv`` / ``records.csv``). With ChainerMN on rank 0 only (the
    writer), which observes its own shard."""
    scaling = make_loss_scaling(mode, precision)
    if not is_writer(comm):
        return scaling
    if log_cfg.record_every is not None:
        return RecordingLossScaling(scaling, every=log_cfg.record_every)
    if log_cfg.probe_every is None:
        return scaling
    # the probe recomputes the bounds with the method's own T_uf and bound
    # (their defaults are the method's: ada_loss.scaling.methods)
    options = getattr(scaling, 'options', {})
    return ProbingLossScaling(
        scaling, str(parse_mode(mode)), log_cfg.probe_every,
        **{k: options[k] for k in ('t_uf', 'bound') if k in options})


def make_updater(train_iter, optimizer, scaling, spec, comm=None,
                 summary_path=None, aps=False, device=None):
    """The (distributed) mixed-precision updater of mode ``spec``. What the
    loss scaling prints while wrapping the model (AdaLossScaled's layer
    list) is captured and, on rank 0, written to ``summary_path`` if given
    (``scaling.txt``). ``device`` (a Chainer device, None: the CPU): where
    the model trains and the converter sends each batch (one process only:
    :func:`check_device_config` refuses a device with ChainerMN)."""
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        if comm is None:
            updater = MixedPrecisionUpdater(train_iter, optimizer, scaling,
                                            mode=str(spec), device=device)
        else:
            cls = APSDistributedUpdater if aps else \
                DistributedMixedPrecisionUpdater
            updater = cls(train_iter, optimizer, scaling, comm,
                          mode=str(spec))
            prime_multi_node_optimizer(optimizer, comm)
    if summary_path and is_writer(comm) and summary.getvalue():
        atomic.write_text(summary_path, summary.getvalue())
    return updater


def build_optimizer(model, precision, lr, momentum, weight_decay,
                    comm=None, aps_policy=None, wire=False):
    """MomentumSGD (+ ChainerMN wrapper) with FP32 master weights for the
    low precisions and weight decay as a hook of every parameter's update
    rule: there it sees the gradient after the FP32 unscaling (an
    optimizer-level hook would see the loss-scaled gradient; Chainer's own
    WeightDecay would multiply its rate by the loss scale there, see
    :mod:`ada_loss.training.hooks`).

    With ``comm``: ChainerMN's multi-node optimizer with the loss-scale sync;
    with an ``aps_policy`` (:class:`~ada_loss.communication.CommPolicy`) too,
    the gradients travel in its format with APS (``wire``: as codes of the
    format, else the emulation)."""
    opt = chainer.optimizers.MomentumSGD(lr=lr, momentum=momentum)
    if comm is not None and aps_policy is not None:
        opt = create_aps_multi_node_optimizer(opt, comm, aps_policy, wire)
    elif comm is not None:
        opt = create_multi_node_optimizer(opt, comm)
    setup_optimizer(opt, model, precision)
    if weight_decay > 0:
        add_weight_decay(model, weight_decay)
    return opt


def evaluator(test_iter, model, comm=None, device=None):
    """Chainer's Evaluator (ChainerMN's multi-node one with ``comm``); its
    converter sends each batch to ``device`` (None: the CPU)."""
    ev = E.Evaluator(test_iter, model, device=device)
    if comm is not None:
        import chainermn        # optional: needs mpi4py
        ev = chainermn.create_multi_node_evaluator(ev, comm)
    return ev


@dataclasses.dataclass
class Log:
    """The ``log`` section of every training study: how often a run logs,
    evaluates and writes its snapshot, and what it shows
    (:func:`extend_trainer`). A study with other units or intervals
    subclasses it with other defaults (:func:`log_setting`)."""
    log_interval: C.Interval = setting([1, 'epoch'], 'LogReport / log.csv '
                                       '/ PrintReport / PlotReport interval')
    eval_interval: C.Interval = setting([1, 'epoch'], 'evaluation interval '
                                        '(also at the end)')
    snapshot_interval: C.Interval = setting([1, 'epoch'], 'trainer snapshot '
                                            'interval (also at the end)')
    loss_scale_interval: int = setting(100, 'layer-wise modes: record '
                                       'per-layer loss scales '
                                       '(loss_scales.csv) every K '
                                       'iterations', minimum=1)
    progress: Literal['report', 'bar', 'both', 'none'] = setting(
        'report', 'console output of a run: PrintReport, ProgressBar, both '
        'or none')
    plot: bool = setting(True, "PlotReport PNGs of the study's curves and, "
                         'for layer-wise modes, loss_scales.png')
    probe_every: Optional[int] = setting(
        None, 'probe every GEMM layer at step 1 and every K steps '
        '(underflow, overflow, bounds, errors; ada_loss/analysis/'
        'gemm_probe.py) into probe.csv; null: off', minimum=1)
    record_every: Optional[int] = setting(
        None, "record every GEMM layer's activation-gradient statistics "
        '(the paper\'s Fig. 1 and 4; ada_loss/analysis/recorder.py) at '
        'step 1 and every K steps into records.csv; null: off', minimum=1)
    tensorboard: bool = setting(
        True, 'TensorBoard event files in the run folder (ada_loss/training/'
        'tensorboard.py): every logged key, alpha/<layer> at '
        'loss_scale_interval, the observers\' per-layer rates and log2|g| '
        'histograms, the settings as HParams; false: off')

    def check(self):
        if self.probe_every is not None and self.record_every is not None:
            raise C.ConfigError('log.record_every', 'expected null while '
                                'log.probe_every is set (one observer of '
                                'the backward per run)')


def log_setting(key, default):
    """The :class:`Log` setting ``key`` with another default (its doc and
    constraints kept), for a subclass::

        @dataclasses.dataclass
        class SSDLog(Log):
            log_interval: C.Interval = log_setting('log_interval',
                                                   [100, 'iteration'])
    """
    meta = dict(Log.__dataclass_fields__[key].metadata)
    return setting(default, meta.pop('doc'), **meta)


def precision_setting():
    """The ``train.precision`` setting of every training study: a precision
    of :mod:`ada_loss.precision`, null for the mode's default (float32 for
    ``fp32``, mixed16 for every other mode); checked against the modes by
    :func:`check_modes_build`."""
    return setting(None, 'which format stores what in training (null: '
                   'float32 for fp32, mixed16 for every other mode)')


def device_setting():
    """The top-level ``device`` setting of a training study's config (a
    :class:`~ada_loss.experiment.config.Device`, null for the CPU), read by
    :meth:`TrainingStudy.run` and checked by :func:`check_device_config`
    (what a device run cannot do) and :func:`training_device` (CuPy and
    the GPU are there)."""
    return setting(None, "where every run trains: '@numpy' or null (the "
                   "CPU) or '@cupy:N' (GPU N; --set device=@cupy:0; "
                   'docs/gpu.md)')


def check_device_config(device, modes, logs=(), distributed=False):
    """Raises a ConfigError, before anything runs, for what a run on
    ``device`` (the parsed ``device`` setting; None: the CPU, anything
    goes) cannot do, instead of failing minutes into a grid: ``modes``
    ``[(key, mode)]`` whose device path raises NotImplementedError
    (``style=authors``: its backward runs on CPU arrays only), observers of the backward (``logs``: ``[(key, log
    section or dict)]``, ``probe_every``/``record_every``: NumPy-only
    statistics, :mod:`ada_loss.analysis`), and ChainerMN (``distributed``:
    one GPU per rank is not wired, and the APS reduction is NumPy-only)."""
    if device is None:
        return
    cpu_only = 'runs on CPU arrays only; leave device at @numpy (the CPU)'
    if distributed:
        raise C.ConfigError('device', 'device {} with distributed '
                            '(ChainerMN, --mpi) is not supported: the '
                            'harness trains one process per GPU (use '
                            '--jobs); {}'.format(device, cpu_only))
    for key, mode in modes:
        spec = mode if isinstance(mode, C.Mode.parsed) else parse_mode(mode)
        options = spec.options or {}
        if options.get('style') == 'authors':
            raise C.ConfigError(key, 'mode {} on device {}: style=authors '
                                '{}'.format(spec, device, cpu_only))
    for key, log in logs:
        for name in ('probe_every', 'record_every'):
            value = log.get(name) if isinstance(log, dict) else \
                getattr(log, name, None)
            if value is not None:
                raise C.ConfigError('{}.{}'.format(key, name), 'the '
                                    'observers of the backward (probe, '
                                    'records) read gradients with NumPy: '
                                    'set it to null with device {}, or '
                                    'observe on the CPU'.format(device))


def training_device(spec):
    """The Chainer device of a ``device`` setting (None for the CPU).
    Raises a ConfigError naming the setting where CuPy, CUDA or GPU N is
    missing: checked before training (the studies' ``preload``) and again
    in each run (a ``--jobs`` worker initializes CUDA itself: the runner's
    workers are spawned, never forked from a parent holding CUDA)."""
    if spec is None:
        return None
    from chainer.backends import cuda
    if not cuda.available:
        raise C.ConfigError('device', 'device {} needs CuPy and a CUDA GPU, '
                            "but Chainer's CUDA backend is not available "
                            'here ({}); leave device at @numpy (the '
                            'CPU)'.format(spec, getattr(
                                cuda, '_resolution_error', None) or
                                'CuPy is not installed'))
    index = int(spec.split(':')[1])
    try:
        count = cuda.cupy.cuda.runtime.getDeviceCount()
    except Exception as e:      # a driver or runtime error
        raise C.ConfigError('device', 'device {}: no CUDA device usable '
                            '({}: {})'.format(spec, type(e).__name__, e))
    if index >= count:
        raise C.ConfigError('device', 'device {}: this machine has {} CUDA '
                            'device(s), @cupy:0 to @cupy:{}'.format(
                                spec, count, count - 1))
    return chainer.get_device(spec)


def check_modes_build(modes, precisions):
    """Every mode builds in every precision it runs in
    (:func:`ada_loss.scaling.make_loss_scaling`): ``modes`` is ``[(key,
    mode)]``, ``key`` the config key named in the ConfigError (``fp32`` runs
    only in float32; a fixed scale must be below the gradient format's
    largest value; options must suit the mode)."""
    for key, mode in modes:
        try:
            for precision in precisions:
                make_loss_scaling(mode, resolve_precision(mode, precision))
        except ValueError as e:
            raise C.ConfigError(key, 'mode {}: {}'.format(mode, e))


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


def summarize(info, trainer, updater, scaling, error, metrics, epoch=True):
    """Fills ``info`` at the end of a run: status (``diverged`` when
    ``error`` is not None), ``metrics(diverged)`` (an ordered list of
    ``(key, value)``), skipped steps, iterations, epoch (if ``epoch``), wall
    time, final loss scale, error and update time."""
    diverged = error is not None
    info['status'] = R.DIVERGED if diverged else R.FINISHED
    info.update(metrics(diverged))
    info.update(skipped_steps=updater.skipped_steps,
                skipped_by_layer=dict(updater.skipped_by_layer),
                iterations=updater.iteration)
    if epoch:
        info['epoch'] = updater.epoch_detail
    info.update(wall_time_s=trainer.elapsed_time,
                loss_scale=host_float(scaling.scale),
                error=error, updated=now())
    return info


def run_trainer(trainer, updater, info, folder, finalize, log_cfg,
                comm=None, threads=1):
    """Runs the trainer; a NonFiniteGradientError ends it as diverged.

    BLAS and OpenMP use ``threads`` threads during the run (recorded as
    ``blas_threads``): a reduction's result depends on how it is split over
    threads, so a fixed count makes the numbers independent of ``--jobs``
    and of whether the run is in a worker process or not. ``resumed_from``
    records the snapshot the run continued from (None: from the start).

    On rank 0 ``finalize(info, error)`` (``error``: the message or None)
    completes ``info`` (see :func:`summarize`), which is written to
    ``run.json``; other ranks only set status and iterations. Returns
    ``info``. A finished run of a layer-wise mode also gets
    ``loss_scales.png`` (if ``log.plot``).
    """
    error = None
    info['blas_threads'] = threads
    try:
        with threadpoolctl.threadpool_limits(limits=threads):
            trainer.run(show_loop_exception_msg=False)
    except NonFiniteGradientError as e:
        error = str(e)
    fault_point('run_end')
    snapshot = trainer.get_extension('snapshot')
    info['resumed_from'] = snapshot.loaded_from
    info['resumed'] = snapshot.loaded_from is not None
    if not is_writer(comm):
        info.update(status=R.DIVERGED if error else R.FINISHED,
                    iterations=updater.iteration)
        return info
    finalize(info, error)
    R.write_run(folder, info)
    scales = os.path.join(folder, 'loss_scales.csv')
    if log_cfg.plot and info['status'] == R.FINISHED and \
            os.path.exists(scales):
        plot_loss_scales(scales, os.path.join(folder, 'loss_scales.png'),
                         title=info['name'])
    return info


def scatter(train, test, batchsize, comm, seed, what='batchsize'):
    """Data parallelism: the per-rank batch size (``batchsize`` is global;
    ``what`` names it in the error) and the datasets scattered over the
    ranks (``test`` only if not None). Unchanged without ``comm``."""
    if comm is None:
        return train, test, batchsize
    import chainermn            # optional: needs mpi4py
    if batchsize % comm.size:
        raise ValueError('{} {} is not divisible by the {} ranks'.format(
            what, batchsize, comm.size))
    batchsize //= comm.size
    train = chainermn.scatter_dataset(train, comm, shuffle=True, seed=seed)
    if test is not None:
        test = chainermn.scatter_dataset(test, comm)
    return train, test, batchsize


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


def mode_fields(spec):
    """The ``run.json`` fields of a loss-scaling mode."""
    return [('mode', str(spec)), ('mode_name', spec.name),
            ('mode_options', spec.options)]


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
        info, resuming = open_run(
            folder, self.run_fields(run) + [('device', spec or '@numpy')],
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
        return make_updater(train_iter, optimizer, scaling, run.mode,
                            run.comm, summary, device=run.device)

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
