"""Runs killed with SIGKILL at chosen moments and resumed give the
uninterrupted run's numbers bit for bit.

Real subprocesses (``experiments/table1.py``) on a tiny CIFAR-10 folder
with the He et al. augmentation (random crop + flip) on: 3 iterations per
epoch, 8 iterations, an evaluation and a snapshot every 2 iterations. The
process kills itself at a named point (``ADA_LOSS_KILL_AT``,
:mod:`ada_loss.training.faults`), then ``--resume`` continues; every mode
is killed several times in one chain (just after an epoch boundary,
mid-epoch, during an evaluation, while a snapshot is written, between
keeping the previous snapshot and placing the new one). The final snapshot
(weights, FP32 master weights, optimizer and loss-scale state, iterator,
random streams), the log rows and ``loss_scales.csv`` must equal those of
the uninterrupted run; only wall-clock times differ. So must the
TensorBoard events (read back with TensorBoard's reader): each step once,
in order, the same values.
"""
import csv
import json
import math
import os
import signal
import subprocess
import sys

import numpy
import pytest
import yaml

import ondisk_fixtures
import tensorboard_events as TB

from ada_loss.training.faults import ENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
MODES = ('fixed:64', 'dynamic:growth_interval=2', 'adaptive',
         'adaptive:fmt=fp8_e4m3,init_scale=auto')
TIME_KEYS = ('elapsed_time', '_snapshot_elapsed_time')
#: each kill (point:count, counted from the start of that process) and the
#: iteration of the snapshot it resumes from: 3 iterations per epoch,
#: snapshots at 2, 4, 6, 8; evaluations at 2, 4, 6, 8 (2 batches each)
CHAIN = (
    'train_batch:4',      # iteration 4 = first of epoch 1; resumes at 2
    'eval_batch:2',       # 2nd batch of the evaluation at 4; resumes at 2
    'snapshot_write:1',   # writing the snapshot of 4; resumes at 2
    'train_batch:4',      # iteration 6, mid-epoch 1; resumes at 4
    'snapshot_rotate:1',  # snapshot of 6: previous kept, new not in place
)


def write_config(folder, cifar, modes=MODES, **train):
    cfg = {
        'table': 'kill',
        'grid': {'models': ['small_cnn'], 'datasets': ['cifar10'],
                 'modes': list(modes), 'seeds': [0]},
        'model': {'width': 4},
        'data': {'cifar_root': cifar, 'augment': True},
        'train': dict({'batchsize': 16, 'lr': 0.05, 'epochs': 3,
                       'max_iterations': 8, 'eval_batchsize': 8,
                       'lr_steps': [2]}, **train),
        'log': {'log_interval': '1 iteration',
                'eval_interval': '2 iteration',
                'snapshot_interval': '2 iteration',
                'loss_scale_interval': 1, 'progress': 'none',
                'plot': False},
    }
    path = os.path.join(str(folder), 'kill.yaml')
    with open(path, 'w') as f:
        yaml.safe_dump(cfg, f)
    return path


def run(config, out, *args, kill=None):
    env = dict(os.environ)
    env.pop(ENV, None)
    if kill:
        env[ENV] = kill
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, 'experiments', 'table1.py'),
         '--config', config, '--out', out, '--no-table'] + list(args),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def killed(proc):
    return proc.returncode == -signal.SIGKILL


def run_state(folder):
    """What must not depend on interruptions: every array of the final
    snapshot, the log rows and loss_scales.csv (times left out)."""
    with numpy.load(os.path.join(folder, 'snapshot_latest')) as npz:
        arrays = {k: npz[k] for k in npz.files if k not in TIME_KEYS}
    log = json.loads(str(arrays.pop('extensions/LogReport/_log')))
    for row in log:
        row.pop('elapsed_time')
    with open(os.path.join(folder, 'log')) as f:
        log_file = json.load(f)
    for row in log_file:
        row.pop('elapsed_time')
    scales = None
    if os.path.exists(os.path.join(folder, 'loss_scales.csv')):
        with open(os.path.join(folder, 'loss_scales.csv')) as f:
            scales = list(csv.reader(f))
    with open(os.path.join(folder, 'run.json')) as f:
        info = json.load(f)
    results = {k: info[k] for k in (
        'status', 'final_test_accuracy', 'best_test_accuracy',
        'final_test_loss', 'final_train_loss', 'skipped_steps',
        'iterations', 'epoch', 'loss_scale', 'blas_threads')}
    return arrays, log, log_file, scales, results


def assert_same_run(folder, reference, events=True):
    arrays, log, log_file, scales, results = run_state(folder)
    ref_arrays, ref_log, ref_log_file, ref_scales, ref_results = \
        run_state(reference)
    assert sorted(arrays) == sorted(ref_arrays)
    for key in ref_arrays:
        assert arrays[key].dtype == ref_arrays[key].dtype, key
        assert arrays[key].tobytes() == ref_arrays[key].tobytes(), key
    assert log == ref_log
    assert log_file == ref_log_file
    assert len(log) == 8
    assert scales == ref_scales
    assert results == ref_results
    if events:
        assert_same_events(folder, reference)


def assert_same_events(folder, reference):
    """The run's TensorBoard events, in file order, are the reference
    run's (wall-clock times aside): each step of each tag once, in order;
    one HParams session start and one end."""
    events, ref_events = TB.timeline(folder), TB.timeline(reference)
    assert events == ref_events
    for tag, steps in TB.steps_by_tag(events).items():
        assert steps == sorted(set(steps)), tag
    tags = [t for _, t, _ in events]
    assert tags.count('_hparams_/session_start_info') == 1
    assert tags.count('_hparams_/session_end_info') == 1


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """The tiny CIFAR folder, the config and the uninterrupted runs of
    every mode (one process)."""
    base = tmp_path_factory.mktemp('kill')
    cifar = ondisk_fixtures.make_cifar10(str(base))
    config = write_config(base, cifar)
    ref = os.path.join(str(base), 'reference')
    proc = run(config, ref)
    assert proc.returncode == 0, proc.stderr
    return config, os.path.join(ref, 'kill'), base


def cell(mode):
    return 'small_cnn-cifar10-{}-s0'.format(
        mode.replace(':', '_').replace(',', '_'))


def run_killed_twice(config, tmp_path, mode, *args):
    """The same run uninterrupted and killed twice (mid-epoch, then while
    writing a snapshot) and resumed to the end; returns the killed run's
    folder and the uninterrupted one's, both finished."""
    whole = str(tmp_path / 'whole')
    proc = run(config, whole, *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = str(tmp_path / 'killed')
    for i, kill in enumerate(('train_batch:5', 'snapshot_write:1')):
        proc = run(config, out, *args, *(['--resume'] if i else []),
                   kill=kill)
        assert killed(proc), (kill, proc.returncode, proc.stderr[-2000:])
    proc = run(config, out, *args, '--resume')
    assert proc.returncode == 0, proc.stderr[-2000:]
    return (os.path.join(out, 'kill', cell(mode)),
            os.path.join(whole, 'kill', cell(mode)))


@pytest.mark.parametrize('mode', MODES)
def test_killed_and_resumed_run_is_bit_identical(tiny, mode, tmp_path):
    config, ref, _ = tiny
    out = str(tmp_path)
    folder = os.path.join(out, 'kill', cell(mode))
    for i, kill in enumerate(CHAIN):
        proc = run(config, out, '--only', 'mode=' + mode,
                   *(['--resume'] if i else []), kill=kill)
        assert killed(proc), (kill, proc.returncode, proc.stderr[-2000:])
    # the kill while writing the snapshot left its temporary file behind
    assert any(n.startswith('.tmp_snapshot') for n in os.listdir(folder))
    proc = run(config, out, '--only', 'mode=' + mode, '--resume')
    assert proc.returncode == 0, proc.stderr
    assert not [n for n in os.listdir(folder) if n.startswith('.tmp_')]
    assert_same_run(folder, os.path.join(ref, cell(mode)))
    # one file per process that wrote past the snapshot it resumed from
    assert 1 < len(TB.files(folder)) <= len(CHAIN) + 1
    with open(os.path.join(folder, 'run.json')) as f:
        info = json.load(f)
    assert info['resumed'] and info['resumed_from'] == 'snapshot_latest'


def _kill_after_snapshot_6(config, out, mode):
    proc = run(config, out, '--only', 'mode=' + mode, kill='train_batch:7')
    assert killed(proc), proc.stderr
    return os.path.join(out, 'kill', cell(mode))


def _corrupt(path):
    with open(path, 'r+b') as f:       # truncated: as if cut off mid-write
        f.truncate(os.path.getsize(path) // 2)


def test_unreadable_snapshot_falls_back_to_the_previous(tiny, tmp_path):
    config, ref, _ = tiny
    mode = 'adaptive'
    folder = _kill_after_snapshot_6(config, str(tmp_path), mode)
    _corrupt(os.path.join(folder, 'snapshot_latest'))
    proc = run(config, str(tmp_path), '--only', 'mode=' + mode, '--resume')
    assert proc.returncode == 0, proc.stderr
    assert 'snapshot_latest is unreadable' in proc.stderr
    assert 'falling back to snapshot_previous (iteration 4)' in proc.stderr
    assert_same_run(folder, os.path.join(ref, cell(mode)))
    with open(os.path.join(folder, 'run.json')) as f:
        assert json.load(f)['resumed_from'] == 'snapshot_previous'


def test_no_readable_snapshot_starts_afresh_and_says_so(tiny, tmp_path):
    config, ref, _ = tiny
    mode = 'fixed:64'
    folder = _kill_after_snapshot_6(config, str(tmp_path), mode)
    _corrupt(os.path.join(folder, 'snapshot_latest'))
    with open(os.path.join(folder, 'snapshot_previous'), 'wb') as f:
        f.write(b'not a snapshot')
    proc = run(config, str(tmp_path), '--only', 'mode=' + mode, '--resume')
    assert proc.returncode == 0, proc.stderr
    assert 'snapshot_previous is unreadable' in proc.stderr
    assert 'no readable snapshot (snapshot_latest, snapshot_previous): ' \
        'starting afresh' in proc.stderr
    assert_same_run(folder, os.path.join(ref, cell(mode)))
    with open(os.path.join(folder, 'run.json')) as f:
        info = json.load(f)
    assert info['resumed_from'] is None and not info['resumed']


def test_kill_after_the_last_snapshot(tiny, tmp_path):
    """Killed after the final snapshot (iteration 8), before run.json and
    the TensorBoard session end: --resume trains nothing and gives the
    reference's run.json, α range included, and finalized event files
    (issue 39 item 10; with config.yaml deleted --resume refuses instead:
    tests/experiment/test_run_rules.py)."""
    config, ref, _ = tiny
    mode = 'adaptive'
    out = str(tmp_path)
    proc = run(config, out, '--only', 'mode=' + mode,
               kill='snapshot_done:4')
    assert killed(proc), proc.stderr
    folder = os.path.join(out, 'kill', cell(mode))
    with open(os.path.join(folder, 'run.json')) as f:
        assert json.load(f)['status'] == 'running'
    proc = run(config, out, '--only', 'mode=' + mode, '--resume')
    assert proc.returncode == 0, proc.stderr
    assert_same_run(folder, os.path.join(ref, cell(mode)))
    infos = []
    for f in (folder, os.path.join(ref, cell(mode))):
        with open(os.path.join(f, 'run.json')) as fh:
            infos.append(json.load(fh))
    assert infos[0]['alpha_min'] is not None
    assert (infos[0]['alpha_min'], infos[0]['alpha_max']) == \
        (infos[1]['alpha_min'], infos[1]['alpha_max'])


@pytest.mark.parametrize('both', [False, True])
def test_snapshot_missing_arrays_falls_back(tiny, tmp_path, both):
    """A snapshot that opens but lacks arrays the trainer needs is
    unreadable like a truncated one: snapshot_previous is used (issue 39
    item 12; was a KeyError from load_npz), from the state the trainer was
    built in (the checked load's half undone), and the run still ends as
    the reference; when both lack some, the run stops and keeps them
    (issue 36: never overwrite a snapshot)."""
    config, ref, _ = tiny
    mode = 'adaptive'
    folder = _kill_after_snapshot_6(config, str(tmp_path), mode)
    for name in ('snapshot_latest', 'snapshot_previous')[:1 + both]:
        path = os.path.join(folder, name)
        with numpy.load(path) as npz:
            arrays = {k: npz[k] for k in npz.files}
        # the model's arrays load first: some are read before the KeyError
        for k in sorted(k for k in arrays if k.startswith(
                'updater/optimizer:main/'))[-3:]:
            del arrays[k]
        with open(path, 'wb') as f:
            numpy.savez(f, **arrays)
    kept = {n: open(os.path.join(folder, n), 'rb').read()
            for n in ('snapshot_latest', 'snapshot_previous')}
    proc = run(config, str(tmp_path), '--only', 'mode=' + mode, '--resume')
    assert 'snapshot_latest does not fit this run: lacks updater/' \
        'optimizer:main/' in proc.stderr
    if both:
        # nothing fits: the run stops (one error line, status 2) and keeps
        # its snapshots (starting afresh would overwrite them; --force does)
        assert proc.returncode == 2, proc.stderr
        assert 'cannot resume' in proc.stderr
        for n, data in kept.items():
            with open(os.path.join(folder, n), 'rb') as f:
                assert f.read() == data, n
        return
    assert proc.returncode == 0, proc.stderr
    assert 'falling back to snapshot_previous (iteration 4)' in proc.stderr
    assert_same_run(folder, os.path.join(ref, cell(mode)))


def test_jobs_do_not_change_the_numbers(tiny, tmp_path):
    """--jobs 2 (worker processes) and --jobs 1 (in process, after the
    reference) give the same run.json results and final snapshots; the
    TensorBoard writer (off here) changes none of them."""
    config, ref, _ = tiny
    out = str(tmp_path)
    # (and with the TensorBoard writer off: it writes nothing and changes
    # no number)
    proc = run(config, out, '--jobs', '2', '--set', 'log.tensorboard=false')
    assert proc.returncode == 0, proc.stderr
    for mode in MODES:
        assert_same_run(os.path.join(out, 'kill', cell(mode)),
                        os.path.join(ref, cell(mode)), events=False)
        assert TB.files(os.path.join(out, 'kill', cell(mode))) == []
        with open(os.path.join(out, 'kill', cell(mode), 'run.json')) as f:
            env = json.load(f)['environment']
        assert env['numpy'] == numpy.__version__ and env['blas']


def test_probed_run_killed_and_resumed_writes_the_same_probe(tiny, tmp_path):
    """``log.probe_every`` (in an emulated precision, where the probe
    sees the GEMMs): the probe's rows (probe.csv) and the run's state after
    two kills and resumes equal those of an uninterrupted run."""
    config, _, _ = tiny
    mode = MODES[-1]
    args = ('--only', 'mode=' + mode, '--set', 'log.probe_every=3',
            '--set', 'train.precision=fp8_e4m3')
    folder, reference = run_killed_twice(config, tmp_path, mode, *args)

    def probe(folder):
        with open(os.path.join(folder, 'probe.csv')) as f:
            return list(csv.reader(f))
    rows = probe(folder)
    assert rows == probe(reference)
    # steps 1, 3, 6 of 8, every GEMM layer of the small CNN
    assert sorted({int(r[1]) for r in rows[1:]}) == [1, 3, 6]
    # in TensorBoard: the probe's rates and log2|g| histograms per layer at
    # the probed steps (the events as a whole: assert_same_run below)
    steps = TB.steps_by_tag(TB.timeline(folder))
    layers = {r[3] for r in rows[1:]}
    for group in ('underflow_in', 'overflow_in', 'underflow_out',
                  'overflow_out', 'log2_abs_grad'):
        for layer in layers:
            assert steps[group + '/' + layer] == [1, 3, 6], (group, layer)
    header, scalars = rows[0], TB.scalars(folder)
    for r in rows[1:]:
        got = dict(scalars['overflow_in/' + r[3]])[int(r[1])]
        assert got == pytest.approx(float(r[header.index('of_in')]),
                                    rel=1e-5, abs=1e-7)
    assert_same_run(folder, reference)


def test_resume_with_the_plots_and_the_probe_turned_on(tiny, tmp_path):
    """A snapshot written with ``log.plot`` and ``log.probe_every`` off
    resumes with them on: the plots start empty, the probe's rows carry the
    trainer's iterations (the first resumed step, then its own schedule)."""
    config, _, _ = tiny
    mode = MODES[-1]
    args = ('--only', 'mode=' + mode, '--set', 'train.precision=fp8_e4m3')
    out = str(tmp_path)
    proc = run(config, out, *args, kill='train_batch:5')   # resumes at 4
    assert killed(proc), proc.stderr[-2000:]
    proc = run(config, out, *args, '--resume', '--set', 'log.plot=true',
               '--set', 'log.probe_every=2')
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = os.path.join(out, 'kill', cell(mode))
    with open(os.path.join(folder, 'probe.csv')) as f:
        rows = list(csv.DictReader(f))
    assert sorted({int(r['iteration']) for r in rows}) == [5, 6, 8]
    assert os.path.exists(os.path.join(folder, 'loss.png'))


def test_recorded_run_is_the_reference_run_plus_records(tiny, tmp_path):
    """``log.record_every``: the activation-gradient records (the figures'
    statistics) of a Table 1 run, written as it goes; recording does not
    change the run."""
    config, ref, _ = tiny
    out = str(tmp_path)
    proc = run(config, out, '--only', 'mode=adaptive', '--set',
               'log.record_every=3')
    assert proc.returncode == 0, proc.stderr[-2000:]
    folder = os.path.join(out, 'kill', cell('adaptive'))
    with open(os.path.join(folder, 'records.csv')) as f:
        rows = list(csv.DictReader(f))
    assert sorted({int(r['iteration']) for r in rows}) == [1, 3, 6]
    assert {r['layer'] for r in rows} >= {'predictor/fc'}
    # in TensorBoard, per layer at the recorded steps: the FP16 underflow
    # rate and the histogram of log2|g| of the true gradient (its nonzero
    # entries)
    acc = TB.accumulator(folder)
    for r in rows:
        it, layer = int(r['iteration']), r['layer']
        under = dict((e.step, e.value) for e in
                     acc.Scalars('underflow_fp16/' + layer))
        assert under[it] == pytest.approx(float(r['underflow_rate']),
                                          rel=1e-6, abs=1e-9)
        hist = {e.step: e.histogram_value for e in
                acc.Histograms('log2_abs_grad/' + layer)}[it]
        assert hist.num == int(r['nonzero'])
        # the k-th smallest nonzero |g| (1 / the expected loss scale) lies
        # in the histogram's range
        kth = -math.log2(float(r['expected_loss_scale']))
        assert hist.min <= kth <= hist.max
    arrays, log, _, scales, results = run_state(folder)
    ref_arrays, ref_log, _, ref_scales, ref_results = run_state(
        os.path.join(ref, cell('adaptive')))
    # the snapshot has the recorder's state besides the reference's
    assert set(ref_arrays) < set(arrays)
    for key in ref_arrays:
        assert arrays[key].tobytes() == ref_arrays[key].tobytes(), key
    assert (log, scales, results) == (ref_log, ref_scales, ref_results)


def test_delayed_fp8_amax_histories_survive_kill_and_resume(tiny, tmp_path):
    """The delayed recipe's amax histories and scales are training state:
    in the snapshot (one entry per GEMM layer and operand role), and a run
    killed mid-epoch and while writing a snapshot, then resumed, equals the
    uninterrupted run bit for bit. Without them a resumed run restarts
    every scale at 1 with an empty history, and its losses differ."""
    config, _, _ = tiny
    mode = 'fixed:64'
    args = ('--only', 'mode=' + mode, '--set',
            'train.precision=fp8:recipe=delayed,history=3')
    folder, reference = run_killed_twice(config, tmp_path, mode, *args)
    assert_same_run(folder, reference)
    arrays = run_state(folder)[0]
    keys = [k for k in arrays if k.endswith('gemm_scaling/gy/amax_history')]
    assert len(keys) == 4                 # conv1..3, fc
    history = arrays[keys[0]]
    assert history.shape == (3,) and (history > 0).all()


def test_events_match_log_csv_and_loss_scales_csv(tiny):
    """The uninterrupted adaptive run's event file, read by TensorBoard's
    EventAccumulator: every column of log.csv at its iterations, one
    alpha/<layer> and beta/<layer> per GEMM layer with loss_scales.csv's
    values, the run's settings as an HParams session."""
    _, ref, _ = tiny
    folder = os.path.join(ref, cell('adaptive'))
    scalars = TB.scalars(folder)
    with open(os.path.join(folder, 'log.csv')) as f:
        log = list(csv.DictReader(f))
    assert len(log) == 8
    for key in log[0]:
        if key == 'iteration':
            continue
        want = [(int(r['iteration']), float(r[key])) for r in log
                if r[key] != '']
        got = scalars[key]
        assert [s for s, _ in got] == [s for s, _ in want], key
        assert [v for _, v in got] == pytest.approx(
            [v for _, v in want], rel=1e-6), key
    assert {'validation/main/accuracy', 'loss_scale', 'lr',
            'skipped_steps', 'main/loss'} <= set(scalars)
    with open(os.path.join(folder, 'loss_scales.csv')) as f:
        rows = list(csv.DictReader(f))
    layers = {r['layer'] for r in rows}
    assert len(layers) == 4            # the small CNN's GEMMs
    assert {t for t in scalars if t.startswith('alpha/')} == \
        {'alpha/' + layer for layer in layers}
    for r in rows:
        it = int(r['iteration'])
        assert dict(scalars['alpha/' + r['layer']])[it] == float(r['alpha'])
        assert dict(scalars['beta/' + r['layer']])[it] == float(r['beta'])
    events = TB.timeline(folder)
    start = [w for _, t, w in events if t == '_hparams_/session_start_info']
    assert len(start) == 1
    hp = json.loads(start[0])['sessionStartInfo']['hparams']
    assert (hp['mode'], hp['model'], hp['dataset'], hp['seed'],
            hp['precision']) == ('adaptive', 'small_cnn', 'cifar10', 0,
                                 'mixed16')
    assert events[-1][1:] == ('_hparams_/session_end_info', 1)  # SUCCESS


def test_nvfp4_stochastic_rounding_survives_kill_and_resume(tmp_path):
    """NVFP4's stochastic rounding draws from counter-based streams keyed
    by each layer's step counter, which is in the snapshot: a run killed
    mid-epoch and while writing a snapshot, then resumed, equals the
    uninterrupted run bit for bit (with the counter restarted at 0 the
    resumed steps would reuse the first steps' random words)."""
    mode = 'none'
    cifar = ondisk_fixtures.make_cifar10(str(tmp_path))
    config = write_config(tmp_path, cifar, modes=(mode,), precision='nvfp4')
    args = ()
    folder, reference = run_killed_twice(config, tmp_path, mode, *args)
    assert_same_run(folder, reference)
    arrays = run_state(folder)[0]
    steps = {k: int(v) for k, v in arrays.items()
             if k.endswith('gemm_scaling/sr_step')}
    assert len(steps) == 4                 # conv1..3, fc
    # 8 steps, two stochastic casts of gy each (dgrad, wgrad); conv1 has
    # no dgrad (its input needs no gradient)
    assert sorted(steps.values()) == [8, 16, 16, 16]
