"""scripts/depth_authors_rows.py: the paired differences with intervals."""
import math

from repo_modules import load

rows_mod = load('scripts/depth_authors_rows.py')


def _run(seed, acc):
    return {'seed': seed, 'status': 'finished', 'final_test_accuracy': acc}


def test_paired_text_interval():
    mine = {s: _run(s, a) for s, a in ((0, 0.55), (1, 0.56), (2, 0.50))}
    other = {s: _run(s, a) for s, a in ((0, 0.50), (1, 0.40), (2, 0.41))}
    # differences +5, +16, +9: mean 10, std √31 = 5.57, t(2) = 4.303
    half = 4.303 * math.sqrt(31.0) / math.sqrt(3)
    assert rows_mod.paired_text(mine, other) == \
        '+10.00 ± 5.57 [{:+.1f}, {:+.1f}] (3/3 ahead)'.format(
            10 - half, 10 + half)
    assert rows_mod.paired_text(mine, {}) == '—'
    assert rows_mod.paired_text({0: mine[0]}, other) == '+5.00 (1 seed)'


def test_rows_pick_the_authors_runs():
    mode = 'adaptive:style=authors,update_interval=1000'
    new = {('fp8_e4m3', 'resnet56', str(rows_mod.parse_mode(mode))):
           [_run(0, 0.6), _run(1, 0.7)],
           ('fp8_e4m3', 'resnet56', 'adaptive'): [_run(0, 0.5),
                                                  _run(1, 0.5)]}
    text = rows_mod.rows(new, {})
    assert text.count('\n') == 2 and '| resnet56 | fp8_e4m3 |' in text
    assert '+15.00 ± 7.07' in text
