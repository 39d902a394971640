"""The figures study: its config (profiles, --set, --help-config,
ConfigError before anything runs) and the entry point end to end."""
import json
import os
import signal
import subprocess
import sys

import pytest

from ada_loss.analysis.recorder import load_csv
from ada_loss.experiment.studies.figures import load_config
from ada_loss.experiment.config import ConfigError
from ada_loss.scaling import parse_mode
from ada_loss.training.faults import ENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, 'configs', 'figures.yaml')


def test_shipped_profiles_validate():
    for name in ('digits', 'resnet18_imagenet', 'ssd512_voc'):
        cfg = load_config(CONFIG, profile=name)
        assert cfg.table == 'figures/' + name
        assert set(cfg.modes) == {'fig1', 'fixed', 'adaptive'}


def test_set_wins_over_the_profile_and_selects_it():
    cfg = load_config(CONFIG, ['iterations=5', 'modes={a: "fixed:8"}'])
    assert cfg.iterations == 5 and cfg.modes == {'a': parse_mode('fixed:8')}
    assert cfg.model == 'plain_cnn'          # the file's profile: digits
    cfg = load_config(CONFIG, ['profile=ssd512_voc', 'batch_size=2'])
    assert cfg.model == 'ssd512' and cfg.batch_size == 2


@pytest.mark.parametrize('overrides, profile, key', [
    (['iterations=0'], None, 'iterations'),
    (['bogus=1'], None, 'bogus'),
    (['modes={a: "fixed:0"}'], None, 'modes.a'),
    ([], 'nope', 'profile'),
    (['task=segmentation'], None, 'task'),
])
def test_bad_settings_are_config_errors(overrides, profile, key):
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG, overrides, profile)
    assert info.value.key.endswith(key)


def test_entry_point_help_config_and_error_before_running(tmp_path):
    script = os.path.join(ROOT, 'experiments', 'figures.py')
    proc = subprocess.run([sys.executable, script, '--help-config'],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0
    assert 'record_every: an integer >= 1' in proc.stdout
    out = tmp_path / 'out'
    proc = subprocess.run([sys.executable, script, '--set', 'lr=-1',
                           '--out', str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "config key 'lr'" in proc.stderr and not out.exists()


def test_figures_entry_point_writes_pngs(tmp_path):
    config = tmp_path / 'figures.yaml'
    config.write_text(
        'profile: tiny\nprofiles:\n  tiny:\n    model: plain_cnn\n'
        '    model_kwargs: {in_channels: 1, depth: 3, width: 4}\n'
        '    image_size: 8\n    batch_size: 8\n    iterations: 3\n'
        '    record_every: 2\n')
    root = tmp_path / 'out'
    out = root / 'figures' / 'tiny'
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'experiments', 'figures.py'),
         '--config', str(config), '--out', str(root)],
        capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ('fig1.png', 'fig4a.png', 'fig4b.png'):
        with open(out / name, 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['sigma_max']['ratio'] > 0
    assert len(summary['underflow_delta']) == 3       # conv1 has none
    rows = load_csv(str(out / 'adaptive' / 'records.csv'))
    assert sorted({r['iteration'] for r in rows}) == [1, 2]
    assert 'sigma_max fixed / adaptive' in proc.stdout


def _figures(config, root, *args, kill=None):
    env = dict(os.environ)
    env.pop(ENV, None)
    if kill:
        env[ENV] = kill
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, 'experiments', 'figures.py'),
         '--config', str(config), '--out', str(root)] + list(args),
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)


def test_killed_figure_runs_resume_to_the_same_records(tmp_path):
    """The recorded runs are Trainer runs: killed mid-run (and while
    writing a snapshot) and resumed, their records.csv and the figures'
    numbers equal an uninterrupted run's."""
    config = tmp_path / 'figures.yaml'
    config.write_text(
        'profile: tiny\nprofiles:\n  tiny:\n    model: plain_cnn\n'
        '    model_kwargs: {in_channels: 1, depth: 3, width: 4}\n'
        '    image_size: 8\n    batch_size: 8\n    iterations: 7\n'
        '    record_every: 2\n    snapshot_every: 2\n')
    whole, cut = tmp_path / 'whole', tmp_path / 'cut'
    assert _figures(config, whole).returncode == 0
    only = ('--only', 'run=adaptive')
    for i, kill in enumerate(('train_batch:6', 'snapshot_write:1')):
        proc = _figures(config, cut, *only, *(['--resume'] if i else []),
                        kill=kill)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert _figures(config, cut, '--resume').returncode == 0

    def rows(root, run):
        with open(root / 'figures' / 'tiny' / run / 'records.csv') as f:
            return f.read()
    for run in ('fig1', 'fixed', 'adaptive'):
        assert rows(cut, run) == rows(whole, run), run
    assert '\n7,' not in rows(whole, 'adaptive')     # records at 1, 2, 4, 6
    info = json.loads((cut / 'figures' / 'tiny' / 'adaptive' / 'run.json')
                      .read_text())
    assert info['resumed'] and info['iterations_done'] == 7
    summary = [json.loads((root / 'figures' / 'tiny' / 'summary.json')
                          .read_text()) for root in (whole, cut)]
    assert summary[0]['sigma_max'] == summary[1]['sigma_max']
    assert summary[0]['runs']['adaptive']['losses'] == \
        summary[1]['runs']['adaptive']['losses']


def test_detection_profile_runs_on_the_trainer(voc_root, tmp_path):
    """The SSD task of the figures (Fig. 1 and 4b of §4.3), on a tiny SSD
    and the on-disk VOC fixture: every run records, Fig. 4b is drawn."""
    config = tmp_path / 'figures.yaml'
    config.write_text(
        'profile: ssd\nprofiles:\n  ssd:\n    task: detection\n'
        '    dataset: voc\n    model: ssd_tiny\n    batch_size: 2\n'
        '    iterations: 2\n    record_every: 1\n    lr: 1.0e-3\n'
        '    photometric: false\n    data_root: {}\n'.format(voc_root))
    proc = _figures(config, tmp_path / 'out')
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / 'out' / 'figures' / 'ssd'
    for run in ('fig1', 'fixed', 'adaptive'):
        rows = load_csv(str(out / run / 'records.csv'))
        assert sorted({r['iteration'] for r in rows}) == [1, 2], run
    assert (out / 'fig4b.png').exists() and (out / 'fig1.png').exists()


def test_figure_runs_take_a_precision(tmp_path):
    """``precision`` sets the precision of every run (fp32 only runs in
    float32: a ConfigError otherwise, before anything runs)."""
    from ada_loss.experiment import runner
    from ada_loss.experiment.studies import figures
    config = tmp_path / 'figures.yaml'
    config.write_text(
        'profile: tiny\nprofiles:\n  tiny:\n    model: plain_cnn\n'
        '    model_kwargs: {in_channels: 1, depth: 3, width: 4}\n'
        '    image_size: 8\n    batch_size: 8\n    iterations: 2\n'
        '    record_every: 1\n')
    root = str(tmp_path / 'out')
    argv = ['--config', str(config), '--out', root, '--set',
            'precision=bf16']
    assert runner.main(figures.STUDY, argv) == 2        # fig1 is fp32
    assert not os.path.exists(root)
    assert runner.main(figures.STUDY, argv + [
        '--set', 'modes={fixed: "fixed:128", adaptive: adaptive}']) == 0
    out = os.path.join(root, 'figures', 'tiny')
    summary = json.loads(open(os.path.join(out, 'summary.json')).read())
    for run in ('fixed', 'adaptive'):
        assert summary['runs'][run]['precision'] == 'bf16'
        rows = load_csv(os.path.join(out, run, 'records.csv'))
        # emulated bf16 keeps float32 arrays (mixed16 would record float16)
        assert rows and {r['dtype'] for r in rows} == {'float32'}


@pytest.mark.parametrize('profile', ['ssd512_voc', 'resnet18_imagenet'])
def test_missing_data_is_one_error_line_before_any_folder(profile, tmp_path,
                                                          capsys):
    """Issue 39 item 6: the data are looked for before a run folder is
    made (was: a DatasetNotFoundError traceback, status 1, after "1 runs
    selected", and an empty run folder)."""
    from ada_loss.experiment import runner
    from ada_loss.experiment.studies.figures import STUDY
    out = tmp_path / 'out'
    assert runner.main(STUDY, [
        '--config', CONFIG, '--out', str(out), '--set',
        'profile=' + profile, '--set', 'data_root=' + str(tmp_path / 'no'),
        '--only', 'run=adaptive']) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith('error: ')
    assert len(captured.err.splitlines()) == 1
    assert 'runs selected' not in captured.out
    assert not out.exists()
