"""Tables 1 and 4 built from run folders: layout, statistics, bold best,
missing cells, diverged runs, Markdown/CSV output and the CLI."""
import csv
from functools import partial
import os
import subprocess
import sys

import pytest

from ada_loss.experiment import runinfo as R
from ada_loss.experiment import runner
from ada_loss.experiment.studies.classification import STUDY
from ada_loss.experiment import tables as T
from ada_loss.scaling import parse_mode

ROOT = os.path.join(os.path.dirname(__file__), '..', '..')


def add_run(root, model, dataset, mode, seed, acc=None, status='finished'):
    spec = parse_mode(mode)
    name = '{}-{}-{}-s{}'.format(model, dataset, str(spec).replace(':', '_'),
                                 seed)
    folder = os.path.join(root, name)
    os.makedirs(folder)
    R.write_run(folder, {
        'name': name, 'model': model, 'dataset': dataset, 'mode': str(spec),
        'mode_name': spec.name, 'mode_options': spec.options, 'seed': seed,
        'status': status, 'final_test_accuracy': acc})


@pytest.fixture
def results(tmp_path):
    root = str(tmp_path / 'table1')
    for seed, d in enumerate((0.0, 0.002)):
        add_run(root, 'resnet20', 'cifar10', 'fp32', seed, 0.9125 + d)
        add_run(root, 'resnet20', 'cifar10', 'none', seed, 0.9216 + d)
        add_run(root, 'resnet20', 'cifar10', 'fixed:16', seed, 0.9219 + d)
        add_run(root, 'resnet20', 'cifar10', 'fixed:128', seed, 0.9210 + d)
        add_run(root, 'resnet20', 'cifar10', 'adaptive', seed, 0.9226 + d)
        add_run(root, 'resnet56', 'cifar10', 'fp32', seed, 0.93 + d)
        add_run(root, 'resnet20', 'cifar100', 'none', seed, 0.68 + d)
    # a scale whose runs all diverged is the worst fixed scale
    add_run(root, 'resnet20', 'cifar10', 'fixed:16384', 0, None, 'diverged')
    add_run(root, 'resnet20', 'cifar10', 'fixed:16384', 1, None, 'diverged')
    # one diverged seed out of three
    add_run(root, 'resnet56', 'cifar10', 'adaptive', 0, 0.94)
    add_run(root, 'resnet56', 'cifar10', 'adaptive', 1, None, 'diverged')
    add_run(root, 'resnet56', 'cifar10', 'none', 0, None, 'diverged')
    add_run(root, 'resnet20', 'cifar100', 'adaptive', 0, None, 'running')
    return root


def test_table1_layout_and_cells(results):
    table = T.build_table(results, 'table1')
    assert table.header == ['Dataset', 'Depth', 'FP32', 'None',
                            'Fixed (best)', 'Fixed (worst)', 'Adaptive']
    rows = {(r[0], r[1]): dict(zip(table.header, r)) for r in table.rows}
    assert list(rows) == [('C10', '20'), ('C10', '56'), ('C100', '20')]
    r20 = rows['C10', '20']
    assert r20['FP32'] == '91.35 ± 0.14'
    assert r20['Fixed (best)'] == '92.29 ± 0.14 (S=16)'
    assert r20['Fixed (worst)'] == 'diverged (S=16384)'
    assert r20['Adaptive'] == '**92.36 ± 0.14**'     # best of the row
    r56 = rows['C10', '56']
    assert r56['None'] == 'diverged'
    assert r56['Fixed (best)'] == '— (0 runs)'
    assert r56['Adaptive'] == '**94.00** (1 div., n=1)'
    c100 = rows['C100', '20']
    assert c100['FP32'] == '— (0 runs)'
    assert c100['Adaptive'] == '— (1 running)'
    md = T.to_markdown(table)
    assert '| C10 | 20 | 91.35 ± 0.14 | 92.26 ± 0.14 |' in md
    assert '20 runs found' in md and '4 diverged' in md
    assert 'n = 2 seeds' in md


def test_dynamic_column_only_with_dynamic_runs(results):
    add_run(results, 'resnet20', 'cifar10', 'dynamic', 0, 0.95)
    table = T.build_table(results, 'table1')
    assert table.header[-2:] == ['Dynamic', 'Adaptive']
    row = dict(zip(table.header, table.rows[0]))
    assert row['Dynamic'] == '**95.00** (n=1)'
    assert row['Adaptive'] == '92.36 ± 0.14'


def test_table4_per_scale(results):
    table = T.build_table(results, 'table4')
    assert table.header == ['Dataset', 'Model', '16', '128', '16384']
    assert table.rows[0] == ['C10', 'resnet20', '92.29 ± 0.14',
                             '92.20 ± 0.14', 'diverged']
    assert len(table.rows) == 1        # rows: models with fixed runs
    add_run(results, 'resnet56', 'cifar10', 'fixed:128', 0, 0.93)
    table = T.build_table(results, 'table4')
    assert table.rows[1] == ['C10', 'resnet56', '— (0 runs)', '93.00 (n=1)',
                             '— (0 runs)']


def test_files_and_table_only(results, tmp_path):
    """The tables of existing runs: ``--table-only`` of the entry trains
    nothing and writes Markdown and CSV."""
    out_root = os.path.dirname(results)
    cfg = tmp_path / 'cfg.yaml'
    cfg.write_text('table: {}\n'.format(os.path.basename(results)))
    cmd = [sys.executable, os.path.join(ROOT, 'experiments', 'table1.py'),
           '--config', str(cfg), '--out', out_root, '--table-only']
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, check=True,
                          universal_newlines=True)
    assert 'Table 1' in proc.stdout and '| C10 | 20 |' in proc.stdout
    with open(os.path.join(results, 'table1.md')) as f:
        assert f.read() in proc.stdout
    rows = list(csv.DictReader(open(os.path.join(results, 'table1.csv'))))
    best = [r for r in rows if r['model'] == 'resnet20' and
            r['dataset'] == 'cifar10' and r['column'] == 'Fixed (best)'][0]
    assert best['scale'] == '16' and best['n_finished'] == '2'
    assert abs(float(best['mean_accuracy']) - 92.29) < 1e-9
    out = str(tmp_path / 'tables')
    T.write_tables(results, 'table4', out, quiet=True)
    assert os.path.exists(os.path.join(out, 'table4.csv'))


def test_tables_from_real_runs(tiny_config, out_dir, capsys,
                               overflowing_fixed):
    """End to end: runs of every mode (one diverged) -> printed Table 1."""
    main = partial(runner.main, STUDY)
    path = tiny_config(grid={'modes': ['fp32', 'none', 'dynamic',
                                       'adaptive'],
                             'fixed_scales': [16, overflowing_fixed]},
                       train={'max_iterations': 1})
    assert main(['--config', path, '--out', out_dir]) == 0
    out = capsys.readouterr().out
    line = [x for x in out.splitlines() if x.startswith('| digits |')][0]
    cells = [c.strip() for c in line.strip('|').split('|')]
    assert cells[:2] == ['digits', 'small_cnn'] and len(cells) == 8
    assert cells[5].startswith('diverged') and 'S=8192' in cells[5]
    assert all(c[0].isdigit() or c.startswith('**') for c in
               cells[2:5] + cells[6:])
    assert os.path.exists(os.path.join(out_dir, 'tiny', 'table1.md'))
