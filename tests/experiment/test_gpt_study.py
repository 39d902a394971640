"""The GPT table (experiments/gpt_table.py, ada_loss/experiment/studies/gpt.py)
on a tiny config and a generated text: runs end to end, resumes exactly
after a kill, prints its table without training; the same seed gives every
method the same training windows; AdamW's update is the unscaled one under
a loss scale and decays only the 2-D weights; the learning-rate schedule
is the peer's."""
import json
import os
import signal
import subprocess
import sys

import numpy
import pytest
import yaml

from ada_loss.datasets import char_corpus
from ada_loss.experiment.runner import main
from ada_loss.experiment.studies import gpt as G
from ada_loss.training.extensions import WarmupCosine
from ada_loss.training.faults import ENV

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
WORDS = ('the and of to in that he shall unto for his lord they be is him '
         'not them it with all thou thy was god which my me said').split()


@pytest.fixture(scope='module')
def text_root(tmp_path_factory):
    """A small generated text in KJV's line format (``kjv.txt``)."""
    rng = numpy.random.RandomState(0)
    lines = ['Ge{}:{} {}.'.format(i // 30 + 1, i % 30 + 1, ' '.join(
        WORDS[j] for j in rng.randint(0, len(WORDS), 10)).capitalize())
        for i in range(300)]
    root = tmp_path_factory.mktemp('kjv')
    (root / 'kjv.txt').write_text('\n'.join(lines) + '\n')
    return str(root)


def write_config(folder, root, rows, seeds=(0,), iterations=20):
    cfg = {
        'table': 'tiny',
        'grid': {'seeds': list(seeds), 'rows': rows},
        'model': {'n_layer': 1, 'n_head': 2, 'n_embd': 16, 'block_size': 8},
        'data': {'kjv_root': root, 'eval_iters': 2},
        'train': {'batchsize': 4, 'max_iterations': iterations,
                  'warmup_iterations': 5, 'lr_decay_iterations': iterations},
        'log': {'log_interval': '5 iteration',
                'eval_interval': '10 iteration',
                'snapshot_interval': '10 iteration', 'progress': 'none',
                'plot': False, 'tensorboard': False},
    }
    path = os.path.join(str(folder), 'tiny.yaml')
    with open(path, 'w') as f:
        yaml.safe_dump(cfg, f)
    return path


def read_run(out, name):
    with open(os.path.join(out, 'tiny', name, 'run.json')) as f:
        return json.load(f)


ROWS = [{'precisions': ['float32'], 'modes': ['fp32']},
        {'precisions': ['fp8_e4m3'], 'modes': ['adaptive']}]


def test_end_to_end_and_table_only(tmp_path, text_root, capsys):
    config = write_config(tmp_path, text_root, ROWS)
    out = str(tmp_path / 'out')
    assert main(G.STUDY, ['--config', config, '--out', out, '--jobs', '1',
                          '--no-table']) in (0, None)
    for name in ('float32-fp32-s0', 'fp8_e4m3-adaptive-s0'):
        info = read_run(out, name)
        assert info['status'] == 'finished', info.get('error')
        assert info['iterations'] == 20
        for key in ('final_val_loss', 'final_select_loss',
                    'final_train_loss', 'unigram_val_loss'):
            assert numpy.isfinite(info[key]), key
        # a 20-step model of 30-odd characters: about ln(V) nats, not 0
        assert 1.0 < info['final_val_loss'] < 5.0
        with open(os.path.join(out, 'tiny', name, 'log')) as f:
            log = json.load(f)
        evaluated = [r['iteration'] for r in log
                     if 'validation/main/loss' in r]
        assert evaluated == [10, 20]
        assert all('select/main/loss' in r for r in log
                   if 'validation/main/loss' in r)
        # the rate each update used (logged as the mean of 5 steps) is
        # the peer's schedule: warm-up to step 5, cosine to step 20
        schedule = WarmupCosine(1e-3, 1e-4, 5, 20, attr='lr')
        for r in log:
            steps = range(r['iteration'] - 5, r['iteration'])
            assert r['lr'] == pytest.approx(numpy.mean(
                [schedule.rate(i) for i in steps]))
    capsys.readouterr()
    assert main(G.STUDY, ['--config', config, '--out', out,
                          '--table-only']) in (0, None)
    printed = capsys.readouterr().out
    assert '| float32 fp32 | 1/1 |' in printed
    row = [line for line in printed.splitlines()
           if line.startswith('| fp8_e4m3 adaptive |')]
    assert len(row) == 1 and '(n=1)' in row[0]
    fp32 = read_run(out, 'float32-fp32-s0')['final_val_loss']
    mine = read_run(out, 'fp8_e4m3-adaptive-s0')['final_val_loss']
    assert '{:+.3f}'.format(mine - fp32) in row[0]
    assert os.path.exists(os.path.join(out, 'tiny', 'table.md'))


def test_same_seed_same_windows(text_root):
    """Two methods of one seed train on the same characters; another seed
    on others: the study's own iterators, read out."""
    cfg = G.STUDY.load_config(write_config(
        os.path.dirname(text_root), text_root, ROWS, seeds=(0, 1)), [])
    cache = G.STUDY.preload(cfg, G.STUDY.cells(cfg))

    def windows(cell):
        run = G.STUDY.setup(cfg, cell)
        G.STUDY.load_data(run, cache)
        it, _ = G.STUDY.iterators(run, None, [], 4)
        return [numpy.stack([x for x, _ in b] + [y for _, y in b])
                for b in it]
    cells = {(str(c.precision), str(c.mode), c.seed): c
             for c in G.STUDY.cells(cfg)}
    a = windows(cells[('float32', 'fp32', 0)])
    b = windows(cells[('fp8_e4m3', 'adaptive', 0)])
    c = windows(cells[('float32', 'fp32', 1)])
    assert len(a) == 20 and a[0].shape == (8, 8)
    assert all((u == v).all() for u, v in zip(a, b))
    assert not all((u == v).all() for u, v in zip(a, c))
    # and they are the data contract's windows of the train split
    train = cache['corpus'].splits['train']
    starts = char_corpus.train_offsets(len(train), 8, 4, 20, 0)
    x, y = char_corpus.batch(train, starts[7], 8)
    assert (a[7][:4] == x).all() and (a[7][4:] == y).all()


def test_adamw_unscaled_and_decays_2d_weights(tmp_path, text_root):
    """A power-of-two loss scale in float32 leaves the update bit for bit
    (the update rule unscales before Adam); the decay acts on 2-D
    weights only."""
    rows = [{'precisions': ['float32'], 'modes': ['fp32', 'fixed:1024']}]
    config = write_config(tmp_path, text_root, rows, iterations=10)
    out = str(tmp_path / 'out')
    main(G.STUDY, ['--config', config, '--out', out, '--jobs', '1',
                   '--no-table'])
    a = read_run(out, 'float32-fp32-s0')
    b = read_run(out, 'float32-fixed_1024-s0')
    assert a['status'] == b['status'] == 'finished'
    assert b['loss_scale'] == 1024 and a['loss_scale'] in (None, 1)
    assert a['final_val_loss'] == b['final_val_loss']
    assert a['final_train_loss'] == b['final_train_loss']

    cfg = G.STUDY.load_config(config, [])
    cell = G.STUDY.cells(cfg)[0]
    run = G.STUDY.setup(cfg, cell)
    G.STUDY.load_data(run, None)
    model = G.STUDY.model(run, None)
    G.STUDY.optimizer(run, model)
    rates = {n: p.update_rule.hyperparam.weight_decay_rate
             for n, p in model.namedparams()}
    assert rates['/predictor/wte/W'] == pytest.approx(1e-3 * 0.1)
    assert rates['/predictor/blocks/0/mlp/c_fc/W'] == pytest.approx(1e-4)
    assert rates['/predictor/ln_f/ln/gamma'] == 0.0
    # the peer's model: tied readout, no biases anywhere
    assert not any(n.endswith(('/b', '/beta')) for n in rates)
    assert '/predictor/lm_head/W' not in rates


def test_warmup_cosine_is_the_peers():
    s = WarmupCosine(1e-3, 1e-4, 100, 2000, attr='lr')
    assert s.rate(0) == pytest.approx(1e-3 / 101)
    assert s.rate(99) == pytest.approx(1e-3 * 100 / 101)
    assert s.rate(100) == pytest.approx(1e-3)
    assert s.rate(1050) == pytest.approx(5.5e-4)
    assert s.rate(2000) == pytest.approx(1e-4)
    assert s.rate(2500) == 1e-4
    assert WarmupCosine(1e-3, 1e-4, 100, 2000).value(1050, 0) == \
        pytest.approx(0.55)


def run_entry(config, out, *args, kill=None):
    env = dict(os.environ)
    env.pop(ENV, None)
    if kill:
        env[ENV] = kill
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, 'experiments', 'gpt_table.py'),
         '--config', config, '--out', out, '--no-table', '--jobs', '1'] +
        list(args), cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300)


def final_state(out, name):
    folder = os.path.join(out, 'tiny', name)
    with numpy.load(os.path.join(folder, 'snapshot_latest')) as npz:
        arrays = {k: npz[k] for k in npz.files if 'elapsed_time' not in k
                  and k != 'extensions/LogReport/_log'}
    info = read_run(out, name)
    return arrays, {k: info[k] for k in (
        'status', 'iterations', 'final_val_loss', 'final_select_loss',
        'final_train_loss', 'loss_scale', 'skipped_steps')}


@pytest.mark.parametrize('precision,mode', [('fp8_e4m3', 'adaptive'),
                                            ('mixed16', 'dynamic')])
def test_kill_and_resume_is_exact(tmp_path, text_root, precision, mode):
    """SIGKILL at step 14 (after the snapshot of 10), then --resume: the
    final snapshot (weights, FP32 master weights, Adam's moments, loss
    scales, the window iterator) and run.json equal the uninterrupted
    run's."""
    rows = [{'precisions': [precision], 'modes': [mode]}]
    name = '{}-{}-s0'.format(precision, mode)
    config = write_config(tmp_path, text_root, rows)
    ref, out = str(tmp_path / 'ref'), str(tmp_path / 'out')
    assert run_entry(config, ref).returncode == 0
    p = run_entry(config, out, kill='train_batch:14')
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    assert read_run(out, name)['status'] == 'running'
    p = run_entry(config, out, '--resume')
    assert p.returncode == 0, p.stderr[-2000:]
    arrays, info = final_state(out, name)
    ref_arrays, ref_info = final_state(ref, name)
    assert info == ref_info
    assert sorted(arrays) == sorted(ref_arrays)
    for key in ref_arrays:
        numpy.testing.assert_array_equal(arrays[key], ref_arrays[key],
                                         err_msg=key)


def test_skipped_first_step_is_logged(tmp_path, text_root):
    """Dynamic scaling from 2^16 overflows E4M3 at step 1: the skipped
    steps are logged (Chainer's AdamW.lr raised before its first update,
    ending the grid)."""
    rows = [{'precisions': ['fp8_e4m3'], 'modes': ['dynamic']}]
    config = write_config(tmp_path, text_root, rows, iterations=10)
    out = str(tmp_path / 'out')
    main(G.STUDY, ['--config', config, '--out', out, '--jobs', '1',
                   '--no-table'])
    info = read_run(out, 'fp8_e4m3-dynamic-s0')
    assert info['status'] == 'finished', info.get('error')
    assert info['skipped_steps'] >= 1


def _run(val, select, status='finished'):
    return {'status': status, 'final_val_loss': val,
            'final_select_loss': select, 'unigram_val_loss': 3.0}


def test_held_out_fixed_chooses_on_select_of_other_seeds():
    """Seed 0 gets the scale best on seeds 1 and 2's select loss, although
    another scale has the better val loss; a scale missing a seed or with a
    diverged run among the others is not chosen."""
    by_mode = {
        'fixed:16.0': {0: _run(1.9, 1.8), 1: _run(1.9, 1.7),
                       2: _run(1.9, 1.7)},
        'fixed:64.0': {0: _run(1.5, 1.9), 1: _run(1.5, 1.9),
                       2: _run(1.5, 1.9)},
        'fixed:256.0': {0: _run(1.0, 1.0), 1: _run(None, None, 'diverged'),
                        2: _run(1.0, 1.0)},
        'fixed:1.0': {0: _run(1.0, 1.0), 1: _run(1.0, 1.0)},
        'adaptive': {0: _run(0.5, 0.5), 1: _run(0.5, 0.5),
                     2: _run(0.5, 0.5)},
    }
    chosen, scales = G.held_out_fixed(by_mode)
    assert scales[0] == 16.0 and chosen[0] is by_mode['fixed:16.0'][0]
    # seed 2: fixed:1 lacks seed 2, fixed:256 diverged on seed 1
    assert scales[2] == 16.0
    assert G.collapsed(by_mode['fixed:256.0'][1])
    assert not G.collapsed(by_mode['fixed:256.0'][0])
    assert G.collapsed(_run(3.0, 3.0))
