"""Runs from a config: folder contents, divergence, skipping, resume."""
import csv
import json
import os
import re

import numpy
import pytest
import yaml

from ada_loss.experiment import runinfo as R
from functools import partial

from ada_loss.experiment import runner
from ada_loss.experiment.studies.classification import STUDY
from ada_loss.scaling import resolved_mode

main = partial(runner.main, STUDY)

MODES = ['fp32', 'none', 'fixed:128', 'dynamic', 'adaptive']
DTYPE = {'fp32': 'float32'}


def run_dir(out_dir, mode, seed=0, table='tiny'):
    slug = mode.replace(':', '_').replace(',', '_')
    return os.path.join(out_dir, table,
                        'small_cnn-digits-{}-s{}'.format(slug, seed))


def read_log(folder):
    with open(os.path.join(folder, 'log')) as f:
        return json.load(f)


@pytest.mark.parametrize('mode', MODES)
def test_two_iteration_run_writes_its_folder(mode, tiny_config, out_dir):
    assert main(['--config', tiny_config(grid={'modes': [mode]}),
                 '--out', out_dir, '--no-table']) == 0
    folder = run_dir(out_dir, mode)
    files = set(os.listdir(folder))
    assert {'config.yaml', 'run.json', 'log', 'log.csv', 'loss.png',
            'accuracy.png', R.SNAPSHOT} <= files
    assert ('loss_scales.csv' in files) == (mode == 'adaptive')
    # the TensorBoard events of the run (log.tensorboard: on by default)
    assert len([n for n in files if n.startswith('events.out.tfevents.')]) \
        == 1
    info = R.read_run(folder)
    assert info['status'] == 'finished'
    assert info['mode'] == mode and info['mode_name'] == mode.split(':')[0]
    assert info['precision'] == DTYPE.get(mode, 'mixed16')
    # every option written out (issue 47: a default may change later)
    assert info['mode_resolved'] == resolved_mode(mode, info['precision'])
    if mode == 'adaptive':
        assert 'init_scale=format' in info['mode_resolved']
        assert 'fmt=float16' in info['mode_resolved']
    assert info['seed'] == 0 and info['iterations'] == 2
    assert 0 <= info['final_test_accuracy'] <= 1
    assert info['best_test_accuracy'] >= info['final_test_accuracy']
    assert info['skipped_steps'] == 0 and info['wall_time_s'] > 0
    assert info['git_commit'] is None or re.match(r'^[0-9a-f]{40}$',
                                                  info['git_commit'])
    cfg = yaml.safe_load(open(os.path.join(folder, 'config.yaml')))
    assert cfg['run'] == {'model': 'small_cnn', 'dataset': 'digits',
                          'mode': mode, 'seed': 0,
                          'precision': info['precision']}
    assert cfg['train']['max_iterations'] == 2
    log = read_log(folder)
    assert [e['iteration'] for e in log] == [1, 2]
    assert 'validation/main/accuracy' in log[-1] and 'lr' in log[-1]
    rows = list(csv.DictReader(open(os.path.join(folder, 'log.csv'))))
    assert [int(r['iteration']) for r in rows] == [1, 2]
    if mode == 'adaptive':
        rows = list(csv.DictReader(open(os.path.join(folder,
                                                     'loss_scales.csv'))))
        assert {int(r['iteration']) for r in rows} == {1, 2}
        assert {r['layer'] for r in rows} == {
            'predictor/conv1', 'predictor/conv2', 'predictor/conv3',
            'predictor/fc'}
        assert all(float(r['alpha']) >= 1 for r in rows)
        assert os.path.exists(os.path.join(folder, 'loss_scales.png'))


def test_overflow_is_recorded_as_diverged_and_grid_goes_on(
        tiny_config, out_dir, capsys, overflowing_fixed):
    # 2^100 overflows FP16 at once; a fixed scale cannot skip steps
    huge = 'fixed:{}'.format(overflowing_fixed)
    path = tiny_config(grid={'modes': ['fp32'],
                             'fixed_scales': [overflowing_fixed]})
    assert main(['--config', path, '--out', out_dir]) == 0
    from ada_loss.scaling import parse_mode
    folder = run_dir(out_dir, str(parse_mode(huge)))
    info = R.read_run(folder)
    assert info['status'] == 'diverged'
    assert info['final_test_accuracy'] is None
    assert 'non-finite gradient' in info['error']
    assert info['iterations'] == 0 and info['skipped_steps'] == 1
    assert R.read_run(run_dir(out_dir, 'fp32'))['status'] == 'finished'
    out = capsys.readouterr().out
    assert '| diverged (S=8192) |' in out


def test_finished_runs_are_skipped(tiny_config, out_dir, capsys):
    path = tiny_config()
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 0
    stamp = R.read_run(run_dir(out_dir, 'fp32'))['updated']
    capsys.readouterr()
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 0
    out = capsys.readouterr().out
    assert '[skip] small_cnn-digits-fp32-s0 (finished)' in out
    assert R.read_run(run_dir(out_dir, 'fp32'))['updated'] == stamp
    assert main(['--config', path, '--out', out_dir, '--list']) == 0
    assert 'finished' in capsys.readouterr().out
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--set', 'train.lr=0.07']) == 0
    assert 'config changed since (train.lr), --force reruns' in \
        capsys.readouterr().out
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--force', '--set', 'train.lr=0.07']) == 0
    assert R.read_run(run_dir(out_dir, 'fp32'))['updated'] >= stamp
    saved = yaml.safe_load(open(os.path.join(run_dir(out_dir, 'fp32'),
                                             'config.yaml')))
    assert saved['train']['lr'] == 0.07


def _snapshot(folder):
    with numpy.load(os.path.join(folder, R.SNAPSHOT)) as npz:
        return {k: npz[k] for k in npz.files}


@pytest.mark.parametrize('mode', ['dynamic:growth_interval=1,init_scale=1024',
                                  'adaptive'])
@pytest.mark.parametrize('how', ['finished', 'interrupted'])
def test_resume_continues_exactly(mode, how, tiny_config, out_dir):
    """2 iterations, then --resume to 4 == 4 iterations in one go: the same
    iteration counter, loss-scale state, optimizer state, FP32 master
    weights and weights, bit for bit."""
    path = tiny_config(grid={'modes': [mode]})
    ref_out = out_dir + '_ref'
    assert main(['--config', path, '--out', ref_out, '--no-table',
                 '--set', 'train.max_iterations=4']) == 0
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 0
    folder = run_dir(out_dir, mode)
    half = _snapshot(folder)
    assert int(half['updater/iteration']) == 2
    if how == 'interrupted':        # as if killed after the snapshot
        info = R.read_run(folder)
        info['status'] = 'running'
        R.write_run(folder, info)
    assert main(['--config', path, '--out', out_dir, '--no-table',
                 '--resume', '--set', 'train.max_iterations=4']) == 0
    info = R.read_run(folder)
    assert info['status'] == 'finished' and info['resumed']
    assert info['iterations'] == 4
    full, ref = _snapshot(folder), _snapshot(run_dir(ref_out, mode))
    assert int(full['updater/iteration']) == 4
    if mode.startswith('dynamic'):
        # doubled after each clean step: 1024 * 2^4, not 1024 * 2^2
        assert float(full['updater/loss_scaling/scale']) == 1024 * 2 ** 4
    else:
        assert int(full['updater/loss_scaling/iteration']) == 4
        rows = list(csv.DictReader(open(os.path.join(folder,
                                                     'loss_scales.csv'))))
        assert sorted({int(r['iteration']) for r in rows}) == [1, 2, 3, 4]
        assert len(rows) == 4 * 4
    assert [e['iteration'] for e in read_log(folder)] == [1, 2, 3, 4]
    compared = [k for k in ref if k.startswith((
        'updater/model:main/', 'updater/optimizer:main/',
        'extensions/FP32MasterWeights/'))]
    assert any(k.startswith('extensions/FP32MasterWeights/')
               for k in compared)
    for k in compared:
        numpy.testing.assert_array_equal(full[k], ref[k], err_msg=k)


def test_resume_without_snapshot_starts_afresh(tiny_config, out_dir):
    path = tiny_config()
    assert main(['--config', path, '--out', out_dir, '--resume',
                 '--no-table']) == 0
    info = R.read_run(run_dir(out_dir, 'fp32'))
    assert info['status'] == 'finished' and not info['resumed']


def test_final_accuracy_is_the_last_evaluation(tiny_config, out_dir):
    """LogReport averages a log interval's evaluations; run.json holds the
    exact last and best test accuracy."""
    path = tiny_config(train={'max_iterations': 5},
                       log={'log_interval': '3 iteration'})
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 0
    folder = run_dir(out_dir, 'fp32')
    assert [e['iteration'] for e in read_log(folder)] == [3, 5]
    hist = _snapshot(folder)[
        'extensions/TestHistory/validation.main.accuracy']
    assert hist[:, 0].tolist() == [1, 2, 3, 4, 5]
    info = R.read_run(folder)
    assert info['final_test_accuracy'] == hist[-1, 1]
    assert info['best_test_accuracy'] == hist[:, 1].max()


def test_evaluation_runs_in_test_mode(tiny_config, out_dir, monkeypatch):
    """The Evaluator calls the Classifier with train=False (BN uses its
    running statistics) and without backprop; training with train=True."""
    import chainer
    from ada_loss.training.classifier import Classifier
    calls = []
    forward = Classifier.forward

    def spy(self, x, t):
        calls.append((chainer.config.train, chainer.config.enable_backprop))
        return forward(self, x, t)
    monkeypatch.setattr(Classifier, 'forward', spy)
    assert main(['--config', tiny_config(), '--out', out_dir,
                 '--no-table']) == 0
    assert sorted(set(calls)) == [(False, False), (True, True)]
