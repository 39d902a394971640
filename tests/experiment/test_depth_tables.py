"""The depth study's tables (second edition): the fixed scale chosen on the
other seeds (the winner's curse), adaptive against it paired by seed, the
paper's adaptive (guard=false) as its own column, columns only where runs
exist."""
import types

from ada_loss.experiment import runinfo as R
from ada_loss.experiment.studies import depth
from ada_loss.scaling import parse_mode


def _run(seed, acc, skipped=0):
    return {'seed': seed, 'status': R.FINISHED, 'final_test_accuracy': acc,
            'skipped_steps': skipped}


# fixed:16 has the best mean (one lucky seed); fixed:64 wins on the others
RUNS = {
    ('fp8_e4m3', 'resnet110', 'fixed:16'): [
        _run(0, 0.90), _run(1, 0.40), _run(2, 0.41)],
    ('fp8_e4m3', 'resnet110', 'fixed:64'): [
        _run(0, 0.50), _run(1, 0.52), _run(2, 0.53)],
    ('fp8_e4m3', 'resnet110', 'adaptive'): [
        _run(0, 0.55), _run(1, 0.56), _run(2, 0.50)],
    # keys as collect() makes them: the modes' canonical text
    ('fp8_e4m3', 'resnet110', str(parse_mode('adaptive:guard=false'))): [
        _run(0, 0.10, 94), _run(1, 0.10, 94), _run(2, 0.10, 94)],
}


def test_held_out_fixed_is_chosen_on_the_other_seeds():
    chosen, scales = depth.held_out_fixed(RUNS, 'fp8_e4m3', 'resnet110')
    # seed 0: the others favour 64 (0.525 > 0.405); seed 1: 16 (0.655 >
    # 0.515); seed 2: 16 (0.65 > 0.51)
    assert scales == {0: '64', 1: '16', 2: '16'}
    assert [chosen[s]['final_test_accuracy'] for s in (0, 1, 2)] == \
        [0.50, 0.40, 0.41]
    mode, best = depth.best_fixed(RUNS, 'fp8_e4m3', 'resnet110')
    assert mode == 'fixed:16'        # the in-sample winner
    assert best[0] > depth.stats(list(chosen.values()))[0]


def test_paired_table_and_columns():
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(models=['resnet110'],
                                   precisions=['fp8_e4m3']),
        study=types.SimpleNamespace(fp32=False))
    text = depth.paired(cfg, RUNS)
    # adaptive − held-out per seed: +5, +16, +9 points
    assert ('| resnet110 | fp8_e4m3 | 10.00 ± 0.00 (n=3) [94 skipped] | '
            '53.67 ± 3.21 (n=3) | 43.67 ± 5.51 (n=3) | +10.00 ± 5.57 | 3/3 |'
            ) in text
    table = depth.table1(cfg, RUNS)
    header = table.splitlines()[0]
    assert 'fp8_e4m3 Adaptive (paper)' in header
    assert 'Dynamic' not in header and 'Amax' not in header
    assert '10.00 ± 0.00 (n=3) [94 skipped]' in table
    assert '(S=64/16/16)' in table


def test_authors_style_has_its_own_column():
    """adaptive:style=authors (issue 37) is not merged into 'Adaptive'."""
    mode = str(parse_mode('adaptive:style=authors,update_interval=1000'))
    runs = dict(RUNS)
    runs[('fp8_e4m3', 'resnet110', mode)] = [
        _run(0, 0.20), _run(1, 0.30), _run(2, 0.40)]
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(models=['resnet110'],
                                   precisions=['fp8_e4m3']),
        study=types.SimpleNamespace(fp32=False))
    table = depth.table1(cfg, runs)
    header, _, row = [[c.strip() for c in line.strip('|').split('|')]
                      for line in table.splitlines()[:3]]
    assert row[header.index('fp8_e4m3 Adaptive (authors)')] == \
        '30.00 ± 10.00 (n=3)'
    assert row[header.index('fp8_e4m3 Adaptive')] == '53.67 ± 3.21 (n=3)'
