"""ChainerMN data parallelism on CPU: 2 processes under mpiexec.

Skipped only when mpiexec or mpi4py is missing (``./scripts/install.sh mpi``
installs both into the venv).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy
import pytest

import tensorboard_events as TB

from ada_loss.experiment import runinfo as R
from ada_loss.experiment import runner
from ada_loss.experiment.studies.classification import STUDY

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, '..', '..')


def _mpiexec():
    venv_bin = os.path.dirname(sys.executable)
    path = shutil.which('mpiexec', path=venv_bin + os.pathsep +
                        os.environ.get('PATH', ''))
    if path is None:
        return None, 'mpiexec not found (install: ./scripts/install.sh mpi)'
    try:
        import mpi4py  # NOQA
    except ImportError:
        return None, ('mpi4py not importable (install: ./scripts/install.sh '
                      'mpi)')
    return path, None


MPIEXEC, WHY = _mpiexec()
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason=str(WHY))


def mpirun(args, timeout=240):
    cmd = [MPIEXEC, '--allow-run-as-root', '--oversubscribe', '-n', '2',
           sys.executable] + args
    env = dict(os.environ, OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1')
    proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=timeout, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc.stdout


def worker(scenario):
    out = mpirun([os.path.join(HERE, 'mpi_worker.py'), scenario])
    line = [x for x in out.splitlines() if x.startswith('RESULT ')][-1]
    return json.loads(line[len('RESULT '):])


def test_loss_scale_sync_unit():
    """Ranks hold one FP16 gradient at α = 2^10 and 2^11: after the sync
    both use α* = 2^10 and the unscaled mean is right to FP16 rounding;
    ChainerMN's plain mean of the scaled arrays is off by ~25-50%."""
    for r in worker('unit'):
        assert r['loss_scale'] == 1024.0 and r['dtype'] == 'float16'
        assert r['synced_err'] <= 2.0 ** -11
        assert r['naive_err'] > 0.1
        assert r['unused_grad_zero']


def test_identical_weights_on_both_ranks():
    """mixed16, scattered data, the distributed updater: parameters and FP32
    master weights bit-identical across ranks after 4 steps, for fixed,
    dynamic and adaptive (whose local α differ between the ranks)."""
    result = worker('identical')
    for mode, r in result.items():
        assert r['max_diff'] == 0.0, mode
        assert r['iterations'] == 4, mode
    assert result['adaptive']['alpha_differed']


def test_float32_adaptive_matches_single_process():
    """float32 adaptive on 2 ranks (half a batch each, per-rank α) equals
    one process on the whole batch up to float32 rounding; averaging the
    scaled gradients without the α sync does not."""
    r = worker('reference')
    assert r['ranks_diff'] == 0.0
    assert r['synced_vs_ref'] < 1e-4
    if r['alpha_differed']:
        assert r['naive_vs_ref'] > 1e-2


def test_table_runner_under_mpiexec(tiny_config, out_dir):
    path = tiny_config(grid={'modes': ['fixed:128', 'adaptive']},
                       train={'max_iterations': 3})
    out = mpirun([os.path.join(ROOT, 'experiments', 'table1.py'),
                  '--config', path, '--out', out_dir, '--mpi',
                  '--set', 'log.record_every=2'])
    assert out.count('**Table 1') == 1          # printed by rank 0 only
    for slug in ('fixed_128', 'adaptive'):
        folder = os.path.join(out_dir, 'tiny',
                              'small_cnn-digits-{}-s0'.format(slug))
        info = R.read_run(folder)
        assert info['status'] == 'finished' and info['world_size'] == 2
        assert info['iterations'] == 3
        assert os.path.exists(os.path.join(folder, R.SNAPSHOT))
        # rank 0 records its shard's gradient statistics
        with open(os.path.join(folder, 'records.csv')) as f:
            iterations = {row.split(',')[0] for row in f.readlines()[1:]}
        assert iterations == {'1', '2'}
        # and rank 0 alone writes TensorBoard events: one file, each step
        # once (TensorBoard's reader)
        assert len(TB.files(folder)) == 1
        steps = TB.steps_by_tag(TB.timeline(folder))
        assert steps['main/loss'] == [1, 2, 3]
        assert steps['underflow_fp16/predictor/fc'] == [1, 2]


def test_low_precision_communication_on_the_wire(tiny_config, out_dir):
    """``comm.format`` under --mpi: the gradients travel as e4m3 codes with
    APS (``comm.wire``), and the run equals the emulated all-reduce of the
    same policy bit for bit (weights and log)."""
    finals = {}
    for wire in ('true', 'false', 'fp32'):
        path = tiny_config(grid={'modes': ['adaptive']},
                           train={'max_iterations': 3},
                           table='wire_' + wire)
        sets = ['--set', 'comm.format=e4m3', '--set', 'comm.kahan=true',
                '--set', 'comm.wire=' + wire] if wire != 'fp32' else []
        mpirun([os.path.join(ROOT, 'experiments', 'table1.py'),
                '--config', path, '--out', out_dir, '--mpi'] + sets)
        folder = os.path.join(out_dir, 'wire_' + wire,
                              'small_cnn-digits-adaptive-s0')
        info = R.read_run(folder)
        assert info['status'] == 'finished' and info['world_size'] == 2
        with open(os.path.join(folder, 'config.yaml')) as f:
            assert ('format: e4m3' in f.read()) == (wire != 'fp32')
        with numpy.load(os.path.join(folder, R.SNAPSHOT)) as snap:
            finals[wire] = {k: snap[k] for k in snap.files
                            if k.startswith('updater/model:main/')}
        with open(os.path.join(folder, 'log.csv')) as f:
            finals[wire]['log'] = [row.split(',')[:4] for row in f]
    assert finals['true'].keys() == finals['false'].keys()
    assert len(finals['true']) > 5
    for k in finals['true']:
        if k == 'log':
            assert finals['true'][k] == finals['false'][k]
        else:
            assert numpy.array_equal(finals['true'][k], finals['false'][k]), k
    # and e4m3 communication is not ChainerMN's FP32 averaging
    assert any(not numpy.array_equal(finals['true'][k], finals['fp32'][k])
               for k in finals['true'] if k != 'log')


def test_low_precision_communication_needs_ranks(tiny_config, out_dir,
                                                 capsys):
    path = tiny_config()
    assert runner.main(STUDY, ['--config', path, '--out', out_dir,
                               '--set', 'comm.format=e4m3']) == 2
    err = capsys.readouterr().err
    assert "'comm.format'" in err and '--mpi' in err
    assert not os.path.exists(out_dir)
