"""scripts/check_docs.py: README.md's demo tables against what the demo
prints (the comparison on small cases, and one tiny run end to end)."""
import os

import pytest

from repo_modules import load

check_docs = load('scripts/check_docs.py')


README = """# x

**The mini table** — `python experiments/mini_repro.py` (the first half):

| Dataset | FP32 | Adaptive |
|---|---|---|
| digits | 97.36 ± 1.37 | **98.19** |

In between.

**FP8** — `python experiments/precision_table.py --config
configs/demo_fp8.yaml` (the second half):

| Precision | None |
|---|---|
| fp8_e4m3 | 20.42 |
"""

PRINTED = """**Table 1: final test accuracy (%)**

|Dataset | FP32 |  Adaptive |
|---|---|---|
| digits | 97.36 ± 1.37 | **98.19** |

6 runs found.
"""


def test_the_table_after_a_command_is_found_across_line_breaks():
    block = check_docs.documented_table(
        README, 'python experiments/precision_table.py --config '
        'configs/demo_fp8.yaml')
    assert block == ['| Precision | None |', '|---|---|',
                     '| fp8_e4m3 | 20.42 |']
    assert check_docs.documented_table(
        README, 'python experiments/mini_repro.py')[2].startswith(
            '| digits | 97.36')
    with pytest.raises(check_docs.DocsError, match='no table follows'):
        check_docs.documented_table(README, 'python experiments/table1.py')


def test_equal_tables_match_whatever_the_spacing():
    documented = check_docs.documented_table(
        README, 'python experiments/mini_repro.py')
    printed = check_docs.printed_table(PRINTED)
    assert check_docs.compare(documented, printed) == []


@pytest.mark.parametrize('old, new', [
    ('**98.19**', '98.19'),                 # bold moved
    ('97.36 ± 1.37', '97.36 ± 1.38'),       # a number
    ('Adaptive', 'Dynamic'),                # a column
])
def test_any_difference_is_reported(old, new):
    documented = check_docs.documented_table(
        README, 'python experiments/mini_repro.py')
    printed = check_docs.printed_table(PRINTED.replace(old, new))
    diff = check_docs.compare(documented, printed, 'mini')
    assert diff and diff[0].startswith('--- README.md: mini')
    assert any(line.startswith('-|') or line.startswith('-| ')
               for line in diff)
    assert any(new.strip('| ') in line for line in diff
               if line.startswith('+'))


def test_a_printed_table_is_needed():
    with pytest.raises(check_docs.DocsError, match='no table'):
        check_docs.printed_table('**title**\n\nno runs\n')


def test_check_reruns_the_demo_and_compares(tmp_path, capsys):
    """A tiny demo (the mini entry, 2 modes, 1 iteration): README.md with
    another table fails (status 1, the diff printed); with the table the
    entry printed it passes (status 0); a README without the table is an
    error (status 2)."""
    tiny = ['--set', 'grid.modes=[fp32, adaptive]',
            '--set', 'grid.fixed_scales=[]', '--set', 'grid.seeds=[0]',
            '--set', 'train.max_iterations=1', '--set', 'data.train_size=64',
            '--set', 'data.test_size=32', '--set', 'log.progress=none',
            '--set', 'log.plot=false', '--jobs', '1']
    readme = tmp_path / 'README.md'
    readme.write_text(README)
    out = str(tmp_path / 'out')
    demo = check_docs.DEMO[:1]
    assert check_docs.check(str(readme), out, tiny, demo=demo) == 1
    text = capsys.readouterr().out
    assert 'README.md differs' in text and '+| digits | 8 |' in text
    with open(os.path.join(out, 'mini', 'table1.md')) as f:
        printed = check_docs.printed_table(f.read())
    readme.write_text(README.replace(
        '\n'.join(check_docs.documented_table(
            README, 'python experiments/mini_repro.py')),
        '\n'.join(printed)))
    assert check_docs.check(str(readme), out, tiny, table_only=True,
                            demo=demo) == 0
    assert 'README.md matches' in capsys.readouterr().out
    readme.write_text('# no tables\n')
    assert check_docs.main(['--readme', str(readme), '--out', out,
                            '--table-only']) == 2
