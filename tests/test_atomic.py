"""ada_loss.atomic: a failed write leaves the old file and no temporary."""
import os

import pytest

from ada_loss import atomic


def test_write_replaces_and_failure_keeps_the_old_file(tmp_path):
    path = str(tmp_path / 'run.json')
    atomic.write_text(path, 'old')
    assert open(path).read() == 'old'
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)

    def fail(f):
        f.write('half')
        raise RuntimeError('killed')
    with pytest.raises(RuntimeError):
        atomic.replace_with(path, fail)
    assert open(path).read() == 'old'
    assert os.listdir(str(tmp_path)) == ['run.json']
