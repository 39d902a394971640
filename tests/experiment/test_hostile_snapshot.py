"""--resume on a run whose snapshot holds a pickled object (issue 50 item
5): the command stops with one ``error:`` line naming the file and runs no
code; it used to skip the file as unreadable and continue from
snapshot_previous (or afresh), overwriting it."""
from functools import partial
import os

import numpy

from ada_loss.experiment import runinfo as R
from ada_loss.experiment import runner
from ada_loss.experiment.studies.classification import STUDY

from npz_payloads import write_hostile

main = partial(runner.main, STUDY)


def test_resume_from_a_hostile_snapshot_stops(tiny_config, out_dir,
                                               tmp_path, capsys):
    path = tiny_config(grid={'modes': ['adaptive']})
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 0
    folder = os.path.join(out_dir, 'tiny', 'small_cnn-digits-adaptive-s0')
    snapshot = os.path.join(folder, 'snapshot_latest')
    with numpy.load(snapshot) as npz:
        arrays = {k: npz[k] for k in npz.files}
    key = sorted(k for k in arrays if k.endswith('/W'))[0]
    marker = tmp_path / 'ran'
    write_hostile(snapshot, arrays, key, marker)
    info = R.read_run(folder)
    info['status'] = R.RUNNING          # as if killed after the snapshot
    R.write_run(folder, info)
    kept = open(snapshot, 'rb').read()
    capsys.readouterr()
    status = main(['--config', path, '--out', out_dir, '--no-table',
                   '--resume'])
    assert not marker.exists(), 'the resume ran the code'
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith('error: {}: {} holds pickled'.format(snapshot,
                                                               key))
    assert len(err.strip().splitlines()) == 1
    with open(snapshot, 'rb') as f:
        assert f.read() == kept
