"""The N-worker simulator equals a real ChainerMN run, bit for bit
(``mpiexec -n 2`` and ``-n 4``, ``naive`` communicator, CPU).

Skipped only when mpiexec or mpi4py is missing (``./scripts/install.sh mpi``).
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, '..', '..')


def _mpiexec():
    venv_bin = os.path.dirname(sys.executable)
    path = shutil.which('mpiexec', path=venv_bin + os.pathsep +
                        os.environ.get('PATH', ''))
    try:
        import mpi4py  # NOQA
    except ImportError:
        return None
    return path


MPIEXEC = _mpiexec()


def mpirun(n, cases=(), worker='mpi_aps_worker.py'):
    if MPIEXEC is None:
        pytest.skip('mpiexec/mpi4py not installed (./scripts/install.sh mpi)')
    cmd = [MPIEXEC, '--allow-run-as-root', '--oversubscribe', '-n', str(n),
           sys.executable, os.path.join(HERE, worker)] + \
        list(cases)
    env = dict(os.environ, OMP_NUM_THREADS='1', OPENBLAS_NUM_THREADS='1')
    proc = subprocess.run(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith('RESULT ')][-1]
    return json.loads(line[len('RESULT '):])


TWO = ['adaptive_e5m2_kahan', 'fixed_e4m3_noaps', 'fp32_e3m0_hier_fc32',
       'wire:adaptive_e5m2_kahan', 'wire:fixed_e4m3_noaps',
       'wire:fp32_e3m0_hier_fc32', 'wire:hybrid_fp4_e2m1']


@pytest.fixture(scope='module')
def result():
    return mpirun(2, TWO)


@pytest.mark.parametrize('case', TWO)
def test_simulator_equals_two_process_chainermn(result, case):
    """4 steps of 2 ranks (APSCommunicator inside the loss-scale sync, the
    distributed updater) vs the 2-worker simulator in one process: every
    parameter and FP32 master weight bit-identical, on both ranks, and every
    shard's loss equal. Cases: adaptive (per-rank α differ) in mixed16 with
    e5m2 + Kahan; fixed:128 with e4m3 without APS; fp32 with e3m0,
    hierarchical order and the classifier kept in FP32; each also with codes
    on the wire (``wire:``), and the hybrid schedule (FP32 for two steps,
    then 4-bit fp4_e2m1) on the wire. The low-precision result differs from
    FP32 communication (so the comparison is not vacuous)."""
    check(result[case])
    assert result[case]['wire'] == case.startswith('wire:')


def check(r):
    assert r['iterations'] == 4 and r['skipped'] == 0
    assert r['ranks_identical']
    assert r['sim_identical'] and r['sim_vs_mpi'] == 0.0
    assert r['lowp_vs_fp32'] > 0
    assert r['losses'] == 4 * r['ranks'] and r['losses_equal']


def test_simulator_equals_four_process_chainermn():
    """The same with 4 ranks (hierarchical all-reduce, groups of 2): dynamic
    loss scaling in mixed16 with e4m3 + Kahan, and fp32 with e3m0 and the
    classifier in FP32, emulated and on the wire."""
    cases = ['dynamic_e4m3_hier_kahan', 'fp32_e3m0_hier_fc32',
             'wire:dynamic_e4m3_hier_kahan', 'wire:fp32_e3m0_hier_fc32']
    result = mpirun(4, cases)
    assert sorted(result) == sorted(cases)
    for case, r in result.items():
        assert r['ranks'] == 4
        check(r)
