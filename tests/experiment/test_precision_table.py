"""The precision table entry end to end: a sweep over two precisions runs
every cell into results/<table>/<precision>/ and prints one table whose rows
are the precisions and whose columns are the modes present."""
import json
import os

from functools import partial

from ada_loss.experiment import runner
from ada_loss.experiment.studies.classification import STUDY

main = partial(runner.main, STUDY)


def test_precision_sweep_end_to_end(tiny_config, out_dir, capsys):
    path = tiny_config(
        grid={'modes': ['none', 'adaptive',
                        'adaptive:guard=false,bound=product', 'amax'],
              'fixed_scales': [16, 64], 'precisions': ['mixed16',
                                                      'fp8_e4m3']},
        train={'max_iterations': 2}, layout='precision')
    assert main(['--config', path, '--out', out_dir]) == 0
    out = capsys.readouterr().out
    table = out[out.rindex('**Loss scaling across precisions'):]
    rows = [r for r in table.splitlines() if r.startswith('| ')]
    assert rows[0].split('|')[1:-1] == [
        ' Precision ', ' Dataset ', ' Model ', ' None ', ' Fixed (best) ',
        ' Fixed (worst) ', ' Adaptive ', ' Adaptive (paper) ',
        ' Amax ']
    assert [r.split('|')[1].strip() for r in rows[1:]] == ['mixed16',
                                                           'fp8_e4m3']
    for p in ('mixed16', 'fp8_e4m3'):
        folder = os.path.join(out_dir, 'tiny', p,
                              'small_cnn-digits-adaptive-s0')
        info = json.load(open(os.path.join(folder, 'run.json')))
        assert info['precision'] == p and info['status'] == 'finished'
    assert os.path.exists(os.path.join(out_dir, 'tiny', 'precision.md'))
    # one table only (the per-precision runs do not print their own)
    assert out.count('**Loss scaling across precisions') == 1


def test_bad_precision_list_fails_before_running(tiny_config, out_dir,
                                                 capsys):
    path = tiny_config(grid={'precisions': ['fp9']})
    assert main(['--config', path, '--out', out_dir]) == 2
    assert 'grid.precisions' in capsys.readouterr().err
    assert not os.path.exists(out_dir)
