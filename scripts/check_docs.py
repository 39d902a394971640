#!/usr/bin/env python
"""Reruns the demo's two tables (what ``scripts/demo.sh`` runs) and fails
when README.md shows other tables than they print.

    .venv/bin/python scripts/check_docs.py             # train in a fresh folder
    .venv/bin/python scripts/check_docs.py --out results --table-only
                                      # compare the tables of runs there are
    .venv/bin/python scripts/check_docs.py --jobs 2 -- --set grid.seeds=[0]
                                      # options after -- go to both entries

The demo is :data:`DEMO`: the mini reproduction of Table 1
(``experiments/mini_repro.py``) and the FP8 table
(``experiments/precision_table.py --config configs/demo_fp8.yaml``). Each
is run as the demo runs it (a fresh ``--out`` folder unless given, so no
earlier run is reused), then the Markdown table it wrote
(``<out>/<table>/<layout>.md``, the table it printed) is compared, row by
row and cell by cell, with the table that follows the entry's command in
README.md (the first table after a paragraph that names the command).

Exit status: 0 when every table matches, 1 when one differs (a diff of
each is printed), 2 when an entry fails or README.md has no table for it.
"""
import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: (name, the command as README.md shows it, the entry's arguments, its
#: config): the two halves of scripts/demo.sh
DEMO = (
    ('the mini reproduction of Table 1', 'python experiments/mini_repro.py',
     ['experiments/mini_repro.py'], 'configs/mini.yaml'),
    ('the FP8 table', 'python experiments/precision_table.py --config '
     'configs/demo_fp8.yaml', ['experiments/precision_table.py', '--config',
                               'configs/demo_fp8.yaml'],
     'configs/demo_fp8.yaml'),
)


class DocsError(Exception):
    """README.md has no table for a command, or an entry failed."""


def _squash(text):
    return ' '.join(text.split())


def table_rows(lines):
    """The rows of a Markdown table as lists of stripped cells (the
    separator row ``|---|...`` included, as ``['---', ...]``)."""
    rows = []
    for line in lines:
        cells = line.strip()
        if cells.startswith('|'):
            cells = cells[1:]
        if cells.endswith('|'):
            cells = cells[:-1]
        rows.append([c.strip() for c in cells.split('|')])
    return rows


def markdown_tables(text):
    """``[(preceding text, table lines)]`` of a Markdown text: each block of
    consecutive lines starting with ``|``, and the text between it and the
    previous block (or the start)."""
    out, before, block = [], [], []
    for line in text.splitlines():
        if line.lstrip().startswith('|'):
            block.append(line)
            continue
        if block:
            out.append(('\n'.join(before), block))
            before, block = [], []
        before.append(line)
    if block:
        out.append(('\n'.join(before), block))
    return out


def documented_table(text, command):
    """The table lines that follow ``command`` in a Markdown text: the first
    table whose preceding text names it (whitespace and line breaks
    ignored). Raises DocsError when there is none."""
    want = _squash(command)
    for before, block in markdown_tables(text):
        if want in _squash(before):
            return block
    raise DocsError('no table follows `{}` in the document'.format(command))


def printed_table(markdown):
    """The table lines of an entry's Markdown output (title and footer
    left out)."""
    blocks = markdown_tables(markdown)
    if not blocks:
        raise DocsError('the entry wrote no table')
    return blocks[0][1]


def compare(documented, printed, name='table'):
    """A unified diff (list of lines) between the documented and the printed
    table, cells compared after stripping; empty when they match."""
    def lines(rows):
        return ['| ' + ' | '.join(r) + ' |' for r in rows]
    a, b = lines(table_rows(documented)), lines(table_rows(printed))
    if a == b:
        return []
    return list(difflib.unified_diff(
        a, b, 'README.md: ' + name, 'printed: ' + name, lineterm='', n=0))


def table_path(out, config):
    """Where an entry writes the table of ``config``: ``<out>/<table>/
    <layout>.md``."""
    sys.path.insert(0, ROOT)
    from ada_loss.experiment import config as C
    from ada_loss.experiment.studies.classification import Config
    cfg = C.load(Config, os.path.join(ROOT, config))
    return os.path.join(out, cfg.table, cfg.layout + '.md')


def run_entry(argv, out, extra, table_only=False, jobs=None):
    """Runs one half of the demo into ``out``, as scripts/demo.sh does."""
    cmd = [sys.executable] + [os.path.join(ROOT, argv[0])] + argv[1:] + [
        '--out', out] + (['--table-only'] if table_only else []) + (
        ['--jobs', str(jobs)] if jobs else []) + list(extra)
    print('[check_docs] ' + ' '.join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT)
    if proc.returncode != 0:
        raise DocsError('{} exited with status {}'.format(
            ' '.join(argv), proc.returncode))


def check(readme, out, extra=(), table_only=False, jobs=None, demo=DEMO,
          log=print):
    """Runs ``demo`` into ``out`` and compares each table with README.md's;
    returns the number of tables that differ."""
    with open(readme) as f:
        text = f.read()
    differ = 0
    for name, command, argv, config in demo:
        documented = documented_table(text, command)
        run_entry(argv, out, extra, table_only, jobs)
        with open(table_path(out, config)) as f:
            printed = printed_table(f.read())
        diff = compare(documented, printed, name)
        if diff:
            differ += 1
            log('[check_docs] {}: README.md differs from what `{}` '
                'prints:'.format(name, command))
            log('\n'.join(diff))
        else:
            log('[check_docs] {}: README.md matches'.format(name))
    return differ


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if '--' in argv:
        i = argv.index('--')
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--readme', default=os.path.join(ROOT, 'README.md'))
    p.add_argument('--out', default=None, help='results folder (default: a '
                   'fresh temporary one, removed at the end)')
    p.add_argument('--table-only', action='store_true', help='train '
                   'nothing: compare the tables of the runs in --out')
    p.add_argument('--jobs', type=int, default=None,
                   help='runs at once (default: the entries\' own, 2)')
    args = p.parse_args(argv)
    if args.table_only and args.out is None:
        p.error('--table-only needs --out (the runs to build tables from)')
    out = args.out or tempfile.mkdtemp(prefix='check_docs_')
    try:
        differ = check(args.readme, out, extra, args.table_only, args.jobs)
    except DocsError as e:
        print('error: {}'.format(e), file=sys.stderr)
        return 2
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    if differ:
        print('[check_docs] {} table(s) of README.md differ: rerun '
              './scripts/demo.sh and paste what it prints'.format(differ))
        return 1
    print('[check_docs] README.md shows what the demo prints')
    return 0


if __name__ == '__main__':
    sys.exit(main())
