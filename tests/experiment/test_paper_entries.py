"""Entry points of Tables 2, 3 and 5 (config, runs, table builders)."""
import json
import os
import subprocess
import sys

import pytest
import yaml

import ondisk_fixtures
from ada_loss.analysis import gemm_probe
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
                                        ('table3_ssd', 'voc_root'),
                                        ('table1', 'cifar_root')])
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
    assert len(lines) == 1 and lines[0].startswith('error: '), lines
    assert 'Traceback' not in proc.stderr
    assert 'python -m ada_loss.datasets.fetch' in lines[0]
    assert not os.path.exists(out)


def _precision_run(study, config, sets, out, run):
    """Runs a one-cell grid; returns its run.json, config.yaml and the
    probe's rows (the GEMMs that round to the precision's formats)."""
    argv = ['--config', os.path.join(ROOT, 'configs', config), '--out', out,
            '--no-table'] + sum((['--set', s] for s in sets), [])
    assert runner.main(study, argv) == 0
    folder = os.path.join(out, run)
    with open(os.path.join(folder, 'run.json')) as f:
        info = json.load(f)
    with open(os.path.join(folder, 'config.yaml')) as f:
        saved = yaml.safe_load(f)
    probe = os.path.join(folder, 'probe.csv')
    rows = gemm_probe.load_csv(probe) if os.path.exists(probe) else []
    return info, saved, rows


LOG = ['log.log_interval=1 iteration', 'log.eval_interval=2 iteration',
       'log.snapshot_interval=2 iteration', 'log.progress=none',
       'log.plot=false', 'log.probe_every=1']


@pytest.mark.parametrize('precision', ['fp8', 'bf16'])
def test_table2_cell_in_a_precision(precision, tmp_path):
    """A Table 2 cell (ResNet-18, adaptive) trains in an emulated precision
    on the on-disk ImageNet fixture: every GEMM rounds to its formats."""
    root = ondisk_fixtures.make_imagenet(str(tmp_path / 'imagenet'))
    info, saved, rows = _precision_run(
        imagenet.STUDY, 'table2_imagenet.yaml',
        ['grid.models=[resnet18]', 'grid.modes=[adaptive]',
         'train.precision=' + precision, 'data.imagenet_root=' + root,
         'data.image_size=32', 'data.eval_resize=36', 'train.batchsize=3',
         'train.eval_batchsize=3', 'train.max_iterations=2'] + LOG,
        str(tmp_path / 'out'), 'table2_imagenet/resnet18-imagenet-adaptive-s0')
    assert info['status'] == 'finished' and info['iterations'] == 2
    assert info['precision'] == precision
    assert saved['train']['precision'] == precision
    assert saved['run']['precision'] == precision
    layers = {r['layer'] for r in rows}
    assert len(layers) == 21 and {r['iteration'] for r in rows} == {1, 2}


@pytest.mark.parametrize('precision', ['fp8', 'bf16'])
def test_table3_cell_in_a_precision(precision, voc_root, tmp_path):
    """A Table 3 cell (SSD, batch 2, adaptive) trains in an emulated
    precision on the on-disk VOC fixture: every GEMM rounds to its
    formats."""
    info, saved, rows = _precision_run(
        detection.STUDY, 'table3_ssd.yaml',
        ['grid.model=ssd_tiny', 'grid.batch_sizes=[2]',
         'grid.modes=[adaptive]', 'grid.fixed_scales=[]',
         'train.precision=' + precision, 'data.voc_root=' + voc_root,
         'data.photometric=false', 'train.iterations=2',
         # at the default lr 1e-3 the second forward of this random-init
         # tiny SSD overflows E4M3 (a NaN loss: the run is diverged)
         'train.lr=1e-4', 'train.lr_steps=[1]'] + LOG,
        str(tmp_path / 'out'), 'table3_ssd/ssd_tiny-b2-adaptive-s0')
    assert info['status'] == 'finished' and info['iterations'] == 2
    assert info['precision'] == precision
    assert saved['train']['precision'] == precision
    assert rows and {r['iteration'] for r in rows} == {1, 2}


@pytest.mark.parametrize('entry, study', [('table2_imagenet', imagenet),
                                          ('table3_ssd', detection)])
def test_precision_is_checked_like_classification(entry, study, capsys):
    """``train.precision`` is listed by --help-config and checked against
    the modes before anything runs, with classification's errors."""
    config = os.path.join(ROOT, 'configs', entry + '.yaml')
    assert runner.main(study.STUDY, ['--config', config,
                                     '--help-config']) == 0
    assert 'train.precision: ' in capsys.readouterr().out
    assert runner.main(study.STUDY, ['--config', config, '--list', '--set',
                                     'train.precision=fp9']) == 2
    err = capsys.readouterr().err
    # the library's own reason reaches the command line (issue 36)
    assert "config key 'train.precision': unknown precision 'fp9'; " \
        "expected float32, mixed16" in err
    # fp32 is float32: the grid's fp32 column cannot run in fp8
    assert runner.main(study.STUDY, ['--config', config, '--list', '--set',
                                     'train.precision=fp8']) == 2
    assert "config key 'grid.modes': mode fp32: mode fp32 means no mixed " \
        'precision' in capsys.readouterr().err
    # a fixed scale above the gradient format's range (E5M2: 57344)
    assert runner.main(study.STUDY, [
        '--config', config, '--list', '--set', 'grid.modes=[fixed:60000]',
        '--set', 'train.precision=fp8']) == 2
    assert 'not below the largest value' in capsys.readouterr().err
    assert runner.main(study.STUDY, [
        '--config', config, '--list', '--set', 'grid.modes=[fixed:60000]'
    ]) == 0                                           # in mixed16 it fits
