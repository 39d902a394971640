"""Entry points of Tables 2, 3 and 5 (config, runs, table builders)."""
import json
import os
import subprocess
import sys

import pytest

from ada_loss.experiment import runner
from ada_loss.experiment.config import load
from ada_loss.experiment.studies import detection, imagenet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _run(mode_name, status, metric=None, scale=None, **extra):
    opts = {} if scale is None else {'scale': scale}
    return dict(mode_name=mode_name, mode_options=opts, status=status,
                **extra, **({} if metric is None else metric))


def test_table3_ssd_mini_grid(voc_root, tmp_path, capsys):
    out = str(tmp_path)
    sets = ['grid.model=ssd_tiny', 'grid.batch_sizes=[2]',
            'grid.modes=[fp32, adaptive]', 'grid.fixed_scales=[]',
            'data.voc_root=' + voc_root, 'data.photometric=false',
            'data.loaderjobs=0', 'train.iterations=2', 'train.lr_steps=[1]',
            'log.log_interval=1 iteration', 'log.eval_interval=2 iteration',
            'log.progress=none']
    argv = ['--config', os.path.join(ROOT, 'configs', 'table3_ssd.yaml'),
            '--out', out] + sum((['--set', s] for s in sets), [])
    assert runner.main(detection.STUDY, argv) == 0
    results = os.path.join(out, 'table3_ssd')
    for name in ('ssd_tiny-b2-fp32-s0', 'ssd_tiny-b2-adaptive-s0'):
        with open(os.path.join(results, name, 'run.json')) as f:
            info = json.load(f)
        assert info['status'] == 'finished' and info['iterations'] == 2
        assert 0 <= info['final_map'] <= 1
    assert os.path.exists(os.path.join(results, 'ssd_tiny-b2-adaptive-s0',
                                       'loss_scales.csv'))
    assert '| Batch | FP32 | None | Fixed (best) | Dynamic | Adaptive |' in \
        open(os.path.join(results, 'table3.md')).read()
    capsys.readouterr()
    assert runner.main(detection.STUDY, argv + ['--list']) == 0      # finished runs are listed
    assert 'ssd_tiny-b2-fp32-s0' in capsys.readouterr().out


def test_table3_and_table5_builders():
    runs = [_run('fp32', 'finished', {'final_map': 0.7894}, batchsize=8),
            _run('none', 'diverged', batchsize=8),
            _run('fixed', 'finished', {'final_map': 0.2462}, 8, batchsize=8),
            _run('fixed', 'finished', {'final_map': 0.7911}, 2048,
                 batchsize=8),
            _run('fixed', 'diverged', None, 16, batchsize=8),
            _run('adaptive', 'finished', {'final_map': 0.7924}, batchsize=8)]
    table = detection.build_table(runs, 'table3')
    row = dict(zip(table.header, table.rows[0]))
    assert row['None'] == 'diverged' and row['FP32'] == '78.94'
    assert row['Fixed (best)'] == '79.11 (S=2048)'
    assert row['Adaptive'] == '**79.24**'
    assert row['Dynamic'].startswith('—')
    table5 = detection.build_table(runs, 'table5')
    assert table5.header == ['Batch', '8', '16', '2048']
    assert table5.rows[0][1:] == ['24.62', 'diverged', '79.11']


def test_table2_config_listing_and_builder(capsys):
    config = os.path.join(ROOT, 'configs', 'table2_imagenet.yaml')
    cfg = load(imagenet.Config, config)
    assert cfg.train.epochs == 90 and cfg.train.lr_steps == [30, 60, 80]
    assert runner.main(imagenet.STUDY, ['--config', config, '--list',
                                        '--out', '/nonexistent']) == 0
    listed = capsys.readouterr().out.split('\n')
    assert len([line for line in listed if line.endswith(' -')]) == 10
    assert runner.main(imagenet.STUDY, ['--config', config, '--list',
                                        '--set', 'grid.modes=[fixed:-1]']) \
        == 2
    assert 'grid.modes' in capsys.readouterr().err
    lr = imagenet.WarmupStepLR(0.1, [30, 60, 80], 0.1, warmup_iterations=10)
    assert lr.value(0, 0.0) == pytest.approx(0.01)
    assert lr.value(9, 0.5) == pytest.approx(0.1)
    assert lr.value(1000, 61.0) == pytest.approx(0.001)
    runs = [_run('fp32', 'finished', {'final_test_accuracy': 0.6976},
                 model='resnet18'),
            _run('fixed', 'diverged', None, 128, model='resnet18'),
            _run('adaptive', 'finished', {'final_test_accuracy': 0.7144},
                 model='resnet18')]
    table = imagenet.build_table(runs)
    assert table.header == ['Model', 'FP32', 'None', 'Fixed (128)',
                            'Dynamic', 'Adaptive']
    assert table.rows[0][0] == 'ResNet-18'
    assert table.rows[0][3] == 'diverged (S=128)'
    assert table.rows[0][5] == '**71.44**'


@pytest.mark.parametrize('entry, key', [('table2_imagenet', 'imagenet_root'),
                                        ('table3_ssd', 'voc_root')])
def test_missing_data_is_one_error_line(entry, key, tmp_path):
    """Every entry reports missing data the same way: one ``error:`` line,
    exit status 2, no traceback, nothing trained."""
    out = str(tmp_path / 'results')
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'experiments', entry + '.py'),
         '--out', out, '--set', 'data.{}={}'.format(key, tmp_path / 'none'),
         '--only', 'seed=0'], stderr=subprocess.PIPE,
        universal_newlines=True, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: ')
    assert 'Traceback' not in proc.stderr
    assert not os.path.exists(out)
