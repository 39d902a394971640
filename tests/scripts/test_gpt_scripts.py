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
