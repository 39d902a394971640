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
        grid=types.SimpleNamespace(datasets=['fashion_mnist'], models=['resnet110'],
                                   precisions=['fp8_e4m3']),
        study=types.SimpleNamespace(fp32=False))
    text = depth.paired(cfg, RUNS)
    # adaptive − held-out per seed: +5, +16, +9 points: mean 10, std 5.57,
    # 95 % half-width t(0.975, 2) · 5.57 / √3 = 4.303 · 3.215 = 13.83
    assert ('| resnet110 | fp8_e4m3 | adaptive | 53.67 ± 3.21 (n=3) | '
            '43.67 ± 5.51 (n=3) | +10.00 ± 13.83 (n=3) | +10.00 ± 13.83 (n=3) '
            '| level | level | 3/3 |'
            ) in text
    # the paper's algorithm: 10 − (50, 40, 41) = −40, −30, −31: behind
    assert ('| adaptive:guard=false | 10.00 ± 0.00 (n=3) [94 skipped] | '
            '43.67 ± 5.51 (n=3) | -33.67 ± 13.68 (n=3) | -33.67 ± 13.68 (n=3) '
            '| behind | behind | 0/3 |'
            ) in text
    table = depth.table1(cfg, RUNS)
    header = table.splitlines()[0]
    assert 'fp8_e4m3 Adaptive (paper)' in header
    assert 'Dynamic' not in header and 'Amax' not in header
    assert '10.00 ± 0.00 (n=3) [94 skipped]' in table
    assert '(S=64/16/16)' in table


def test_a_method_that_never_finished_keeps_its_row():
    """A method that diverged on every seed (the GPU's fp8_e4m3 adaptive
    at one epoch, docs/gpu.md) is in the paired table, saying there is no
    pair, instead of leaving the table empty as if it had not run."""
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(datasets=['fashion_mnist'], models=['resnet20'],
                                   precisions=['fp8_e4m3']),
        study=types.SimpleNamespace(fp32=False))
    diverged = {'status': R.DIVERGED, 'final_test_accuracy': None,
                'skipped_steps': 300}
    runs = {('fp8_e4m3', 'resnet20', 'fixed:256'): [
        _run(s, 0.85) for s in range(3)],
        ('fp8_e4m3', 'resnet20', 'adaptive'): [
        dict(diverged, seed=s) for s in range(3)]}
    rows = [r for r in depth.paired(cfg, runs).splitlines()
            if r.startswith('| resnet20')]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip('|').split('|')]
    assert cells[2] == 'adaptive'
    # pairs dropped: none left; diverged at chance (10 %): 10 − 85 on
    # every seed, and the verdict is that one's (issue 47)
    assert cells[5] == '–'
    assert cells[6] == '-75.00 ± 0.00 (n=3)'
    assert cells[7] == 'behind' and cells[8] == 'behind'
    assert cells[9] == '0/3'
    assert 'diverged (3)' in cells[3] and '85.00' in cells[4]
    # a method whose runs have not ended has no pair at all, and says so
    running = {('fp8_e4m3', 'resnet20', 'fixed:256'): runs[
        ('fp8_e4m3', 'resnet20', 'fixed:256')],
        ('fp8_e4m3', 'resnet20', 'adaptive'): [
        {'seed': s, 'status': R.RUNNING} for s in range(3)]}
    rows = [r for r in depth.paired(cfg, running).splitlines()
            if r.startswith('| resnet20')]
    cells = [c.strip() for c in rows[0].strip('|').split('|')]
    assert cells[7] == 'no seed where both ended' and cells[9] == '0/0'


def test_diverged_runs_scored_at_chance_change_the_verdict():
    """Issue 47: a pair with a diverged side was dropped, hiding the
    failure of whichever side diverged; scored at chance (10 % on a
    10-class dataset) it counts against it, and the verdict is that one's.
    Holm's verdict over the table's rows stands beside the raw one."""
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(datasets=['fashion_mnist'],
                                   models=['resnet20'],
                                   precisions=['fp8_e4m3']),
        study=types.SimpleNamespace(fp32=False))
    base = [_run(s, a) for s, a in enumerate((0.70, 0.71, 0.69, 0.70))]
    base[3] = {'seed': 3, 'status': R.DIVERGED,
               'final_test_accuracy': None, 'skipped_steps': 0}
    runs = {('fp8_e4m3', 'resnet20', 'adaptive'): base,
            ('fp8_e4m3', 'resnet20', 'adaptive:init_scale=amax'): [
            _run(s, a) for s, a in enumerate((0.69, 0.70, 0.68, 0.70))]}
    row = [r for r in depth.option_paired(cfg, runs).splitlines()
           if r.startswith('| resnet20')][0]
    cells = [c.strip() for c in row.strip('|').split('|')]
    # dropped: −1, −1, −1 (seed 3 gone): behind on three seeds
    assert cells[5] == '-1.00 ± 0.00 (n=3)'
    # at chance: −1, −1, −1, +60: mean 14.25, level
    assert cells[6].startswith('+14.25 ± ') and cells[6].endswith('(n=4)')
    assert cells[7] == 'level' and cells[8] == 'level'
    assert cells[9] == '1/4'


def test_an_option_of_a_mode_against_the_mode_default():
    """``adaptive:init_scale=amax`` against ``adaptive`` in the same
    precision, paired by seed (issue 32 item 2); ``adaptive:guard=false``
    too; a mode whose default has no runs gets no row."""
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(datasets=['fashion_mnist'], models=['resnet20'],
                                   precisions=['fp8_e4m3', 'mixed16']),
        study=types.SimpleNamespace(fp32=False))
    runs = {('fp8_e4m3', 'resnet20', 'adaptive'): [
        _run(0, 0.80), _run(1, 0.78), _run(2, 0.83)],
        ('fp8_e4m3', 'resnet20', 'adaptive:init_scale=amax'): [
        _run(0, 0.88), _run(1, 0.89), _run(2, 0.87)],
        ('mixed16', 'resnet20', 'adaptive:init_scale=amax'): [
        _run(0, 0.90)]}
    text = depth.option_paired(cfg, runs)
    rows = [r for r in text.splitlines() if r.startswith('| resnet20')]
    assert len(rows) == 1
    # +8, +11, +4: mean 7.67, std 3.51, half-width 4.303 · 3.51 / √3 = 8.72
    assert ('| resnet20 | fp8_e4m3 | adaptive:init_scale=amax | '
            '88.00 ± 1.00 (n=3) | 80.33 ± 2.52 (n=3) | +7.67 ± 8.72 (n=3) '
            '| +7.67 ± 8.72 (n=3) | level | level | 3/3 |') in text
    assert depth.option_paired(cfg, {
        ('fp8_e4m3', 'resnet20', 'adaptive'): [_run(0, 0.5)]}) == ''


def test_two_adaptive_modes_two_columns():
    """``grid.modes=[adaptive, "adaptive:init_scale=auto"]`` (issue 32 item
    4, issue 39 item 1): two columns, never one "Adaptive" averaging both
    (n = 8 for four seeds)."""
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(datasets=['fashion_mnist'], models=['resnet110'],
                                   precisions=['fp8_e4m3']),
        study=types.SimpleNamespace(fp32=False))
    runs = {('fp8_e4m3', 'resnet110', 'adaptive'): [
        _run(s, 0.50) for s in range(4)],
        ('fp8_e4m3', 'resnet110', 'adaptive:init_scale=auto'): [
        _run(s, 0.70) for s in range(4)]}
    header, _, row = depth.table1(cfg, runs).splitlines()
    cols = [c.strip() for c in header.strip('|').split('|')]
    cells = dict(zip(cols, [c.strip() for c in row.strip('|').split('|')]))
    assert cols == ['Depth', 'fp8_e4m3 adaptive',
                    'fp8_e4m3 adaptive:init_scale=auto']
    assert cells['fp8_e4m3 adaptive'] == '50.00 ± 0.00 (n=4)'
    assert cells['fp8_e4m3 adaptive:init_scale=auto'] == '70.00 ± 0.00 (n=4)'


def test_reuse_only_runs_of_the_same_config(tmp_path):
    """Issue 39 item 5: an earlier edition's runs fill the cells only when
    the config that determines their numbers is this one (the edition's
    config.yaml beside its results.json); else they are left out, and the
    table says so."""
    import json
    import os
    from ada_loss.experiment import config as C
    study = depth.STUDY
    sets = ['grid.models=[resnet20]', 'grid.seeds=[0]', 'grid.modes=[none]',
            'grid.fixed_scales=[]', 'grid.precisions=[fp8_e4m3]',
            'study.fig4.run=false']
    edition = tmp_path / 'edition'
    edition.mkdir()
    old = study.load_config(None, sets)
    (edition / 'config.yaml').write_text(C.dump(old))
    (edition / 'results.json').write_text(json.dumps({
        'fp8_e4m3|resnet20|none': [{'seed': 0, 'status': 'finished',
                                     'final_test_accuracy': 0.25}]}))
    reuse = 'study.reuse=' + str(edition / 'results.json')
    same = study.load_config(None, sets + [reuse, 'log.progress=bar'])
    runs, left = depth.collect(study, same, str(tmp_path / 'out'))
    assert left == [] and runs['fp8_e4m3', 'resnet20', 'none'][0]['reused']
    smaller = study.load_config(None, sets + [
        reuse, 'data.train_size=256', 'train.epochs=0.25'])
    runs, left = depth.collect(study, smaller, str(tmp_path / 'out'))
    assert not runs['fp8_e4m3', 'resnet20', 'none']
    assert left == [('resnet20-cifar10-none-s0',
                     'config differs (data.train_size, train.epochs)')]
    t1, _ = depth.write_outputs(smaller, str(tmp_path / 'out'), runs, left)
    assert '1 runs of study.reuse' in t1 and 'left out' in t1
    os.remove(str(edition / 'config.yaml'))
    depth._edition.cache_clear()
    runs, left = depth.collect(study, same, str(tmp_path / 'out'))
    assert 'no config.yaml beside' in left[0][1]


def test_recipe_comparison_and_robustness():
    """grad=loss methods against the recipe (same precision without
    grad=loss, mode none), paired; collapse = > 20 points below the FP32
    run of the same seed, with Wilson's interval."""
    gl = 'fp8_e4m3:recipe=current,grad=loss'
    assert depth.without_grad_loss(gl) == 'fp8_e4m3:recipe=current'
    assert depth.without_grad_loss('fp8_e4m3') is None
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(datasets=['fashion_mnist'], models=['resnet56'],
                                   precisions=[gl, 'fp8_e4m3:recipe=current']),
        study=types.SimpleNamespace(fp32=True))
    runs = {
        ('float32', 'resnet56', 'fp32'): [_run(s, 0.70) for s in range(4)],
        ('fp8_e4m3:recipe=current', 'resnet56', 'none'): [
            _run(s, 0.66) for s in range(4)],
        (gl, 'resnet56', 'adaptive'): [
            _run(0, 0.60), _run(1, 0.62), _run(2, 0.61), _run(3, 0.45)],
    }
    text = depth.recipe_paired(cfg, runs)
    # −6, −4, −5, −21: mean −9, std 8.04, half-width 3.182·8.04/2 = 12.80
    assert '| resnet56 | {} | adaptive |'.format(gl) in text
    assert '-9.00 ± 12.80 (n=4) | -9.00 ± 12.80 (n=4) | level | level | 0/4 |' \
        in text
    robust = depth.robustness(cfg, runs)
    # seed 3 ends at 45 < 70 − 20: one collapse in four (Wilson 4.6–69.9 %)
    assert '| resnet56 | {} | adaptive | 57.00 ± 8.04 (n=4) | 1/4 (5–70 %) |'\
        .format(gl) in robust
    assert '| fp8_e4m3:recipe=current | none | 66.00 ± 0.00 (n=4) | ' \
        '0/4 (0–49 %) |' in robust


def test_robustness_counts_the_held_out_scales_failures():
    """The held-out fixed scale the methods are compared with has its own
    collapse rate (issue 47: its divergence at depth 20 was hidden)."""
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(datasets=['fashion_mnist'],
                                   models=['resnet20'],
                                   precisions=['fp8_e4m3']),
        study=types.SimpleNamespace(fp32=True))
    diverged = {'status': R.DIVERGED, 'final_test_accuracy': None,
                'skipped_steps': 0}
    runs = {
        ('float32', 'resnet20', 'fp32'): [_run(s, 0.70) for s in range(3)],
        # 64 is best on the other seeds for every seed; it diverges on 2
        ('fp8_e4m3', 'resnet20', 'fixed:64'): [
            _run(0, 0.69), _run(1, 0.69), dict(diverged, seed=2)],
        ('fp8_e4m3', 'resnet20', 'fixed:16'): [
            _run(0, 0.60), _run(1, 0.61), _run(2, 0.60)],
        ('fp8_e4m3', 'resnet20', 'adaptive'): [
            _run(s, 0.68) for s in range(3)],
    }
    robust = depth.robustness(cfg, runs)
    row = [r for r in robust.splitlines() if '| Fixed (held-out) |' in r]
    assert len(row) == 1 and '| 1/' in row[0]


def test_authors_style_has_its_own_column():
    """adaptive:style=authors (issue 37) is not merged into 'Adaptive'."""
    mode = str(parse_mode('adaptive:style=authors,update_interval=1000'))
    runs = dict(RUNS)
    runs[('fp8_e4m3', 'resnet110', mode)] = [
        _run(0, 0.20), _run(1, 0.30), _run(2, 0.40)]
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(datasets=['fashion_mnist'], models=['resnet110'],
                                   precisions=['fp8_e4m3']),
        study=types.SimpleNamespace(fp32=False))
    table = depth.table1(cfg, runs)
    header, _, row = [[c.strip() for c in line.strip('|').split('|')]
                      for line in table.splitlines()[:3]]
    assert row[header.index('fp8_e4m3 Adaptive (authors)')] == \
        '30.00 ± 10.00 (n=3)'
    assert row[header.index('fp8_e4m3 Adaptive')] == '53.67 ± 3.21 (n=3)'


def test_recipe_variants_against_the_full_recipe():
    """What each part of a recipe buys (issue 33): ``nvfp4:rht=false``
    against ``nvfp4`` (both mode none), paired by seed; the full recipe, a
    grad=loss precision and a precision without options get no row."""
    assert depth.full_recipe('nvfp4:rht=false') == 'nvfp4'
    assert depth.full_recipe('nvfp4') is None
    assert depth.full_recipe('mixed16') is None
    assert depth.full_recipe('fp8_e4m3:recipe=current,grad=loss') is None
    cfg = types.SimpleNamespace(grid=types.SimpleNamespace(
        datasets=['fashion_mnist'], models=['resnet20'],
        precisions=['nvfp4', 'nvfp4:rht=false']))
    runs = {
        ('nvfp4', 'resnet20', 'none'): [_run(s, 0.60) for s in range(3)],
        ('nvfp4:rht=false', 'resnet20', 'none'): [
            _run(0, 0.62), _run(1, 0.63), _run(2, 0.64)],
    }
    text = depth.variant_paired(cfg, runs)
    # +2, +3, +4: mean 3, std 1, half-width 4.303 / sqrt(3) = 2.48
    assert '| resnet20 | nvfp4:rht=false | none |' in text
    assert '+3.00 ± 2.48 (n=3) | +3.00 ± 2.48 (n=3) | ahead | ahead | 3/3 |' in text
    assert text.count('\n') == 2           # header, rule, one row
    assert depth.variant_paired(cfg, {}) == ''


def test_fixed_scale_chosen_on_other_seeds_results(tmp_path):
    """study.choose_fixed_on: the scale is the best mean over another
    grid's runs (a scale with an unfinished run is no candidate), and
    every seed of this grid is scored against it."""
    import json
    design = {
        'fp8_e4m3|resnet110|fixed:16': [
            {'seed': 0, 'status': R.FINISHED, 'final_test_accuracy': 0.9},
            {'seed': 1, 'status': R.DIVERGED, 'final_test_accuracy': None}],
        'fp8_e4m3|resnet110|fixed:64': [
            {'seed': 0, 'status': R.FINISHED, 'final_test_accuracy': 0.5},
            {'seed': 1, 'status': R.FINISHED, 'final_test_accuracy': 0.6}],
        'fp8_e4m3|resnet110|fixed:256': [
            {'seed': 0, 'status': R.FINISHED, 'final_test_accuracy': 0.5},
            {'seed': 1, 'status': R.FINISHED, 'final_test_accuracy': 0.5}],
        'fp8_e4m3|resnet110|adaptive': [
            {'seed': 0, 'status': R.FINISHED, 'final_test_accuracy': 0.99}],
    }
    path = tmp_path / 'results.json'
    path.write_text(json.dumps(design))
    depth.chosen_scales.cache_clear()
    chosen = depth.chosen_scales(str(path))
    assert chosen == {('fp8_e4m3', 'resnet110'): '64'}
    runs, scales = depth.held_out_fixed(RUNS, 'fp8_e4m3', 'resnet110',
                                        chosen)
    assert scales == {0: '64', 1: '64', 2: '64'}
    assert [runs[s]['final_test_accuracy'] for s in (0, 1, 2)] == \
        [0.50, 0.52, 0.53]
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(datasets=['fashion_mnist'], models=['resnet110'],
                                   precisions=['fp8_e4m3']),
        study=types.SimpleNamespace(fp32=False, choose_fixed_on=str(path)))
    # adaptive − fixed:64 per seed: +5, +4, −3 points
    assert ('| resnet110 | fp8_e4m3 | adaptive | 53.67 ± 3.21 (n=3) | '
            '51.67 ± 1.53 (n=3) | +2.00 ±') in depth.paired(cfg, RUNS)
    # a precision the design grid has no scale for: no comparison
    assert depth.held_out_fixed(RUNS, 'fp8_e4m3', 'resnet56', chosen) == \
        ({}, {})


def test_choose_fixed_on_a_missing_file_is_refused_at_config_time(
        tmp_path):
    import pytest
    from ada_loss.experiment import config as C
    with pytest.raises(C.ConfigError) as e:
        depth.STUDY.load_config(None, ['study.choose_fixed_on={}'.format(
            tmp_path / 'nowhere.json')])
    assert 'study.choose_fixed_on' in str(e.value)
    assert "results.json" in str(e.value)


def test_the_tables_say_where_the_fixed_scales_were_chosen(tmp_path):
    import json
    design = {'fp8_e4m3|resnet110|fixed:16': [
        {'seed': 0, 'status': R.FINISHED, 'final_test_accuracy': 0.9}]}
    path = tmp_path / 'design.json'
    path.write_text(json.dumps(design))
    cfg = depth.STUDY.load_config(None, [
        'study.choose_fixed_on={}'.format(path), 'grid.models=[resnet110]',
        'grid.precisions=[fp8_e4m3]', 'grid.fixed_scales=[16,64]',
        'grid.modes=[adaptive]', 'study.fp32=false', 'table=t'])
    t1, _ = depth.write_outputs(cfg, str(tmp_path), RUNS)
    assert ('The fixed scales were chosen on other seeds ({}: the best mean '
            'there): resnet110 fp8_e4m3 S=16.'.format(path)) in t1
    # adaptive − fixed:16 on every seed: −35, +16, +9
    assert ('| resnet110 | fp8_e4m3 | adaptive | 53.67 ± 3.21 (n=3) | '
            '57.00 ± 28.58 (n=3) | -3.33 ±') in t1


def test_chosen_scales_ties_precision_text_and_a_scale_not_trained_here(
        tmp_path):
    import json
    done = {'status': R.FINISHED}
    design = {
        # the precision's options in another order: the same precision
        'fp8_e4m3:grad=loss,recipe=current|resnet20|fixed:16': [
            dict(done, seed=0, final_test_accuracy=0.6)],
        'fp8_e4m3:grad=loss,recipe=current|resnet20|fixed:64': [
            dict(done, seed=0, final_test_accuracy=0.6)],
    }
    path = tmp_path / 'design.json'
    path.write_text(json.dumps(design))
    depth.chosen_scales.cache_clear()
    # a tie keeps the smaller scale, as held_out_fixed does
    assert depth.chosen_scales(str(path)) == {
        ('fp8_e4m3:recipe=current,grad=loss', 'resnet20'): '16'}
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(
            datasets=['fashion_mnist'], models=['resnet20'],
            precisions=['fp8_e4m3:recipe=current,grad=loss']),
        study=types.SimpleNamespace(fp32=False, choose_fixed_on=str(path)))
    runs = {('fp8_e4m3:recipe=current,grad=loss', 'resnet20', 'adaptive'): [
        _run(0, 0.5), _run(1, 0.6)]}
    # no fixed:16 run here: the method keeps its row, saying so
    assert 'no seed where both ended' in depth.paired(cfg, runs)


def test_held_out_scale_is_chosen_on_the_selection_split():
    """Issue 47: where the runs recorded their selection-split accuracy,
    the held-out scale is chosen on it, not on the test images it is
    scored on; the tables say which images chose."""
    def run(seed, test, val):
        return dict(_run(seed, test), final_val_accuracy=val)
    # on the test images fixed:16 wins on the other seeds; on the
    # selection split fixed:64 does
    runs = {
        ('fp8_e4m3', 'resnet20', 'fixed:16'): [
            run(s, 0.80, 0.50) for s in range(3)],
        ('fp8_e4m3', 'resnet20', 'fixed:64'): [
            run(s, 0.60, 0.70) for s in range(3)]}
    _, scales = depth.held_out_fixed(runs, 'fp8_e4m3', 'resnet20')
    assert scales == {0: '64', 1: '64', 2: '64'}
    cfg = types.SimpleNamespace(grid=types.SimpleNamespace(
        datasets=['fashion_mnist'], models=['resnet20'],
        precisions=['fp8_e4m3']))
    assert 'selection split' in depth.split_note(cfg, runs)
    assert 'test images' not in depth.split_note(cfg, runs)
    # one candidate without it: the choice falls back to the test images,
    # and the note says so
    old = dict(runs)
    old[('fp8_e4m3', 'resnet20', 'fixed:64')] = [
        _run(s, 0.60) for s in range(3)]
    _, scales = depth.held_out_fixed(old, 'fp8_e4m3', 'resnet20')
    assert scales == {0: '16', 1: '16', 2: '16'}
    assert 'test images the table reports' in depth.split_note(cfg, old)


def test_the_table_checks_the_config_of_every_run_it_pools(tmp_path):
    """Issue 47 item 3: each pooled run's config.yaml is compared with the
    table's config for its cell; a run that ran another config is named
    with the keys that differ, one without a config is unverified."""
    import yaml
    from ada_loss.experiment import config as C
    study = depth.STUDY
    cfg = study.load_config(None, ['grid.models=[resnet20]',
                                   'grid.precisions=[fp8_e4m3]',
                                   'grid.modes=[adaptive]',
                                   'grid.fixed_scales=[]', 'grid.seeds=[0]'])
    cell = [c for c in study.cells(cfg) if str(c.mode) == 'adaptive'][0]
    same = tmp_path / 'same'
    same.mkdir()
    (same / 'config.yaml').write_text(C.dump(study.run_config(cfg, cell)))
    got = depth.pooled_config(study, cfg, cell, str(same))
    assert got['config_differs'] == [] and len(got['config_sha256']) == 64
    other = tmp_path / 'other'
    other.mkdir()
    plain = C.to_plain(study.run_config(cfg, cell))
    plain['train']['lr'] = 0.5
    (other / 'config.yaml').write_text(yaml.safe_dump(plain))
    assert depth.pooled_config(study, cfg, cell, str(other))[
        'config_differs'] == ['train.lr']
    assert depth.pooled_config(study, cfg, cell, str(tmp_path / 'none')) \
        == {'config_differs': None}
    runs = {('fp8_e4m3', 'resnet20', 'adaptive'): [
        dict(_run(0, 0.5), config_differs=['train.lr'], git_commit='a' * 40),
        dict(_run(1, 0.5), config_differs=[], git_commit='a' * 40),
        dict(_run(2, 0.5), reused=True)]}
    note = depth.provenance_note(runs)
    assert '1 pooled runs ran another config' in note
    assert 'resnet20 fp8_e4m3 adaptive seed 0 (train.lr)' in note
    assert '1 pooled runs have no config.yaml' in note
    assert 'aaaaaaaaaa (2)' in note and 'unknown (1)' in note


def test_a_tie_chooses_the_smaller_scale_whatever_the_order_of_the_runs(
        tmp_path):
    """results.json's keys come sorted as text (the committed third_audit:
    fixed:16, fixed:256, fixed:4, fixed:64); a tie kept the scale met first,
    so the table's choice hung on that order (fixed:16 here) while
    scripts/recompute_depth_tables.py, by its definition, keeps the smaller
    (fixed:4) and reported the table's cell as a mismatch. Every choice now
    keeps the smaller scale."""
    import json

    def run(seed, acc):
        return dict(_run(seed, acc), final_val_accuracy=acc)
    for order in (('16', '4'), ('4', '16')):
        accs = {'16': (0.50, 0.60, 0.70), '4': (0.55, 0.60, 0.70)}
        runs = {('fp8_e4m3', 'resnet20', 'fixed:' + s): [
            run(seed, a) for seed, a in enumerate(accs[s])] for s in order}
        # seed 0 held out: both means over seeds 1 and 2 are 65 %
        assert depth.held_out_fixed(runs, 'fp8_e4m3', 'resnet20')[1] == {
            0: '4', 1: '4', 2: '4'}
        tie = {('fp8_e4m3', 'resnet20', 'fixed:' + s): [
            run(0, a), run(1, b)] for s, (a, b) in
            (sorted({'16': (0.6, 0.7), '4': (0.7, 0.6)}.items(),
                    key=lambda kv: order.index(kv[0])))}
        assert depth.best_fixed(tie, 'fp8_e4m3', 'resnet20')[0] == 'fixed:4'
        path = tmp_path / 'design{}.json'.format(order[0])
        path.write_text(json.dumps({
            'fp8_e4m3|resnet20|fixed:' + s: [
                dict(run(0, 0.6), seed=0)] for s in order}))
        depth.chosen_scales.cache_clear()
        assert depth.chosen_scales(str(path)) == {
            ('fp8_e4m3', 'resnet20'): '4'}


def test_the_split_note_names_the_split_the_scales_were_chosen_on_elsewhere(
        tmp_path):
    """With study.choose_fixed_on the scale is chosen on another grid's
    runs: the note must say which images *those* runs chose on. A
    confirmation whose own runs recorded a selection split, scored against
    scales chosen on another grid's test accuracy, was said to be "chosen
    on the selection split" (the note read this grid's runs)."""
    import json

    def run(seed, test, val=None):
        r = _run(seed, test)
        if val is not None:
            r['final_val_accuracy'] = val
        return r
    # the design grid recorded no selection split: chosen on test accuracy
    design = {'mixed16|resnet56|fixed:' + s: [
        dict(run(seed, a), seed=seed) for seed in (0, 1)]
        for s, a in (('4', 0.7), ('16', 0.6))}
    path = tmp_path / 'design.json'
    path.write_text(json.dumps(design))
    depth.chosen_scales.cache_clear()
    assert depth.chosen_scales(str(path)) == {('mixed16', 'resnet56'): '4'}
    cfg = types.SimpleNamespace(
        grid=types.SimpleNamespace(datasets=['fashion_mnist'],
                                   models=['resnet56'],
                                   precisions=['mixed16']),
        study=types.SimpleNamespace(fp32=False, choose_fixed_on=str(path)))
    # the confirmation's runs (new seeds) did record a selection split
    runs = {('mixed16', 'resnet56', 'fixed:4'): [
        run(s, 0.70, 0.71) for s in (8, 9)],
        ('mixed16', 'resnet56', 'adaptive'): [
        run(s, 0.69, 0.70) for s in (8, 9)]}
    note = depth.split_note(cfg, runs)
    assert 'on the test images' in note and 'resnet56 mixed16' in note
    assert 'on the selection split' not in note
    # and the other way round: chosen on the design grid's selection split
    design = {k: [dict(r, final_val_accuracy=r['final_test_accuracy'])
                  for r in rs] for k, rs in design.items()}
    path2 = tmp_path / 'design_val.json'
    path2.write_text(json.dumps(design))
    cfg.study.choose_fixed_on = str(path2)
    old = {k: [_run(r['seed'], r['final_test_accuracy']) for r in rs]
           for k, rs in runs.items()}
    note = depth.split_note(cfg, old)
    assert 'on the selection split' in note and 'test images' not in note


def test_pooled_runs_that_read_different_data_files_are_named():
    """config_changes compares the data keys (a folder's path), not the
    files in it: a run that read other Fashion-MNIST files at the same path
    has the table's config, and was pooled without a word. run.json's data
    record (the files' fingerprint) now says so."""
    def run(seed, fingerprint):
        return dict(_run(seed, 0.5), config_differs=[], git_commit='a' * 40,
                    data={'roots': {}, 'files': {},
                          'fingerprint': fingerprint * 64})
    runs = {('fp8_e4m3', 'resnet20', 'adaptive'): [
        run(0, 'a'), run(1, 'a'), run(2, 'b')]}
    note = depth.provenance_note(runs)
    assert 'read different data files' in note
    assert 'bbbbbbbbbb (1: resnet20 fp8_e4m3 adaptive seed 2)' in note
    runs = {('fp8_e4m3', 'resnet20', 'adaptive'): [
        run(0, 'a'), run(1, 'a'), dict(_run(2, 0.5), config_differs=[])]}
    assert 'data' not in depth.provenance_note(runs)


def test_the_table_says_fixed_best_is_chosen_on_the_test_images(tmp_path):
    """Issue 47: the tables say which images chose what. Fixed (best) is
    the best mean test accuracy of the very runs it reports (also where a
    selection split was recorded): the table says so, and says it only
    where there is a fixed scale."""
    cfg = depth.STUDY.load_config(None, [
        'grid.models=[resnet110]', 'grid.precisions=[fp8_e4m3]',
        'grid.fixed_scales=[16,64]', 'grid.modes=[adaptive]',
        'study.fp32=false', 'table=t'])
    t1, _ = depth.write_outputs(cfg, str(tmp_path), RUNS)
    assert '| Fixed (best)' in t1 or 'Fixed (best) |' in t1
    assert ('Fixed (best) = the scale with the best mean final test '
            'accuracy over these runs: chosen on the test images') in t1
    adaptive = {k: v for k, v in RUNS.items() if k[2] == 'adaptive'}
    t1, _ = depth.write_outputs(cfg, str(tmp_path), adaptive)
    assert 'Fixed (best) =' not in t1
