"""scripts/check_docs.py: README.md's and docs/results.md's demo tables
against what the demo prints (the comparison on small cases, and one tiny
run end to end), README.md's length and every relative link of the docs."""
import os

import pytest

from repo_modules import ROOT, load

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
    # docs/results.md is compared wherever a table follows a demo command:
    # its first mini table matches, the second differs, the table of
    # another command is left alone
    results = tmp_path / 'results.md'
    results.write_text(RESULTS.replace(
        '\n'.join(check_docs.documented_tables(
            RESULTS, 'python experiments/mini_repro.py')[0]),
        '\n'.join(printed), 1))
    assert check_docs.check(str(readme), out, tiny, table_only=True,
                            demo=demo, others=[str(results)]) == 1
    text = capsys.readouterr().out
    assert 'README.md matches' in text and 'results.md matches' in text
    assert ('results.md differs from what `python experiments/'
            'mini_repro.py` prints') in text
    assert '-| digits | 97.36 ± 1.37 | 98.19 |' in text
    # a results page without the demo's tables is not an error; a README
    # without them is (before anything runs)
    results.write_text('# Results\n\nnone here\n')
    assert check_docs.check(str(readme), out, tiny, table_only=True,
                            demo=demo, others=[str(results)]) == 0
    readme.write_text('# no tables\n')
    with pytest.raises(check_docs.DocsError,
                       match='no table follows .* in README.md'):
        check_docs.check(str(readme), out, tiny, table_only=True,
                         demo=demo, others=[str(results)])
    assert check_docs.main(['--readme', str(readme), '--out', out,
                            '--table-only']) == 2


RESULTS = """# Results

**The mini table** — `python experiments/mini_repro.py` (the first half),
with its caveats:

| Dataset | FP32 | Adaptive |
|---|---|---|
| digits | 97.36 ± 1.37 | **98.19** |

**A table of another command** — `python experiments/table1.py`:

| Dataset | FP32 |
|---|---|
| cifar10 | 92.00 |

**The same command again** — `python experiments/mini_repro.py`:

| Dataset | FP32 | Adaptive |
|---|---|---|
| digits | 97.36 ± 1.37 | 98.19 |
"""


def test_every_table_after_a_command_is_found():
    tables = check_docs.documented_tables(
        RESULTS, 'python experiments/mini_repro.py')
    assert [t[2] for t in tables] == [
        '| digits | 97.36 ± 1.37 | **98.19** |',
        '| digits | 97.36 ± 1.37 | 98.19 |']
    assert check_docs.documented_tables(
        RESULTS, 'python experiments/aps_table4.py') == []


def test_the_readme_and_results_show_each_demo_table_once_and_alike():
    """Without running the demo: README.md's headline tables and
    docs/results.md's copies are the same tables (check_docs compares both
    with what the demo prints)."""
    with open(os.path.join(ROOT, 'README.md')) as f:
        readme = f.read()
    with open(os.path.join(ROOT, check_docs.RESULTS)) as f:
        results = f.read()
    for _, command, _, _ in check_docs.DEMO:
        shown = check_docs.documented_tables(readme, command)
        kept = check_docs.documented_tables(results, command)
        assert len(shown) == 1 and len(kept) == 1, command
        assert check_docs.compare(shown[0], kept[0]) == []


def test_the_readme_is_a_five_minute_read():
    readme = os.path.join(ROOT, 'README.md')
    assert check_docs.too_long(readme) is None, check_docs.too_long(readme)


def test_a_long_readme_is_named_in_one_line(tmp_path):
    readme = tmp_path / 'README.md'
    readme.write_text('line\n' * 301)
    message = check_docs.too_long(str(readme))
    assert message == ('README.md has 301 lines; at most 300: move results '
                       'and details to docs/ and link them')
    readme.write_text('line\n' * 300)
    assert check_docs.too_long(str(readme)) is None


@pytest.mark.parametrize('heading, anchor', [
    ("The demo: Table 1's mini reproduction and loss scaling in FP8",
     'the-demo-table-1s-mini-reproduction-and-loss-scaling-in-fp8'),
    ('NVFP4 and block-scaled FP8 (issue 33)',
     'nvfp4-and-block-scaled-fp8-issue-33'),
    ('Results: one per question', 'results-one-per-question'),
    ('σ_max and `init_scale=amax`', 'σ_max-and-init_scaleamax'),
])
def test_heading_anchors_are_githubs(heading, anchor):
    assert check_docs.heading_anchor(heading) == anchor


def test_broken_links_are_found(tmp_path):
    (tmp_path / 'docs').mkdir()
    (tmp_path / 'docs' / 'page.md').write_text(
        '# Page\n\n## A section: two\n\n```\n# not a heading\n```\n'
        '## A section: two\n')
    (tmp_path / 'docs' / 'fig.png').write_bytes(b'png')
    doc = tmp_path / 'README.md'
    doc.write_text(
        '[ok](docs/page.md) [ok](docs/page.md#a-section-two) '
        '[ok](docs/page.md#a-section-two-1) ![ok](docs/fig.png) '
        '[ok](#top) [ok](https://example.org/nowhere.md)\n\n# Top\n\n'
        '`[code](docs/none.md)`\n\n```\n[code](docs/none.md)\n```\n'
        '[missing](docs/none.md) [bad anchor](docs/page.md#not-a-section) '
        '[in code block](docs/page.md#not-a-heading)\n')
    assert check_docs.broken_links(str(doc)) == [
        ('docs/none.md', 'no such file'),
        ('docs/page.md#not-a-section', 'no heading with this anchor'),
        ('docs/page.md#not-a-heading', 'no heading with this anchor')]


def test_every_relative_link_of_the_docs_resolves():
    pages = ['README.md'] + sorted(
        os.path.join('docs', name) for name in os.listdir(
            os.path.join(ROOT, 'docs')) if name.endswith('.md'))
    broken = [(page, target, why) for page in pages
              for target, why in check_docs.broken_links(
                  os.path.join(ROOT, page))]
    assert broken == []
