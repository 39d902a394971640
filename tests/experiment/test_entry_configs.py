"""Every entry's default config loads, and what ``--jobs`` sends to its
worker processes (the config with console output off) survives pickling:
a config class that cannot be pickled breaks ``--jobs 2`` only."""
import os
import pickle

import pytest

from ada_loss.experiment import runner
from repo_modules import ROOT, load

ENTRIES = sorted(n[:-3] for n in os.listdir(os.path.join(ROOT, 'experiments'))
                 if n.endswith('.py'))


def _entry(name):
    module = load(os.path.join('experiments', name + '.py'), 'entry_' + name)
    studies = [v for v in vars(module).values()
               if isinstance(v, runner.Study)]
    assert len(studies) == 1, name
    return studies[0], os.path.normpath(module.CONFIG)


def test_every_entry_is_found():
    assert {'table1', 'table2_imagenet', 'table3_ssd', 'aps_table4',
            'fp8_diagnosis', 'depth_study', 'figures'} <= set(ENTRIES)


@pytest.mark.parametrize('name', ENTRIES)
def test_worker_config_pickles(name):
    study, config = _entry(name)
    cfg = study.load_config(config, [])
    quiet = runner.quiet_config(cfg)
    assert pickle.loads(pickle.dumps(quiet)) == quiet
    log = getattr(quiet, 'log', None)
    assert log is None or log.progress == 'none'
