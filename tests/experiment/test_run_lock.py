"""A run folder is locked while a process trains in it: a second process
on the same folder gets a clear error naming the folder and the holder's
pid, and the lock goes away when the holder exits or is killed."""
import os
import signal
import subprocess
import sys
import time
from functools import partial

import pytest

from ada_loss.experiment import runner
from ada_loss.experiment.runner import RunFolderLock, RunFolderLocked
from ada_loss.experiment.studies.classification import STUDY

main = partial(runner.main, STUDY)

HOLD = '''
import sys, time
from ada_loss.experiment.runner import RunFolderLock
lock = RunFolderLock(sys.argv[1]).acquire()
print('locked', flush=True)
time.sleep(600)
'''


def hold(folder):
    """A process that holds the lock of ``folder`` until killed."""
    proc = subprocess.Popen([sys.executable, '-c', HOLD, folder],
                            stdout=subprocess.PIPE, universal_newlines=True)
    assert proc.stdout.readline().strip() == 'locked'
    return proc


def test_second_process_gets_a_clear_error(tiny_config, out_dir, capsys):
    path = tiny_config()
    folder = os.path.join(out_dir, 'tiny', 'small_cnn-digits-fp32-s0')
    holder = hold(folder)
    try:
        assert main(['--config', path, '--out', out_dir]) == 2
        err = capsys.readouterr().err
        assert folder in err and 'process {}'.format(holder.pid) in err
        assert not os.path.exists(os.path.join(folder, 'run.json'))
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the killed holder's lock: the run goes ahead
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 0
    assert os.path.exists(os.path.join(folder, 'run.json'))


def test_lock_is_exclusive_and_released(tmp_path):
    folder = str(tmp_path / 'table' / 'run')
    with RunFolderLock(folder):
        with pytest.raises(RunFolderLocked, match=str(os.getpid())):
            # flock locks belong to the open file: a second open conflicts
            RunFolderLock(folder).acquire()
    RunFolderLock(folder).acquire().release()
    holder = hold(folder)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    deadline = time.time() + 10
    while True:
        try:
            RunFolderLock(folder).acquire().release()
            break
        except RunFolderLocked:
            assert time.time() < deadline
            time.sleep(0.1)
