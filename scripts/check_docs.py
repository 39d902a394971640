#!/usr/bin/env python
"""Reruns the demo's two tables (what ``scripts/demo.sh`` runs) and fails
when README.md or docs/results.md shows other tables than they print, or
when a relative link of either does not resolve.

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
row and cell by cell, with every table that follows the entry's command in
README.md and in :data:`RESULTS` (a table after text that names the
command; README.md must show one for each entry, docs/results.md is
checked wherever it shows one). The project's rule: every figure sits
beside the command that printed it.

Before anything runs, every relative link of the documents (``[text](path)``
and ``[text](path#anchor)``) is checked: the file exists and, for a
Markdown file, the anchor is one of its headings (GitHub's slugs); and
README.md has at most :data:`README_MAX_LINES` lines.

Exit status: 0 when every table matches, 1 when one differs (a diff of
each is printed), a link does not resolve or README.md is too long, 2 when
an entry fails or README.md has no table for it.
"""
import argparse
import difflib
import os
import re
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

#: every result beside the command that printed it (issue 49); README.md
#: shows one headline per question and must show each table of DEMO, this
#: document is checked wherever it shows one
RESULTS = 'docs/results.md'

#: README.md stays a five-minute read (issue 49): at most this many lines
README_MAX_LINES = 300


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


def documented_tables(text, command):
    """The tables (lists of lines) that follow ``command`` in a Markdown
    text: each table whose preceding text names it (whitespace and line
    breaks ignored); empty when there is none."""
    want = _squash(command)
    return [block for before, block in markdown_tables(text)
            if want in _squash(before)]


def documented_table(text, command):
    """The first table that follows ``command`` in a Markdown text. Raises
    DocsError when there is none."""
    tables = documented_tables(text, command)
    if not tables:
        raise DocsError('no table follows `{}` in the document'.format(
            command))
    return tables[0]


def printed_table(markdown):
    """The table lines of an entry's Markdown output (title and footer
    left out)."""
    blocks = markdown_tables(markdown)
    if not blocks:
        raise DocsError('the entry wrote no table')
    return blocks[0][1]


def compare(documented, printed, name='table', document='README.md'):
    """A unified diff (list of lines) between the table documented in
    ``document`` and the printed one, cells compared after stripping; empty
    when they match."""
    def lines(rows):
        return ['| ' + ' | '.join(r) + ' |' for r in rows]
    a, b = lines(table_rows(documented)), lines(table_rows(printed))
    if a == b:
        return []
    return list(difflib.unified_diff(
        a, b, document + ': ' + name, 'printed: ' + name, lineterm='', n=0))


def heading_anchor(heading):
    """GitHub's anchor of a Markdown heading's text: lower case, what is
    neither a word character, a space nor a hyphen dropped, spaces made
    hyphens (``The demo: Table 1's mini`` -> ``the-demo-table-1s-mini``)."""
    text = re.sub(r'[^\w\- ]', '', heading.strip().lower())
    return text.replace(' ', '-')


def anchors(text):
    """The anchors of a Markdown text's headings (code blocks left out;
    repeated headings get GitHub's ``-1``, ``-2``, ... suffixes)."""
    found, seen, fenced = set(), {}, False
    for line in text.splitlines():
        if line.lstrip().startswith('```'):
            fenced = not fenced
            continue
        m = re.match(r'#{1,6} +(.*?) *#* *$', line)
        if m and not fenced:
            anchor = heading_anchor(m.group(1))
            n = seen.get(anchor, 0)
            seen[anchor] = n + 1
            found.add(anchor if n == 0 else '{}-{}'.format(anchor, n))
    return found


#: a Markdown link or image ``[text](target)``, the target without a title
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)')


def too_long(readme, limit=README_MAX_LINES):
    """A one-line complaint when ``readme`` has more than ``limit`` lines,
    else None."""
    with open(readme) as f:
        n = len(f.read().splitlines())
    if n > limit:
        return ('{} has {} lines; at most {}: move results and details to '
                'docs/ and link them'.format(os.path.basename(readme), n,
                                              limit))
    return None


def broken_links(path):
    """``[(target, why)]`` for each relative link of the Markdown file
    ``path`` that does not resolve: a missing file, or an anchor that is
    not a heading of the Markdown file it names. Links with a scheme
    (``https:``, ``mailto:``) are not followed."""
    with open(path) as f:
        text = f.read()
    # code spans and blocks hold examples, not links
    text = re.sub(r'```.*?```', '', text, flags=re.S)
    text = re.sub(r'`[^`\n]*`', '', text)
    broken = []
    for target in LINK.findall(text):
        if re.match(r'[a-zA-Z][a-zA-Z0-9+.-]*:', target):
            continue
        file, _, anchor = target.partition('#')
        full = os.path.normpath(os.path.join(os.path.dirname(path), file)) \
            if file else path
        if not os.path.exists(full):
            broken.append((target, 'no such file'))
        elif anchor and full.endswith('.md'):
            with open(full) as f:
                if anchor not in anchors(f.read()):
                    broken.append((target, 'no heading with this anchor'))
    return broken


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


def _document_name(path):
    """``docs/results.md`` for a document of this checkout, else its file
    name."""
    path = os.path.abspath(path)
    if path.startswith(ROOT + os.sep):
        return os.path.relpath(path, ROOT)
    return os.path.basename(path)


def check(readme, out, extra=(), table_only=False, jobs=None, demo=DEMO,
          log=print, others=()):
    """Runs ``demo`` into ``out`` and compares each table it prints with
    every table that follows its command in ``readme`` (at least one, else
    DocsError) and in the documents ``others`` (wherever they show one);
    returns the number of documented tables that differ."""
    documents = [(readme, True)] + [(path, False) for path in others]
    texts = {}
    for path, _ in documents:
        with open(path) as f:
            texts[path] = f.read()
    differ = 0
    for name, command, argv, config in demo:
        shown = []
        for path, required in documents:
            tables = documented_tables(texts[path], command)
            if required and not tables:
                raise DocsError('no table follows `{}` in {}'.format(
                    command, os.path.basename(path)))
            shown += [(path, table) for table in tables]
        run_entry(argv, out, extra, table_only, jobs)
        with open(table_path(out, config)) as f:
            printed = printed_table(f.read())
        for path, documented in shown:
            document = _document_name(path)
            diff = compare(documented, printed, name, document)
            if diff:
                differ += 1
                log('[check_docs] {}: {} differs from what `{}` '
                    'prints:'.format(name, document, command))
                log('\n'.join(diff))
            else:
                log('[check_docs] {}: {} matches'.format(name, document))
    return differ


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if '--' in argv:
        i = argv.index('--')
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--readme', default=os.path.join(ROOT, 'README.md'))
    p.add_argument('--also', action='append', default=None, metavar='DOC',
                   help='another document whose tables are checked wherever '
                   'they follow a demo command (repeatable; default: '
                   + RESULTS + ')')
    p.add_argument('--out', default=None, help='results folder (default: a '
                   'fresh temporary one, removed at the end)')
    p.add_argument('--table-only', action='store_true', help='train '
                   'nothing: compare the tables of the runs in --out')
    p.add_argument('--jobs', type=int, default=None,
                   help='runs at once (default: the entries\' own, 2)')
    args = p.parse_args(argv)
    if args.table_only and args.out is None:
        p.error('--table-only needs --out (the runs to build tables from)')
    others = args.also if args.also is not None else [
        os.path.join(ROOT, RESULTS)]
    broken = [(path, target, why) for path in [args.readme] + others
              for target, why in broken_links(path)]
    for path, target, why in broken:
        print('[check_docs] {}: link ({}) does not resolve: {}'.format(
            _document_name(path), target, why))
    long = too_long(args.readme)
    if long:
        print('[check_docs] ' + long)
    out = args.out or tempfile.mkdtemp(prefix='check_docs_')
    try:
        differ = check(args.readme, out, extra, args.table_only, args.jobs,
                       others=others)
    except DocsError as e:
        print('error: {}'.format(e), file=sys.stderr)
        return 2
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    if differ:
        print('[check_docs] {} documented table(s) differ: rerun '
              './scripts/demo.sh and paste what it prints'.format(differ))
    if differ or broken or long:
        return 1
    print('[check_docs] the documents show what the demo prints')
    return 0


if __name__ == '__main__':
    sys.exit(main())
