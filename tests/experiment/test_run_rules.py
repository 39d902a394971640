"""What a rerun does with the runs already there (issue 39): a changed
config is refused on --resume with the changed keys named, presentation
keys are not a change, an unfinished run is never restarted or continued
without being told, a missing config.yaml / run.json is reported as such,
Ctrl-C leaves a run "interrupted" with one line on how to continue, and a
user error is one ``error:`` line, status 2, before anything is created."""
from functools import partial
import os

import chainer
import pytest
import yaml

from ada_loss.experiment import recipe as RC
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import runner
from ada_loss.experiment.studies.classification import STUDY

main = partial(runner.main, STUDY)
FOLDER = 'small_cnn-digits-adaptive-s0'


@pytest.fixture
def unfinished(tiny_config, out_dir):
    """A finished 2-iteration adaptive run made unfinished (as if killed
    after its last snapshot): (config path, run folder)."""
    path = tiny_config(grid={'modes': ['adaptive']})
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 0
    folder = os.path.join(out_dir, 'tiny', FOLDER)
    info = R.read_run(folder)
    info['status'] = R.RUNNING
    R.write_run(folder, info)
    return path, folder


def _saved(folder):
    with open(os.path.join(folder, 'config.yaml')) as f:
        return yaml.safe_load(f)


def test_resume_under_a_changed_config_is_refused(unfinished, out_dir,
                                                  capsys):
    """Item 3 / 11: --resume with another lr, input size or width stops
    with the keys named; config.yaml and the snapshot stay as they were."""
    path, folder = unfinished
    before = _saved(folder)
    stamp = os.path.getmtime(os.path.join(folder, 'snapshot_latest'))
    capsys.readouterr()
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--resume', '--set', 'train.lr=0.2', '--set',
                 'data.digits_size=12', '--set', 'model.width=16']) == 2
    err = capsys.readouterr().err
    assert err.startswith('error: 1 run not run: ' + FOLDER)
    assert 'config changed since it started (data.digits_size, ' \
        'model.width, train.lr)' in err and '--force restarts it' in err
    assert len(err.strip().splitlines()) == 1
    assert _saved(folder) == before
    assert os.path.getmtime(os.path.join(folder, 'snapshot_latest')) == stamp
    assert R.read_run(folder)['status'] == R.RUNNING
    # a raised stop point alone is continued
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--resume', '--set', 'train.max_iterations=3']) == 0
    info = R.read_run(folder)
    assert info['status'] == R.FINISHED and info['iterations'] == 3


def test_unfinished_run_is_not_restarted_without_resume(unfinished, out_dir,
                                                        capsys):
    """Item 9: one behaviour for every entry: refused, naming --resume and
    --force, instead of silently training again from iteration 0."""
    path, folder = unfinished
    capsys.readouterr()
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 2
    err = capsys.readouterr().err
    assert '{}: unfinished; --resume continues it'.format(FOLDER) in err
    assert R.read_run(folder)['status'] == R.RUNNING


def test_presentation_keys_are_not_a_config_change(tiny_config, out_dir,
                                                   capsys):
    """Item 8: --jobs (console off in workers), log.progress and layout
    change what is shown, not the numbers."""
    path = tiny_config(grid={'modes': ['none']})
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--jobs', '2', '--set', 'log.progress=report']) == 0
    capsys.readouterr()
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--set', 'layout=precision', '--set', 'log.progress=bar',
                 '--set', 'description=again']) == 0
    out = capsys.readouterr().out
    assert '[skip] small_cnn-digits-none-s0 (finished)\n' in out


def test_missing_config_yaml_is_named(unfinished, out_dir, capsys):
    """Item 13: a deleted config.yaml is "missing", not "changed (every
    section)"; --resume cannot check the config and refuses."""
    path, folder = unfinished
    os.remove(os.path.join(folder, 'config.yaml'))
    capsys.readouterr()
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--resume']) == 2
    err = capsys.readouterr().err
    assert 'config.yaml is missing or unreadable' in err
    assert 'blas_threads' not in err
    info = R.read_run(folder)
    info['status'] = R.FINISHED
    R.write_run(folder, info)
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--resume']) == 0
    out = capsys.readouterr().out
    assert '(finished; its config.yaml is missing or unreadable' in out


def test_missing_run_json_resumes_instead_of_wiping(unfinished, out_dir,
                                                   capsys):
    """Item 13: a deleted run.json with the snapshots there: --resume
    continues from the snapshot (the folder is not wiped)."""
    path, folder = unfinished
    os.remove(os.path.join(folder, 'run.json'))
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 2
    assert 'unfinished (run.json missing)' in capsys.readouterr().err
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--resume', '--set', 'train.max_iterations=3']) == 0
    info = R.read_run(folder)
    assert info['resumed_from'] == 'snapshot_latest'
    assert info['iterations'] == 3


def test_ctrl_c_leaves_the_run_interrupted(tiny_config, out_dir, capsys,
                                           monkeypatch):
    """Item 6: Ctrl-C (a KeyboardInterrupt in the training loop): one line
    naming --resume, status 130, run.json "interrupted", and --resume
    continues it."""
    real = RC.run_trainer

    def interrupted(trainer, *args, **kwargs):
        @chainer.training.make_extension(trigger=(2, 'iteration'))
        def ctrl_c(trainer):
            raise KeyboardInterrupt
        trainer.extend(ctrl_c)
        return real(trainer, *args, **kwargs)

    path = tiny_config(grid={'modes': ['none']}, train={'max_iterations': 3})
    monkeypatch.setattr(RC, 'run_trainer', interrupted)
    capsys.readouterr()
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 130
    err = capsys.readouterr().err
    assert 'Traceback' not in err and '--resume continues it' in err
    folder = os.path.join(out_dir, 'tiny', 'small_cnn-digits-none-s0')
    assert R.read_run(folder)['status'] == R.INTERRUPTED
    assert main(['--config', path, '--out', out_dir, '--list']) == 0
    assert 'interrupted' in capsys.readouterr().out
    monkeypatch.setattr(RC, 'run_trainer', real)
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--resume']) == 0
    info = R.read_run(folder)
    assert info['status'] == R.FINISHED and info['iterations'] == 3
    assert info['resumed_from'] == 'snapshot_latest'


def test_unwritable_results_folder_is_one_error_line(tiny_config, tmp_path,
                                                     capsys, monkeypatch):
    """Item 13: a results folder that cannot be written: one error line
    before anything is created (a file in the way; a read-only folder,
    os.access as a non-root user sees it)."""
    path = tiny_config()
    blocker = tmp_path / 'file'
    blocker.write_text('')
    assert main(['--config', path, '--out', str(blocker / 'results')]) == 2
    assert 'is not a folder' in capsys.readouterr().err
    ro = tmp_path / 'ro'
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, 'access', lambda p, mode: False if
                        os.path.abspath(p) == str(ro) else real(p, mode))
    assert main(['--config', path, '--out', str(ro)]) == 2
    err = capsys.readouterr().err
    assert err == 'error: cannot write results under {}: {} is not ' \
        'writable\n'.format(os.path.join(str(ro), 'tiny'), ro)
    assert os.listdir(str(ro)) == []


def test_decide_compares_only_what_determines_the_numbers(tmp_path):
    """The rule itself, on a depth-study cell (no training): its study's
    after-the-grid settings and the log section may change under --resume;
    a data key may not; a raised stop point is continued."""
    from ada_loss.experiment import config as C
    from ada_loss.experiment.studies import depth
    study = depth.STUDY
    sets = ['grid.models=[resnet20]', 'grid.seeds=[0]', 'grid.modes=[none]',
            'grid.fixed_scales=[]', 'grid.precisions=[fp8_e4m3]']
    cfg = study.load_config(None, sets)
    cell = study.cells(cfg)[-1]
    folder = study.folder(str(tmp_path), cfg, cell)
    os.makedirs(folder)
    with open(os.path.join(folder, 'config.yaml'), 'w') as f:
        f.write(C.dump(study.run_config(cfg, cell)))
    R.write_run(folder, {'status': R.RUNNING})
    open(os.path.join(folder, 'snapshot_latest'), 'w').close()

    def decide(*more):
        return runner.decide(study, study.load_config(None, sets + list(
            more)), cell, str(tmp_path), True, False)
    # (this run.json holds no data record: issue 50 item 8's note)
    unverified = 'unfinished; data unverified: its run.json predates the ' \
        'data records'
    assert decide('study.fig4.run=false', 'study.reuse=x.json',
                  'log.plot=false', 'log.probe_every=3') == \
        ('resume', unverified)
    assert decide('train.epochs=9') == ('resume', unverified)
    action, reason = decide('data.train_size=100')
    assert action == 'refuse' and '(data.train_size)' in reason
