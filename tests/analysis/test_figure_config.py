"""The figures entry point uses the experiment config system: schema,
--set, --help-config, ConfigError before anything runs."""
import os
import subprocess
import sys

import pytest

from ada_loss.analysis.figure_config import load_config
from ada_loss.experiment.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, 'configs', 'figures.yaml')


def test_shipped_profiles_validate():
    for name in ('digits', 'resnet18_imagenet', 'ssd512_voc'):
        cfg = load_config(CONFIG, profile=name)
        assert cfg['out'].endswith(name)
        assert set(cfg['modes']) == {'fig1', 'fixed', 'adaptive'}


def test_set_wins_over_the_profile_and_selects_it():
    cfg = load_config(CONFIG, ['iterations=5', 'modes={a: "fixed:8"}'])
    assert cfg['iterations'] == 5 and cfg['modes'] == {'a': 'fixed:8'}
    assert cfg['model'] == 'plain_cnn'          # the file's profile: digits
    cfg = load_config(CONFIG, ['profile=ssd512_voc', 'batch_size=2'])
    assert cfg['model'] == 'ssd512' and cfg['batch_size'] == 2


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
