"""The TensorBoard writer (ada_loss/training/tensorboard.py) on a real
Trainer, its files read back with TensorBoard's own reader, and served by
a real ``tensorboard --logdir`` on 127.0.0.1.

The harness-level tests (a Table 1 run's events against ``log.csv`` and
``loss_scales.csv``, kill -9 and ``--resume``, the probe, ``--jobs`` with
the writer off) are in tests/experiment/test_kill_resume.py.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import chainer
import numpy
import pytest
import threadpoolctl
from chainer import training
from chainer.training import extensions as E

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto import event_pb2

from ada_loss.analysis.recorder import RecordingLossScaling
from ada_loss.models import SmallCNN
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, dtype_config, setup_optimizer)
from ada_loss.training import tensorboard as T
from ada_loss.training.extensions import LossScaleRecorder

import substrate_helpers as H
import tensorboard_events as TB

HPARAMS = {'mode': 'adaptive', 'seed': 0, 'model': 'small_cnn'}


class Fail(chainer.training.Extension):
    """Raises at iteration ``at`` (a run that fails)."""

    def __init__(self, at):
        self.at = at

    def __call__(self, trainer):
        if trainer.updater.iteration == self.at:
            raise RuntimeError('stop here')


def train(out, iterations=6, record_every=None, fail_at=None,
          metrics=('main/loss', 'epoch')):
    """SmallCNN (width 4) on 16x16 digits in mixed16 with adaptive loss
    scaling: LogReport every 2 iterations, loss_scales.csv every 2, the
    gradient recorder (``record_every``) and the TensorBoard writer."""
    train_set, _ = H.digits_split(16)
    numpy.random.seed(0)
    with dtype_config('mixed16'):
        model = Classifier(SmallCNN(10, 1, width=4), 'mixed16')
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(0.05), model,
                          'mixed16')
    scaling = make_loss_scaling('adaptive', 'mixed16')
    if record_every:
        scaling = RecordingLossScaling(scaling, every=record_every)
    it = chainer.iterators.SerialIterator(train_set, 16, shuffle=False)
    updater = MixedPrecisionUpdater(it, opt, scaling, mode='adaptive')
    trainer = training.Trainer(updater, (iterations, 'iteration'), out=out)
    trainer.extend(E.LogReport(trigger=(2, 'iteration')))
    trainer.extend(LossScaleRecorder(scaling, interval=2))
    if record_every:
        trainer.extend(scaling.writer())
    if fail_at:
        trainer.extend(Fail(fail_at))
    trainer.extend(T.TensorBoardWriter(scaling, 2, hparams=HPARAMS,
                                       metrics=metrics))
    with threadpoolctl.threadpool_limits(1):
        trainer.run()
    return trainer


@pytest.fixture(scope='module')
def logdir(tmp_path_factory):
    """A folder with one run, ``adaptive``: 6 iterations, gradients
    recorded at 1, 3 and 6."""
    root = str(tmp_path_factory.mktemp('tb'))
    train(os.path.join(root, 'adaptive'), record_every=3)
    return root


def test_what_the_writer_writes(logdir):
    folder = os.path.join(logdir, 'adaptive')
    with open(os.path.join(folder, 'log')) as f:
        log = json.load(f)
    acc = TB.accumulator(folder)
    tags = acc.Tags()
    # every logged key at the log interval
    for key in ('main/loss', 'main/accuracy', 'loss_scale', 'skipped_steps',
                'epoch', 'elapsed_time'):
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [2, 4, 6]
        assert [v for _, v in got] == pytest.approx(
            [numpy.float32(r[key]) for r in log])
    # alpha and beta per GEMM layer, at 1 and every 2 iterations
    layers = {'predictor/conv1', 'predictor/conv2', 'predictor/conv3',
              'predictor/fc'}
    assert {t for t in tags['scalars'] if t.startswith('alpha/')} == \
        {'alpha/' + x for x in layers}
    assert [e.step for e in acc.Scalars('beta/predictor/fc')] == [1, 2, 4, 6]
    # the recorder's per-layer FP16 underflow rate and log2|g| histogram
    for layer in layers:
        assert [e.step for e in acc.Scalars('underflow_fp16/' + layer)] == \
            [1, 3, 6]
        hists = acc.Histograms('log2_abs_grad/' + layer)
        assert [h.step for h in hists] == [1, 3, 6]
        for h in hists:
            v = h.histogram_value
            # bins of one binary exponent, the empty ones in between kept
            assert v.bucket_limit == [float(x) for x in range(
                int(v.min) + 1, int(v.max) + 1)]
            assert sum(v.bucket) == v.num > 0
    # HParams: settings at step 0, the end of the session at the last step
    events = TB.timeline(folder)
    assert events[0][:2] == (0, '_hparams_/experiment')
    exp = json.loads(events[0][2])['experiment']
    assert [m['name']['tag'] for m in exp['metricInfos']] == ['main/loss']
    assert {h['name'] for h in exp['hparamInfos']} == set(HPARAMS)
    assert events[1][:2] == (0, '_hparams_/session_start_info')
    assert json.loads(events[1][2])['sessionStartInfo']['hparams'] == \
        HPARAMS
    assert events[-1] == (6, '_hparams_/session_end_info', 1)   # SUCCESS


def test_a_failed_run_ends_its_session_as_failed(tmp_path):
    with pytest.raises(RuntimeError, match='stop here'):
        train(str(tmp_path), iterations=6, fail_at=3, metrics=())
    events = TB.timeline(str(tmp_path))
    # no metrics named: the session alone (TensorBoard infers the rest)
    assert [t for _, t, _ in events if t.startswith('_hparams_')] == [
        '_hparams_/session_start_info', '_hparams_/session_end_info']
    assert events[-1] == (3, '_hparams_/session_end_info', 2)   # FAILURE
    assert max(s for s, _, _ in events) == 3


def _write(folder, steps, end=None, suffix='.r000'):
    writer = EventsWriter(os.path.join(folder, 'events'), suffix)
    for step in steps:
        event = event_pb2.Event(step=step, wall_time=time.time())
        event.summary.value.add(tag='x', simple_value=float(step))
        writer.write_event(event)
    if end is not None:
        event = event_pb2.Event(step=end, wall_time=time.time())
        event.summary.value.add(tag=T._SESSION_END)
        writer.write_event(event)
    writer.close()
    return writer._file_name


def test_purge_keeps_what_the_snapshot_covers(tmp_path):
    folder = str(tmp_path)
    first = _write(folder, range(1, 7), end=6)
    second = _write(folder, [7, 8], suffix='.r001')
    with open(first, 'ab') as f:        # a kill while appending a record
        f.write(b'\x10\x00\x00\x00\x00\x00\x00\x00\x01\x02')
    open(os.path.join(folder, T.TMP_PREFIX + 'x'), 'w').close()
    assert T.purge(folder, 4) == [first]        # steps 7, 8: none left
    assert TB.timeline(folder) == [(1, 'x', 1.0), (2, 'x', 2.0),
                                   (3, 'x', 3.0)]
    assert os.listdir(folder) == [os.path.basename(first)]
    assert not os.path.exists(second)
    # idempotent; a fresh start removes every file
    assert T.purge(folder, 4) == [first]
    assert len(TB.timeline(folder)) == 3
    assert T.purge(folder, 1) == [] and os.listdir(folder) == []


def test_resumed_writer_continues_in_a_new_file(logdir, tmp_path):
    """A second process at iteration 5 of a run whose first wrote up to 6
    (as after a snapshot at 4): steps 5 and 6 are dropped from the first
    file and written again in a second one."""
    import shutil
    folder = str(tmp_path / 'run')
    shutil.copytree(os.path.join(logdir, 'adaptive'), folder)
    before = TB.timeline(folder)
    T.purge(folder, 5)
    kept = TB.timeline(folder)
    assert kept == [e for e in before if e[0] < 5 and
                    e[1] != '_hparams_/session_end_info']
    assert T._restart_index(TB.files(folder)) == 1


def test_log2_histogram_and_run_hparams():
    assert T.log2_histogram({-3: 2, 0: 5}) == (
        [-4, -3, -2, -1], [-3, -2, -1, 0], [2, 0, 0, 5])
    assert T.log2_histogram({-2.5: 1}) == ([-3.5], [-2.5], [1])
    info = {'name': 'resnet20-cifar10-adaptive-s0', 'table': 'table1',
            'model': 'resnet20', 'mode': 'adaptive:t_uf=0.001',
            'mode_options': {'t_uf': 0.001}, 'seed': 1,
            'precision': 'mixed16', 'git_commit': 'abc', 'status': 'running',
            'environment': {'python': '3.11'}, 'world_size': 1}
    assert T.run_hparams(info) == {
        'table': 'table1', 'model': 'resnet20',
        'mode': 'adaptive:t_uf=0.001', 'mode_options.t_uf': 0.001,
        'seed': 1, 'precision': 'mixed16',
        'world_size': 1, 'depth': 20}
    assert 'depth' not in T.run_hparams({'model': 'small_cnn'})


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _get(port, path, data=None):
    req = urllib.request.Request(
        'http://127.0.0.1:{}{}'.format(port, path),
        data=None if data is None else json.dumps(data).encode(),
        headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read().decode())


def test_tensorboard_serves_the_run(logdir):
    """``tensorboard --logdir`` (the venv's, on 127.0.0.1, a free port)
    lists the run, its scalar tags, alpha's values and its HParams; it is
    stopped by its process id."""
    exe = os.path.join(os.path.dirname(sys.executable), 'tensorboard')
    port = _free_port()
    proc = subprocess.Popen(
        [exe, '--logdir', logdir, '--host', '127.0.0.1', '--port',
         str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline, runs = time.time() + 90, None
        while time.time() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                runs = _get(port, '/data/runs')
                if runs:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert runs == ['adaptive']
        tags = _get(port, '/data/plugin/scalars/tags')['adaptive']
        assert {'main/loss', 'loss_scale', 'alpha/predictor/fc',
                'underflow_fp16/predictor/fc'} <= set(tags)
        series = _get(port, '/data/plugin/scalars/scalars?' +
                      urllib.parse.urlencode({
                          'run': 'adaptive', 'tag': 'alpha/predictor/fc'}))
        acc = TB.accumulator(os.path.join(logdir, 'adaptive'))
        assert [(s, v) for _, s, v in series] == [
            (e.step, e.value) for e in acc.Scalars('alpha/predictor/fc')]
        exp = _get(port, '/data/plugin/hparams/experiment',
                   {'experimentName': ''})
        assert {h['name'] for h in exp['hparamInfos']} == set(HPARAMS)
    finally:
        os.kill(proc.pid, signal.SIGTERM)     # TensorBoard exits cleanly
        proc.wait(timeout=30)
    assert proc.returncode in (0, -signal.SIGTERM)
    with pytest.raises(OSError):
        _get(port, '/data/runs')
