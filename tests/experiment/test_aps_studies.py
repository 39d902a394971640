"""The APS experiment entries: config errors before anything runs, and tiny
end-to-end runs of the Table 4 / Table 9 analogues and the cost table."""
import os
from functools import partial

from ada_loss.experiment import runner
from ada_loss.experiment.studies import aps

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..')


def cfg(name):
    return os.path.join(ROOT, 'configs', name)


table4_main = partial(runner.main, aps.TABLE4)
table9_main = partial(runner.main, aps.TABLE9)
cost_main = partial(runner.main, aps.COST)


def test_config_errors_before_anything_runs(tmp_path, capsys):
    out = str(tmp_path)
    bad = [(table4_main, 'aps_table4.yaml', ['sim.workers=6',
                                               'sim.order=hierarchical',
                                               'sim.group_size=4'],
            "'sim.group_size'"),
           (table4_main, 'aps_table4.yaml', ['train.batchsize=100'],
            "'train.batchsize'"),
           (table4_main, 'aps_table4.yaml', ['grid.formats=[e5m2,fp7]'],
            "'grid.formats[1]'"),
           (table4_main, 'aps_table4.yaml', ['sim.bogus=1'],
            "'sim.bogus'"),
           (table4_main, 'aps_table4.yaml', ['log.probe_every=2'],
            "'log.probe_every'"),
           (table4_main, 'aps_table4.yaml', ['log.record_every=2'],
            "'log.record_every'"),
           (table9_main, 'aps_table9.yaml', ['group_sizes=[3]'],
            "'group_sizes[0]'"),
           (cost_main, 'aps_cost.yaml', ['formats=[e1m1]'],
            "'formats[0]'")]
    for main, config, sets, key in bad:
        argv = ['--config', cfg(config), '--out', out]
        for s in sets:
            argv += ['--set', s]
        assert main(argv) == 2
        assert key in capsys.readouterr().err
    assert os.listdir(out) == []          # nothing ran, nothing written
    assert table4_main(['--config', cfg('aps_table4.yaml'),
                        '--help-config']) == 0
    assert 'sim.group_size' in capsys.readouterr().out


def test_tiny_runs(tmp_path, capsys):
    out = str(tmp_path)
    assert table4_main([
        '--config', cfg('aps_table4.yaml'), '--out', out,
        '--set', 'grid.formats=[float32,e4m3]', '--set', 'grid.aps=[true]',
        '--set', 'grid.seeds=[0]', '--set', 'sim.workers=4',
        '--set', 'model.width=4', '--set', 'train.batchsize=64',
        '--set', 'train.epochs=0.2', '--set', 'data.digits_size=8',
        '--set', 'log.progress=report']) == 0
    text = capsys.readouterr().out
    assert '| (4, 3): 8 bits | yes |' in text and '0/1 |' in text
    assert 'shard_loss' in text and 'validation/main/accuracy' in text
    assert table9_main([
        '--config', cfg('aps_table9.yaml'), '--out', out,
        '--set', 'workers=8', '--set', 'group_sizes=[2,4]',
        '--set', 'seeds=[0]', '--set', 'per_worker_batch=2',
        '--set', 'model.name=small_cnn', '--set', 'model.width=4',
        '--set', 'data.digits_size=8']) == 0
    text = capsys.readouterr().out
    assert '8 (ring)' in text and '| (5, 2) | Kahan |' in text
    assert cost_main(['--config', cfg('aps_cost.yaml'), '--out', out]) == 0
    assert '| e5m2 | 8 | yes | 256 | 59 | 269722 |' in capsys.readouterr().out
