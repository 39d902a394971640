"""scripts/bench_gpt_step.py and scripts/gpt_copy_task.py run end to end on
a tiny shape and print one row per precision/mode."""
import sys

from repo_modules import load


def test_bench_gpt_step_prints_a_row_per_mode(monkeypatch, capsys):
    bench = load('scripts/bench_gpt_step.py')
    monkeypatch.setattr(sys, 'argv', [
        'bench_gpt_step.py', '--steps', '1', '--warmup', '0', '--batch', '2',
        '--block', '8', '--n-layer', '1', '--n-head', '2', '--n-embd', '16',
        '--vocab', '11', '--rows', 'float32/fp32', 'fp8_e4m3/adaptive'])
    bench.main()
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()
            if line.startswith(('float32/', 'fp8_e4m3/'))]
    assert [r[0] for r in rows] == ['float32/fp32', 'fp8_e4m3/adaptive']
    assert float(rows[0][3]) == 1.0 and all(r[4] == '0' for r in rows)


def test_copy_task_runs_a_row(capsys):
    task = load('scripts/gpt_copy_task.py')
    losses, skipped = task.run('float32/fp32', 2)
    assert len(losses) == 2 and skipped == 0
    assert abs(losses[0] - 2.94) < 0.1     # chance at initialization


def _tiny_run(tmp_path, precision, mode):
    """A finished 10-step run of the GPT table on a generated text: its
    folder and the text's folder."""
    import numpy
    import yaml
    from ada_loss.experiment.runner import main
    from ada_loss.experiment.studies import gpt as G
    rng = numpy.random.RandomState(0)
    words = 'the and of to in that he shall unto for his lord'.split()
    root = tmp_path / 'kjv'
    root.mkdir()
    (root / 'kjv.txt').write_text('\n'.join(
        'Ge1:{} {}.'.format(i, ' '.join(words[j] for j in rng.randint(
            0, len(words), 8))) for i in range(200)) + '\n')
    cfg = {'table': 'tiny',
           'grid': {'seeds': [1], 'rows': [{'precisions': [precision],
                                            'modes': [mode]}]},
           'model': {'n_layer': 1, 'n_head': 2, 'n_embd': 16,
                     'block_size': 8},
           'data': {'kjv_root': str(root), 'eval_iters': 2},
           'train': {'batchsize': 4, 'max_iterations': 10,
                     'warmup_iterations': 2, 'lr_decay_iterations': 10},
           'log': {'log_interval': '5 iteration',
                   'eval_interval': '5 iteration',
                   'snapshot_interval': '5 iteration', 'progress': 'none',
                   'plot': False, 'tensorboard': False}}
    config = tmp_path / 'tiny.yaml'
    config.write_text(yaml.safe_dump(cfg))
    out = str(tmp_path / 'out')
    assert main(G.STUDY, ['--config', str(config), '--out', out, '--jobs',
                          '1', '--no-table']) in (0, None)
    folder = tmp_path / 'out' / 'tiny' / '{}-{}-s1'.format(
        precision, mode)
    return str(folder), root


def test_flush_probe_at_the_end_of_a_run(tmp_path, capsys):
    """--run loads the run's own last state: the model it builds scores the
    run's final validation loss on the run's val batches, and the probe
    prints one row per mode for that state."""
    import json
    import os
    import chainer
    import numpy
    import pytest
    from ada_loss.models.gpt import lm_loss
    from ada_loss.training import dtype_config
    probe = load('scripts/gpt_flush_probe.py')
    run, root = _tiny_run(tmp_path, 'fp8_e4m3', 'adaptive')
    with open(os.path.join(run, 'run.json')) as f:
        info = json.load(f)
    args = probe._parser().parse_args(['--run', run])
    trained, shape, first, state = probe._run_state(args)
    assert args.precision == 'fp8_e4m3' and args.seed == 1
    assert 'iteration 10' in state
    m = probe._model(args, trained, shape)
    from ada_loss.datasets.kjv import get_kjv
    losses = []
    with chainer.using_config('train', False):
        for x, t in get_kjv(str(root), make=False).eval_batches(
                'val', 8, 4, 2):
            with dtype_config('fp8_e4m3'):
                y = m(x)
            losses.append(float(lm_loss(y, t).array))
    assert numpy.mean(losses) == pytest.approx(info['final_val_loss'],
                                               rel=1e-6)
    numpy.testing.assert_array_equal(first[0], get_kjv(
        str(root), make=False).eval_batches('val', 8, 4, 2)[0][0])
    capsys.readouterr()
    probe.main(['--run', run, '--modes', 'fixed:1', 'adaptive'])
    out = capsys.readouterr().out
    assert 'fp8_e4m3, GPT 1x2x16 block 8, batch 4' in out
    rows = [line.split() for line in out.splitlines()
            if line.startswith(('fixed:1 ', 'adaptive '))]
    assert [r[0] for r in rows] == ['fixed:1', 'adaptive']


def test_flush_probe_refuses_a_run_not_at_its_end(tmp_path):
    import shutil
    import os
    import pytest
    probe = load('scripts/gpt_flush_probe.py')
    run, _ = _tiny_run(tmp_path, 'float32', 'fp32')
    shutil.copy(os.path.join(run, 'snapshot_previous'),
                os.path.join(run, 'snapshot_latest'))
    with pytest.raises(SystemExit, match='holds iteration 5, the run ended '
                       'at 10'):
        probe.main(['--run', run])


def test_weight_cast_counts_planted_weights():
    """Planted weights: 2^-8 is subnormal in E4M3 and kept unscaled (its
    subnormal step is 2^-9), 2^-11 flushes; scaled to 448 neither is below
    the smallest normal; 1.0 and 448 cast exactly."""
    import numpy
    cast = load('scripts/gpt_weight_cast.py')
    w = {'a': numpy.array([1.0, 2.0 ** -8, 2.0 ** -11, 0.0], numpy.float32)}
    below, flushed, rel = cast.cast_stats(w, scaled=False)
    assert below == 2 / 3 and flushed == 1 / 3
    assert abs(rel - 2.0 ** -11 / (1 + 2.0 ** -16 + 2.0 ** -22) ** 0.5) < 1e-9
    below, flushed, rel = cast.cast_stats(w, scaled=True)
    assert below == 0 and flushed == 0 and rel == 0.0


def test_weight_cast_reads_a_run(tmp_path, capsys):
    cast = load('scripts/gpt_weight_cast.py')
    run, _ = _tiny_run(tmp_path, 'float32', 'fp32')
    ws = cast.weights(run)
    assert {'blocks/0/attn/c_attn/W', 'wte/W'} <= set(ws)
    assert all(w.dtype == 'float32' for w in ws.values())
    cast.main([run])
    out = capsys.readouterr().out
    assert 'unscaled' in out and 'per-tensor amax -> 448' in out
