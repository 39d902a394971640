"""Trainer extensions for the loss-scaling experiments (paper §4.1).

* :class:`StepLearningRate` -- He et al.'s step schedule with warm-up.
* :class:`CSVRecorder` -- rows appended to a CSV file, kill- and
  resume-safe; :class:`LossScaleRecorder` -- per-layer adaptive loss scales
  over iterations (what Figure 4 of the paper plots).
* :class:`LogCSV` -- ``LogReport``'s log as CSV.
* :class:`PlotReport` -- Chainer's, with the PNG replaced atomically.
* :class:`FP32MasterWeights` -- puts the FP32 master weights of mixed16
  training (Micikevicius et al. 2018) into trainer snapshots, which Chainer's
  optimizer serialization leaves out.

Initializers that must see the state restored by a snapshot's ``autoload``
have a priority below the snapshot extension's (-100): Chainer initializes
extensions in decreasing priority.
"""
import csv
import io
import math
import os

import numpy

import chainer
from chainer.training import extension

from ada_loss import atomic

#: below ``extensions.snapshot`` (priority -100)
PRIORITY_AFTER_AUTOLOAD = -200


def _write_atomic(path, text):
    atomic.write_text(path, text, sync=False)


class StepLearningRate(extension.Extension):
    """``lr`` for the next iteration: ``warmup_lr`` during the first
    ``warmup_iterations`` updates, then ``lr * decay ** k`` where ``k`` is the
    number of ``steps`` (epochs) reached (He et al. 2016, §4.2: 0.1, ÷10 at
    32k and 48k iterations = epochs 81 and 122; ResNet-110 warms up at 0.01
    for ~400 iterations).

    Computed from the updater's counters only, so a resumed run continues
    with the right value.
    """

    trigger = 1, 'iteration'
    priority = PRIORITY_AFTER_AUTOLOAD

    def __init__(self, lr, steps=(), decay=0.1, warmup_iterations=0,
                 warmup_lr=None, attr='lr', optimizer=None):
        self.lr = lr
        self.steps = sorted(steps)
        self.decay = decay
        self.warmup_iterations = warmup_iterations
        self.warmup_lr = lr if warmup_lr is None else warmup_lr
        self.attr = attr
        self.optimizer = optimizer

    def value(self, iteration, epoch_detail):
        """The lr of the update that follows ``iteration`` updates."""
        if iteration < self.warmup_iterations:
            return self.warmup_lr
        k = sum(1 for s in self.steps if epoch_detail >= s)
        return self.lr * self.decay ** k

    def _set(self, trainer):
        updater = trainer.updater
        optimizer = self.optimizer or updater.get_optimizer('main')
        setattr(optimizer, self.attr,
                self.value(updater.iteration, updater.epoch_detail))

    def initialize(self, trainer):
        self._set(trainer)

    def __call__(self, trainer):
        self._set(trainer)


class WarmupCosine(StepLearningRate):
    """nanoGPT's ``get_lr`` (Karpathy; the peer's ``learning_rate``,
    scripts/gpt_torch_peer.py): for the update that follows ``i`` updates,
    ``lr * (i + 1) / (warmup + 1)`` while ``i < warmup``, then a cosine
    from ``lr`` down to ``min_lr`` at ``decay_iterations``, ``min_lr``
    after it.

    Chainer's AdamW takes the schedule as its multiplier ``eta`` (its
    ``alpha`` stays ``lr``; the decoupled weight decay is ``eta *
    weight_decay_rate * param``, so a ``weight_decay_rate`` of ``lr * wd``
    decays by PyTorch's ``lr(i) * wd``): ``attr='eta'`` sets ``value / lr``
    there; ``attr='lr'`` sets the rate itself (MomentumSGD). Computed from
    the updater's counter only: a resumed run continues with the right
    value.
    """

    def __init__(self, lr, min_lr, warmup_iterations, decay_iterations,
                 attr='eta', optimizer=None):
        if not 0 <= warmup_iterations <= decay_iterations:
            raise ValueError('0 <= warmup_iterations <= decay_iterations was '
                             'expected, got {} and {}'.format(
                                 warmup_iterations, decay_iterations))
        super(WarmupCosine, self).__init__(
            lr, warmup_iterations=warmup_iterations, attr=attr,
            optimizer=optimizer)
        self.min_lr = min_lr
        self.decay_iterations = decay_iterations

    def rate(self, i):
        """The learning rate of the update that follows ``i`` updates."""
        if i < self.warmup_iterations:
            return self.lr * (i + 1) / (self.warmup_iterations + 1)
        if i > self.decay_iterations:
            return self.min_lr
        span = self.decay_iterations - self.warmup_iterations
        ratio = (i - self.warmup_iterations) / span if span else 1.0
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (
            self.lr - self.min_lr)

    def value(self, iteration, epoch_detail):
        r = self.rate(iteration)
        return r / self.lr if self.attr == 'eta' else r


class CSVRecorder(extension.Extension):
    """Appends rows to a CSV file under the trainer's output folder, safely
    across kills and resumes.

    It runs before the snapshot of the same iteration, so every row in the
    file belongs to an iteration the run has reached. After a resume (or a
    kill in the middle of appending a row) the first call rewrites the file
    atomically without the rows of this and later iterations and without
    incomplete rows; the resumed run writes them again.

    A subclass gives ``header`` (with an ``'iteration'`` column) and
    :meth:`rows`.
    """

    priority = extension.PRIORITY_READER
    header = ('iteration',)

    def __init__(self, filename):
        self.filename = filename

    def initialize(self, trainer):
        self._synced = False

    def rows(self, trainer):
        """The rows of this call (sequences of values, in ``header``'s
        order)."""
        raise NotImplementedError

    def _complete(self, row):
        if len(row) != len(self.header):
            return False
        try:
            int(row[self.header.index('iteration')])
        except ValueError:
            return False
        return True

    def _sync(self, path, iteration):
        """Keeps the complete rows of iterations before ``iteration``."""
        rows = []
        column = self.header.index('iteration')
        if os.path.exists(path):
            with open(path, newline='') as f:
                rows = [r for r in csv.reader(f)][1:]
            rows = [r for r in rows if self._complete(r) and
                    int(r[column]) < iteration]
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(self.header)
        w.writerows(rows)
        atomic.write_text(path, buf.getvalue())

    def __call__(self, trainer):
        rows = self.rows(trainer)
        path = os.path.join(trainer.out, self.filename)
        if not getattr(self, '_synced', False):
            self._sync(path, trainer.updater.iteration)
            self._synced = True
        if not rows:
            return
        buf = io.StringIO()
        csv.writer(buf).writerows(rows)
        with open(path, 'a', newline='') as f:
            f.write(buf.getvalue())


class LossScaleRecorder(CSVRecorder):
    """Appends ``iteration, layer, alpha, beta`` rows to a CSV file for every
    GEMM layer, at iteration 1 and every ``interval`` iterations (a
    :class:`CSVRecorder`).

    α is the scale of the layer's weight gradient (paper §3.1, the loss scale
    the optimizer divides by), β its local scale (Algorithm 4).

    Args:
        loss_scaling (ada_loss.scaling.AdaptiveScaling): the method.
        filename (str): file under the trainer's output folder.
        interval (int): K.
    """

    header = ('iteration', 'layer', 'alpha', 'beta')

    def __init__(self, loss_scaling, filename='loss_scales.csv',
                 interval=100):
        super(LossScaleRecorder, self).__init__(filename)
        self.loss_scaling = loss_scaling
        self.interval = interval

    def trigger(self, trainer):
        it = trainer.updater.iteration
        return it == 1 or it % self.interval == 0

    def _complete(self, row):
        if not super(LossScaleRecorder, self)._complete(row):
            return False
        try:
            float(row[2]), float(row[3])
        except ValueError:
            return False
        return True

    def rows(self, trainer):
        ada = getattr(self.loss_scaling, 'ada', None)
        if ada is None:
            return []
        alphas, betas = ada.loss_scales(), ada.layer_scales()
        it = trainer.updater.iteration
        return [(it, layer, repr(float(alpha)),
                 repr(float(betas.get(layer, 1.0))))
                for layer, alpha in alphas.items()]


class SkipRecorder(CSVRecorder):
    """``skips.csv``: one row per skipped step (the updater's
    :attr:`~ada_loss.training.MixedPrecisionUpdater.last_skip`): the
    iteration, the first layer in backward order whose gradient went
    non-finite, the scale α it was carried at and the largest magnitude it
    reached; with ``echo``, the same as one console line."""

    header = ('iteration', 'layer', 'alpha', 'max_abs')

    def __init__(self, filename='skips.csv', echo=True):
        super(SkipRecorder, self).__init__(filename)
        self.echo = echo

    def rows(self, trainer):
        skip = getattr(trainer.updater, 'last_skip', None)
        if skip is None or skip.iteration != trainer.updater.iteration:
            return []
        if self.echo:
            print('skipped step {}: first non-finite gradient in backward '
                  'order: {} (scale {:g}, max |g| {})'.format(
                      skip.iteration, skip.layer or '(another rank)',
                      skip.alpha, skip.max_abs))
        return [[skip.iteration, skip.layer, repr(float(skip.alpha)),
                 repr(float(skip.max_abs))]]


class LogCSV(extension.Extension):
    """Writes the log of the ``LogReport`` extension as CSV (columns: the
    union of the logged keys, in order of appearance). Register it after
    ``LogReport`` with the same trigger."""

    priority = extension.PRIORITY_READER

    def __init__(self, filename='log.csv', log_report='LogReport'):
        self.filename = filename
        self.log_report = log_report
        self._trainer = None

    def initialize(self, trainer):
        self._trainer = trainer

    def __call__(self, trainer):
        self._trainer = trainer
        self.write()

    def write(self):
        if self._trainer is None:
            return
        log = self._trainer.get_extension(self.log_report).log
        keys = []
        for entry in log:
            keys.extend(k for k in entry if k not in keys)
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=keys, lineterminator='\n')
        w.writeheader()
        w.writerows(log)
        _write_atomic(os.path.join(self._trainer.out, self.filename),
                      buf.getvalue())

    def finalize(self):
        self.write()


class PlotReport(chainer.training.extensions.PlotReport):
    """Chainer's ``PlotReport`` whose PNG is replaced atomically: Chainer's
    writes the file in place, which a kill can leave half-written."""

    def __call__(self, trainer):
        name = self._file_name
        self._file_name = '.tmp_' + name        # serialization keys use name
        try:
            super(PlotReport, self).__call__(trainer)
        finally:
            self._file_name = name
        tmp = os.path.join(trainer.out, '.tmp_' + name)
        if os.path.exists(tmp):
            os.replace(tmp, os.path.join(trainer.out, name))

    def serialize(self, serializer):
        # A snapshot written while this plot was off (a run resumed with
        # log.plot turned on, or from before a study drew it) has no curve
        # yet: the plot starts from the resumed iteration.
        try:
            super(PlotReport, self).serialize(serializer)
        except KeyError:
            if isinstance(serializer, chainer.serializer.Serializer):
                raise


class FP32MasterWeights(extension.Extension):
    """Saves and restores the FP32 master copy of every FP16 parameter.

    With ``use_fp32_update()`` each update rule keeps ``_fp32_param``, the
    weights actually updated (MPT, Micikevicius et al. 2018); the FP16
    parameter is only its rounded copy. ``Optimizer.serialize`` saves the
    rule's state (momentum, ``t``) but not this copy, so a resumed run would
    otherwise restart from FP16-rounded weights. The extension does nothing
    during training; it only takes part in the trainer's serialization.
    """

    trigger = 10 ** 12, 'iteration'
    priority = extension.PRIORITY_READER

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def __call__(self, trainer):
        pass

    def _rules(self):
        for name, param in sorted(self.optimizer.target.namedparams()):
            rule = param.update_rule
            if rule is not None and rule._use_fp32_update and \
                    param.dtype == numpy.float16:
                yield name.lstrip('/'), param, rule

    def serialize(self, serializer):
        saving = isinstance(serializer, chainer.serializer.Serializer)
        for key, param, rule in self._rules():
            if saving:
                if rule._fp32_param is not None:
                    serializer(key, rule._fp32_param.array)
                continue
            try:
                value = serializer(key, None)
            except KeyError:     # no update had happened before the snapshot
                continue
            if value is None:
                continue
            # on the parameter's device (a CuPy array on a GPU): the update
            # rule adds the parameter's gradient to it there
            value = param.device.send(numpy.asarray(value,
                                                    dtype=numpy.float32))
            if rule._fp32_param is None:
                rule._fp32_param = chainer.Parameter(value, name=param.name)
            else:
                rule._fp32_param.array[...] = value


class ObservationRecorder(extension.Extension):
    """Keeps every value reported for some keys (e.g. each test-set
    evaluation) with its iteration. Unlike ``LogReport``, which averages the
    observations of its interval, this holds the exact values; it is saved in
    trainer snapshots, so ``last``/``best`` cover a resumed run too.

    Register it with the default trigger (every iteration): it records a key
    only in iterations where it was reported.
    """

    priority = extension.PRIORITY_EDITOR   # after Evaluator, before logs

    def __init__(self, keys):
        self.keys = list(keys)
        self.history = {k: [] for k in self.keys}

    def __call__(self, trainer):
        for key in self.keys:
            if key in trainer.observation:
                value = float(chainer.as_array(trainer.observation[key]))
                self.history[key].append((trainer.updater.iteration, value))

    def last(self, key):
        return self.history[key][-1][1] if self.history[key] else None

    def best(self, key):
        values = [v for _, v in self.history[key]]
        return max(values) if values else None

    def serialize(self, serializer):
        for key in self.keys:
            name = key.replace('/', '.')
            if isinstance(serializer, chainer.serializer.Serializer):
                serializer(name, numpy.array(self.history[key],
                                             numpy.float64).reshape(-1, 2))
            else:
                rows = serializer(name, None)
                self.history[key] = [(int(i), float(v)) for i, v in rows]
