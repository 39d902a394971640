"""TensorBoard event files of a run, exact under kills and resumes.

:class:`TensorBoardWriter` is a Trainer extension that writes, into the
trainer's output folder (the run folder), TensorBoard event files
(``events.out.tfevents.<time>.<host>.r<k>``) with tensorboardX's summaries
and record writer, synchronously (:class:`EventFile`):

* every key of every ``LogReport`` entry (loss, accuracy, validation,
  ``lr``, ``loss_scale``, ``skipped_steps``, ``epoch``, ``elapsed_time``:
  the rows of ``log.csv``), as scalars under the key itself at the entry's
  iteration;
* for a layer-wise loss scaling (one with ``ada``): ``alpha/<layer>`` (the
  scale of the layer's weight gradient, what ``loss_scales.csv`` holds) and
  ``beta/<layer>`` (its local scale, where the method has one) at iteration
  1 and every ``loss_scale_interval`` iterations;
* with an observer of the backward pass (the GEMM probe or the gradient
  recorder: an ``ObservationsWriter`` of :mod:`ada_loss.analysis.observing`
  on the trainer), at each observed step and per layer, its underflow and
  overflow rates (:data:`OBSERVED_SCALARS`) and the histogram of
  log2|g| of the true activation gradient entering the layer
  (``log2_abs_grad/<layer>``, binned by binary exponent; nonzero entries);
* the run's settings through TensorBoard's HParams plugin (the session
  start at step 0, an experiment whose metrics are ``metrics``; the plugin
  shows each metric's last value, i.e. the run's final one) and, when the
  run ends, the session's end (``STATUS_SUCCESS``, or ``STATUS_FAILURE``
  when training raised).

**Kills and resumes.** The extension runs after the other writers and
readers of an iteration and before the snapshot (priority :data:`PRIORITY`),
and its events are handed to the operating system (written, not buffered)
before the snapshot of the same iteration is written: a snapshot of
iteration S covers the events of every step <= S, whenever the process is
killed. (Like ``loss_scales.csv`` and ``log.csv`` the file is not fsync-ed
at every step: a power loss may cut its tail; a purge's rewrite is.) Its first call in a process (at iteration S + 1 after
resuming from S) purges what the snapshot does not cover: every event file
in the folder is rewritten (atomically, under its own name) without the
events of steps > S, the session's end and an incomplete last record (a
kill while appending); a file left with no event is removed; at iteration 1
(a fresh start in an existing folder) every old event file is. The process
then writes into a fresh file whose name sorts after the others (TensorBoard
reads a run's files in name order), so the run's events hold each step
once, in order, whatever was killed when. The extension (and its trigger)
keeps no state in the snapshot: a snapshot written with the writer off
resumes with it on, and the other way round.

Register it on the writing process only (ChainerMN: rank 0).
"""
import glob
import math
import os
import re
import shutil
import socket
import struct
import tempfile
import time

import chainer
from chainer.training import extension

from tensorboardX import summary as tbx_summary
from tensorboardX.proto import event_pb2, summary_pb2
from tensorboardX.proto.api_pb2 import Status
from tensorboardX.proto.plugin_hparams_pb2 import (
    HParamsPluginData, SessionEndInfo)
from tensorboardX.record_writer import RecordWriter, masked_crc32c

#: after the writers and readers of an iteration (LogReport 300, log.csv,
#: loss_scales.csv, the observers' CSV writers: 100), before the snapshot
#: (-100)
PRIORITY = extension.PRIORITY_READER - 50

#: the file names of event files (TensorBoard reads any name with
#: ``tfevents``)
EVENTS_PATTERN = 'events.out.tfevents.*'
#: the temporary files of the purge (a name TensorBoard does not read)
TMP_PREFIX = '.tmp_tensorboard.'

#: an observer row's key -> the tag group of its per-layer scalar: the
#: gradient recorder's FP16 underflow rate of the true gradient (Fig. 1a)
#: and FP16 underflow of the input-gradient GEMM (Fig. 4b); the GEMM
#: probe's underflow / overflow of the gradient entering and leaving the
#: layer and the weight gradient's underflow (ada_loss/analysis/gemm_probe.py)
OBSERVED_SCALARS = (
    ('underflow_rate', 'underflow_fp16'),
    ('fp16_underflow', 'underflow_fp16_gemm'),
    ('uf_in', 'underflow_in'), ('of_in', 'overflow_in'),
    ('uf_out', 'underflow_out'), ('of_out', 'overflow_out'),
    ('uf_w', 'underflow_weight_grad'),
)
#: an observer row's key holding {binary exponent of |g|: count} of the true
#: gradient (|g| in [2^(e-1), 2^e))
HISTOGRAM_KEY = 'log2_hist'

#: LogReport keys that are not metrics of a run
NOT_METRICS = ('epoch', 'iteration', 'elapsed_time')

# the HParams plugin's tags and version (its summary format)
_HPARAMS = 'hparams'
_SESSION_END = '_hparams_/session_end_info'


class EventFile(object):
    """A new event file ``<folder>/events.out.tfevents.<time>.<host><suffix>``
    (the name TensorBoard's writers give, the suffix added), its first
    record the file version; events are written synchronously with
    tensorboardX's ``RecordWriter`` and :meth:`flush` hands them to the
    operating system without fsync."""

    def __init__(self, folder, suffix=''):
        self.path = os.path.join(folder, 'events.out.tfevents.{}.{}{}'.format(
            int(time.time()), socket.gethostname(), suffix))
        self._records = RecordWriter(self.path)
        self.write(event_pb2.Event(wall_time=time.time(),
                                   file_version='brain.Event:2'))

    def write(self, event):
        self._records.write(event.SerializeToString())

    def flush(self):
        self._records._writer.flush()       # the file object: no fsync

    def close(self):
        self.flush()
        self._records.close()


def event_files(folder):
    """The event files of ``folder``, in the order TensorBoard reads them
    (by name)."""
    return sorted(glob.glob(os.path.join(folder, EVENTS_PATTERN)))


def read_records(path):
    """The complete records of a TFRecord file (an event file), as bytes,
    in order: reading stops at the first incomplete or corrupt record (a
    kill while appending)."""
    with open(path, 'rb') as f:
        data = f.read()
    records, pos = [], 0
    while pos + 12 <= len(data):
        header = data[pos:pos + 8]
        length, = struct.unpack('<Q', header)
        crc, = struct.unpack('<I', data[pos + 8:pos + 12])
        end = pos + 12 + length + 4
        if crc != masked_crc32c(header) or end > len(data):
            break
        body = data[pos + 12:pos + 12 + length]
        if struct.unpack('<I', data[end - 4:end])[0] != masked_crc32c(body):
            break
        records.append(body)
        pos = end
    return records


def _covered(event, before):
    """Whether a purge at iteration ``before`` keeps ``event``."""
    if event.HasField('file_version'):
        return True
    if event.step >= before:
        return False
    return not any(v.tag == _SESSION_END for v in event.summary.value)


def purge(folder, before):
    """Removes from the event files of ``folder`` every event of a step >=
    ``before``, every session end and any incomplete last record; each file
    is replaced atomically, a file left without events is removed, as is
    every file when ``before`` <= 1, and leftover temporary files of an
    earlier purge. Returns the event files left."""
    for tmp in glob.glob(os.path.join(folder, TMP_PREFIX + '*')):
        os.remove(tmp)
    for path in event_files(folder):
        records = read_records(path) if before > 1 else []
        events = [event_pb2.Event.FromString(r) for r in records]
        kept = [r for r, e in zip(records, events) if _covered(e, before)]
        if all(e.HasField('file_version') for r, e in zip(records, events)
               if _covered(e, before)):
            os.remove(path)             # no event left
        elif len(kept) < len(records) or \
                os.path.getsize(path) != sum(len(r) + 16 for r in records):
            _rewrite(path, kept)        # something to drop, or a torn tail
    return event_files(folder)


def _rewrite(path, records):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=TMP_PREFIX)
    os.close(fd)
    try:
        writer = RecordWriter(tmp)
        for record in records:
            writer.write(record)
        writer.flush()          # and fsync
        writer.close()
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _restart_index(paths):
    """1 + the largest ``r<k>`` suffix of ``paths`` (0 if none)."""
    ks = [int(m.group(1)) for m in
          (re.search(r'\.r(\d+)$', p) for p in paths) if m]
    return max(ks) + 1 if ks else 0


def run_hparams(info, skip=('name', 'git_commit', 'status', 'started',
                            'resumed', 'resumed_from', 'description',
                            'environment', 'updated')):
    """The settings of a run as HParams: the str, bool, int and float
    values of the run description ``info`` (a dict such as a run folder's
    ``run.json``) except the keys ``skip``, a dict value's items as
    ``<key>.<item>`` (``mode_options.t_uf``), and ``depth`` for a model
    named ``<letters><depth>`` (``resnet20``)."""
    out = {}
    for key, value in (info or {}).items():
        if key in skip:
            continue
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for sub, v in items:
            if isinstance(v, (str, bool, int, float)):
                out[key if sub is None else '{}.{}'.format(key, sub)] = v
    m = re.fullmatch(r'[A-Za-z_]+?(\d+)', str(out.get('model', '')))
    if m and 'depth' not in out:
        out['depth'] = int(m.group(1))
    return out


class TensorBoardWriter(extension.Extension):
    """Writes a run's TensorBoard event files (see the module).

    Args:
        scaling: the run's loss scaling (an :class:`ada_loss.scaling.
            LossScaling`, possibly observing); ``alpha``/``beta`` are written
            when it has ``ada`` (a layer-wise method).
        loss_scale_interval (int): ``alpha``/``beta`` at iteration 1 and
            every K iterations (as ``loss_scales.csv``).
        hparams: the run's settings, a dict of str/bool/number values or a
            callable returning one (called at the run's first step, so it
            may read files the run wrote before training); None: no HParams.
        metrics: the HParams metrics (reported keys; ``epoch``,
            ``iteration`` and ``elapsed_time`` are left out); empty: no
            experiment summary is written, and TensorBoard takes every
            scalar tag for a metric.
        log_report (str): the name of the ``LogReport`` extension.
    """

    priority = PRIORITY

    def trigger(self, trainer):
        """Every iteration; stateless, so that the extension leaves no key
        in a snapshot (a run resumes whether the writer was on or off)."""
        return True

    def __init__(self, scaling=None, loss_scale_interval=100, hparams=None,
                 metrics=(), log_report='LogReport'):
        self.scaling = scaling
        self.loss_scale_interval = int(loss_scale_interval)
        self.hparams = hparams
        self.metrics = [k for k in metrics if k not in NOT_METRICS]
        self.log_report = log_report
        self._writer = None
        self._failed = False

    # -- the trainer's calls ----------------------------------------------
    def initialize(self, trainer):
        self._trainer = trainer
        self._writer = None
        self._failed = False
        self._observers = [e.extension for e in
                           trainer._extensions.values()
                           if hasattr(e.extension, 'last_rows') and
                           getattr(e.extension, 'scaling', None) is not None
                           and e.extension.scaling is self.scaling]

    def __call__(self, trainer):
        iteration = trainer.updater.iteration
        if self._writer is None:
            self._open(trainer, iteration)
        values = []
        values += self._log_values(trainer)
        if self._scales_due(iteration):
            values += self._scale_values(iteration)
        values += self._observed_values()
        values += self._skip_values(trainer)
        steps = {}
        for step, value in values:
            steps.setdefault(step, []).append(value)
        for step in sorted(steps):
            self._write(step, steps[step])
        if steps:
            self._writer.flush()

    def on_error(self, trainer, exc, tb):
        self._failed = True

    def finalize(self, trainer=None):
        if self._writer is None:
            if getattr(self, '_trainer', None) is None:
                return
            # resumed from the final snapshot, no step left: the file of
            # this process still ends the session (issue 39 item 10); what
            # follows the snapshot's iteration is purged, not that step
            iteration = self._trainer.updater.iteration
            self._open(self._trainer, iteration + 1)
            self._last_step = iteration
        if self.hparams is not None:
            status = Status.Value('STATUS_FAILURE' if self._failed
                                  else 'STATUS_SUCCESS')
            content = HParamsPluginData(
                session_end_info=SessionEndInfo(
                    status=status, end_time_secs=time.time()),
                version=0)
            step = max(self._last_step, self._trainer.updater.iteration)
            self._write(step, [_plugin_value(_SESSION_END, content)])
        self._writer.close()
        self._writer = None

    # -- the file ---------------------------------------------------------
    def _open(self, trainer, iteration):
        """Purges what the snapshot does not cover and opens a fresh file
        (the first call of a process, at ``iteration``)."""
        folder = trainer.out
        os.makedirs(folder, exist_ok=True)
        left = purge(folder, iteration)
        suffix = '.r{:03d}'.format(_restart_index(left))
        self._writer = EventFile(folder, suffix)
        self._last_step = iteration
        log = self._log(trainer)
        self._log_seen = sum(1 for e in log
                             if e.get('iteration', 0) < iteration)
        if iteration == 1 and self.hparams is not None:
            hparams = self.hparams() if callable(self.hparams) \
                else self.hparams
            exp, ssi, _ = tbx_summary.hparams(
                hparams or {}, {k: None for k in self.metrics})
            self._write(0, (list(exp.value) if self.metrics else []) +
                        list(ssi.value))

    def _write(self, step, values):
        event = event_pb2.Event(wall_time=time.time(), step=int(step))
        event.summary.value.extend(values)
        self._writer.write(event)
        self._last_step = max(self._last_step, int(step))

    # -- what is written --------------------------------------------------
    def _log(self, trainer):
        try:
            return trainer.get_extension(self.log_report).log
        except ValueError:
            return []

    def _log_values(self, trainer):
        log = self._log(trainer)
        new, self._log_seen = log[self._log_seen:], len(log)
        out = []
        for entry in new:
            step = entry['iteration']
            for key, value in entry.items():
                if key == 'iteration':
                    continue
                try:
                    value = float(chainer.as_array(value))
                except (TypeError, ValueError):
                    continue
                out.append((step, _scalar(key, value)))
        return out

    def _scales_due(self, iteration):
        return getattr(self.scaling, 'ada', None) is not None and (
            iteration == 1 or iteration % self.loss_scale_interval == 0)

    def _scale_values(self, step):
        ada = self.scaling.ada
        alphas = ada.loss_scales()
        betas = ada.layer_scales() if hasattr(ada, 'layer_scales') else {}
        out = [(step, _scalar('alpha/' + layer, a))
               for layer, a in alphas.items()]
        out += [(step, _scalar('beta/' + layer, betas[layer]))
                for layer in alphas if layer in betas]
        return out

    @staticmethod
    def _skip_values(trainer):
        """``skipped/<layer>``: at a skipped step, the number of skipped
        steps so far whose first non-finite gradient was in that layer (the
        skip report, :mod:`ada_loss.training.skips`)."""
        updater = trainer.updater
        skip = getattr(updater, 'last_skip', None)
        if skip is None or skip.iteration != updater.iteration:
            return []
        layer = skip.layer or '(another rank)'
        return [(skip.iteration, _scalar(
            'skipped/' + layer, updater.skipped_by_layer[skip.layer]))]

    def _observed_values(self):
        out = []
        for observer in self._observers:
            rows, observer.last_rows = observer.last_rows, []
            for row in rows:
                step, layer = int(row['iteration']), row['layer']
                for key, group in OBSERVED_SCALARS:
                    v = row.get(key)
                    if isinstance(v, (int, float)) and math.isfinite(v):
                        out.append((step, _scalar(group + '/' + layer, v)))
                hist = row.get(HISTOGRAM_KEY)
                if hist:
                    out.append((step, _log2_histogram(
                        'log2_abs_grad/' + layer, hist)))
        return out


def _scalar(tag, value):
    """A ``Summary.Value`` of one scalar (tensorboardX's)."""
    return tbx_summary.scalar(tag, float(value)).value[0]


def _plugin_value(tag, content):
    """A ``Summary.Value`` of the HParams plugin holding ``content``."""
    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name=_HPARAMS, content=content.SerializeToString()))
    return summary_pb2.Summary.Value(tag=tag, metadata=meta)


def log2_histogram(hist):
    """``(left_edges, right_edges, counts)`` of log2|g| from {binary
    exponent e: count} (|g| in [2^(e-1), 2^e), so log2|g| in [e-1, e)),
    the empty bins between the lowest and highest exponent included. An
    exponent may be fractional (a gradient carried at a scale that is not
    a power of two, shifted back)."""
    es = sorted(hist)
    lo, hi = es[0], es[-1]
    n = int(round(hi - lo)) + 1
    rights = [lo + i for i in range(n)]
    counts = [0] * n
    for e, c in hist.items():
        counts[int(round(e - lo))] += int(c)
    return [r - 1 for r in rights], rights, counts


def _log2_histogram(tag, hist):
    """A ``Summary.Value`` histogram of log2|g| (see
    :func:`log2_histogram`)."""
    lefts, rights, counts = log2_histogram(hist)
    mids = [(a + b) / 2 for a, b in zip(lefts, rights)]
    return tbx_summary.histogram_raw(
        tag, min=lefts[0], max=rights[-1], num=sum(counts),
        sum=sum(m * c for m, c in zip(mids, counts)),
        sum_squares=sum(m * m * c for m, c in zip(mids, counts)),
        bucket_limits=rights, bucket_counts=counts).value[0]
