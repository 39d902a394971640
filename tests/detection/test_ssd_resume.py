"""The SSD runner resumes exactly after SIGKILL, and its numbers do not
depend on the number of data-loading processes.

A tiny SSD (``ssd_tiny``) on the 4-image VOC fixture with the full random
augmentation (photometric distortion, zoom out, IoU-constrained crop,
random interpolation, flip): the uninterrupted run loads in this process
(``loaderjobs 0``), the interrupted one in 2 worker processes and is killed
mid-run (2 iterations per epoch: the resume from iteration 2 crosses two
epoch boundaries) and while writing a snapshot. Its final snapshot and log
rows equal the uninterrupted run's bit for bit.
"""
import json
import os
import signal
import subprocess
import sys

import numpy

from ada_loss.training.faults import ENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CELL = 'ssd_tiny-b2-adaptive-s0'


def run(voc_root, out, *args, kill=None, jobs=0):
    sets = ['grid.model=ssd_tiny', 'grid.batch_sizes=[2]',
            'grid.modes=[adaptive]', 'grid.fixed_scales=[]',
            'data.voc_root=' + voc_root, 'data.photometric=true',
            'data.loaderjobs={}'.format(jobs), 'train.iterations=6',
            'train.lr_steps=[3]', 'log.log_interval=1 iteration',
            'log.eval_interval=3 iteration',
            'log.snapshot_interval=2 iteration', 'log.progress=none']
    env = dict(os.environ)
    env.pop(ENV, None)
    if kill:
        env[ENV] = kill
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, 'experiments', 'table3_ssd.py'),
         '--config', os.path.join(ROOT, 'configs', 'table3_ssd.yaml'),
         '--out', out] + sum((['--set', s] for s in sets), []) + list(args),
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def final_state(folder):
    with numpy.load(os.path.join(folder, 'snapshot_latest')) as npz:
        arrays = {k: npz[k] for k in npz.files
                  if k != '_snapshot_elapsed_time'}
    log = json.loads(str(arrays.pop('extensions/LogReport/_log')))
    for row in log:
        row.pop('elapsed_time')
    return arrays, log


def test_ssd_killed_and_resumed_with_workers_is_bit_identical(voc_root,
                                                               tmp_path):
    ref = str(tmp_path / 'ref')
    proc = run(voc_root, ref)
    assert proc.returncode == 0, proc.stderr
    out = str(tmp_path / 'killed')
    for i, kill in enumerate(('train_batch:4', 'snapshot_write:1')):
        proc = run(voc_root, out, *(['--resume'] if i else []), kill=kill,
                   jobs=2)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    proc = run(voc_root, out, '--resume', jobs=2)
    assert proc.returncode == 0, proc.stderr
    arrays, log = final_state(os.path.join(out, 'table3_ssd', CELL))
    ref_arrays, ref_log = final_state(os.path.join(ref, 'table3_ssd', CELL))
    assert len(log) == 6 and log == ref_log
    assert sorted(arrays) == sorted(ref_arrays)
    for key, value in ref_arrays.items():
        assert arrays[key].tobytes() == value.tobytes(), key
    with open(os.path.join(out, 'table3_ssd', CELL, 'run.json')) as f:
        info = json.load(f)
    assert info['resumed_from'] == 'snapshot_latest'
    assert info['status'] == 'finished' and info['blas_threads'] == 1
