"""``--table-only`` trains nothing in every entry (issue 39 item 4): on an
empty results folder it is one ``error:`` line and status 2, nothing
created; the depth study's Fig. 4 runs are not trained by it either."""
import glob
import json
import os
import runpy
import sys

import pytest

from ada_loss.experiment import recipe as RC
from ada_loss.experiment import run_folder
from ada_loss.experiment import runner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
ENTRIES = sorted(os.path.basename(p) for p in glob.glob(
    os.path.join(ROOT, 'experiments', '*.py')))


@pytest.fixture
def no_training(monkeypatch):
    """Every run takes its folder's lock and opens its folder (the
    recipe's, or a computing study's): both fail the test."""
    def trained(*args, **kwargs):
        raise AssertionError('--table-only trained a run')
    monkeypatch.setattr(runner.RunFolderLock, 'acquire', trained)
    monkeypatch.setattr(RC, 'open_run', trained)
    monkeypatch.setattr(run_folder, 'open_run', trained)


def entry(name, *argv):
    """Runs ``experiments/<name>`` in this process; its exit status."""
    old = sys.argv
    sys.argv = [name] + list(argv)
    try:
        runpy.run_path(os.path.join(ROOT, 'experiments', name),
                       run_name='__main__')
    except SystemExit as e:
        return e.code
    finally:
        sys.argv = old
    return 0


def test_every_entry_is_listed():
    assert len(ENTRIES) == 13


@pytest.mark.parametrize('name', ENTRIES)
def test_table_only_on_an_empty_folder(name, tmp_path, capsys, no_training):
    out = tmp_path / 'empty'
    assert entry(name, '--out', str(out), '--table-only') == 2
    captured = capsys.readouterr()
    assert captured.err.startswith('error: no runs under ')
    assert len(captured.err.splitlines()) == 1
    assert 'Traceback' not in captured.err + captured.out
    assert not out.exists()


def test_depth_table_only_does_not_train_fig4(tmp_path, capsys,
                                             no_training):
    """A finished fixed run makes Fig. 4 want its three probed runs: with
    --table-only none is trained (the issue: three ResNet-110 runs)."""
    out = tmp_path / 'out'
    run = (out / 'depth_study' / 'fp8_e4m3' /
           'resnet20-fashion_mnist-fixed_16-s0')
    run.mkdir(parents=True)
    (run / 'run.json').write_text(json.dumps({
        'name': run.name, 'status': 'finished', 'seed': 0,
        'final_test_accuracy': 0.5, 'skipped_steps': 0}))
    sets = ['grid.models=[resnet20]', 'grid.seeds=[0]', 'grid.modes=[]',
            'grid.fixed_scales=[16]', 'grid.precisions=[fp8_e4m3]',
            'study.fig4.model=resnet20', 'study.reuse=""']
    argv = ['--out', str(out), '--table-only']
    for s in sets:
        argv += ['--set', s]
    assert entry('depth_study.py', *argv) == 0
    printed = capsys.readouterr().out
    assert '--table-only trains nothing' in printed
    assert '| resnet20 |' in printed
    assert not (out / 'depth_study' / 'fig4').exists()
