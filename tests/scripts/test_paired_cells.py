"""scripts/paired_cells.py: two cells of a results.json paired by seed, as
the depth study's tables pair them (finished runs on common seeds only)."""
import json

import pytest

from repo_modules import load

pc = load('scripts/paired_cells.py')


def _write(tmp_path):
    def run(seed, acc, status='finished'):
        return {'seed': seed, 'status': status, 'final_test_accuracy': acc}
    results = {
        'mixed16|resnet56|fixed:4': [run(0, 0.70), run(1, 0.60),
                                     run(2, 0.65), run(3, 0.50)],
        'mixed16|resnet56|fixed:16': [run(0, 0.68), run(1, 0.57),
                                      run(2, 0.0, 'diverged')],
    }
    path = tmp_path / 'results.json'
    path.write_text(json.dumps(results))
    return str(path)


def test_pairs_finished_runs_on_common_seeds(tmp_path, capsys):
    path = _write(tmp_path)
    assert pc.main([path, 'mixed16|resnet56|fixed:4',
                    'mixed16|resnet56|fixed:16']) == 0
    out = capsys.readouterr().out
    # seeds 0 and 1 only: +2 and +3 points, mean 2.5, sd 0.707, t(0.975, 1)
    # = 12.706: half-width 12.706 · 0.707 / √2 = 6.35
    assert ('| mixed16 resnet56 fixed:4 | mixed16 resnet56 fixed:16 | '
            '+2.50 ± 6.35 (n=2) | level | 2/2 |') in out


def test_an_unknown_cell_names_the_cells_there(tmp_path):
    path = _write(tmp_path)
    with pytest.raises(SystemExit) as e:
        pc.main([path, 'mixed16|resnet56|fixed:4', 'mixed16|resnet56|x'])
    assert "no cell 'mixed16|resnet56|x'" in str(e.value)
    assert 'mixed16|resnet56|fixed:16' in str(e.value)
