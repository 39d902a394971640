"""scripts/gpu_depth_study.sh's arguments: LIMIT_S is optional, so
``OUT --set K=V`` must pass its override on whole (it used to take ``--set``
as the limit and pass a bare ``K=V``)."""
import os
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, 'scripts', 'gpu_depth_study.sh')


def _run(tmp_path, *args):
    fake = tmp_path / 'py.sh'
    fake.write_text('#!/bin/bash\necho "ARGS: $*"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / 'out'
    r = subprocess.run(['bash', SCRIPT, str(out)] + list(args),
                       env=dict(os.environ, PYTHON=str(fake)),
                       capture_output=True, text=True, timeout=60)
    return r, (out / 'grid_fp8.log').read_text()


@pytest.mark.parametrize('limit', [[], ['30']])
def test_overrides_reach_the_grids_with_or_without_a_limit(tmp_path, limit):
    r, log = _run(tmp_path, *(limit + ['--set', 'train.epochs=1']))
    assert 'integer expression' not in r.stderr
    assert '--set train.epochs=1' in log
