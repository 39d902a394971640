"""Tables 1 and 4 of the paper built from run folders (``run.json``).

Table 1 (§4.1): one row per (dataset, depth); columns FP32 | None |
Fixed (best) | Fixed (worst) | Dynamic (only when dynamic runs exist) |
Adaptive. A cell is the mean ± sample standard deviation over seeds of the
final test accuracy (%); the best of each row is bold (ties at the printed
precision all bold, as the paper does). Fixed (best/worst) pick, among the
fixed scales S, the highest/lowest mean (a scale whose runs all diverged is
the worst). ``—`` marks a missing cell; ``diverged`` a cell whose runs all
diverged; ``(k div.)`` counts diverged seeds left out of a mean.

Table 4 (Appendix A): test accuracy per fixed loss scale S. The precision
table (not in the paper): the same modes in every precision.

Outputs Markdown and CSV (:func:`write_tables`).
"""
import collections
import csv
import io
import math
import os

from ada_loss import atomic
from ada_loss.experiment import runinfo as R
from ada_loss.experiment.models import model_depth
from ada_loss.experiment.modes import (
    MODE_ORDER, canonical_mode, column_label, mode_columns,
    mode_sort_key)
from ada_loss.scaling import LossScalingSpec, parse_mode

DATASET_LABELS = {'cifar10': 'C10', 'cifar100': 'C100', 'digits': 'digits',
                  'fashion_mnist': 'F-MNIST'}


class CellStats(object):
    """The runs of one table cell: finished accuracies (%) and counts."""

    def __init__(self, runs, scale=None):
        self.runs = runs
        self.scale = scale
        self.accs = [100.0 * r['final_test_accuracy'] for r in runs
                     if r.get('status') == R.FINISHED
                     and r.get('final_test_accuracy') is not None]
        self.diverged = sum(r.get('status') == R.DIVERGED for r in runs)
        self.running = sum(r.get('status') in (R.RUNNING, R.INTERRUPTED)
                           for r in runs)

    @property
    def n(self):
        return len(self.accs)

    @property
    def mean(self):
        return sum(self.accs) / self.n if self.accs else None

    @property
    def std(self):
        if self.n < 2:
            return None
        m = self.mean
        return math.sqrt(sum((a - m) ** 2 for a in self.accs) / (self.n - 1))

    def text(self, common_n=None, bold=False):
        if not self.runs:
            return '— (0 runs)'
        notes = []
        if self.n and self.diverged:
            notes.append('{} div.'.format(self.diverged))
        if self.running:
            notes.append('{} running'.format(self.running))
        if self.n and common_n is not None and self.n != common_n:
            notes.append('n={}'.format(self.n))
        if self.scale is not None:
            notes.append('S={:g}'.format(self.scale))
        note = ' ({})'.format(', '.join(notes)) if notes else ''
        if not self.n:
            body = 'diverged' if self.diverged else '—'
            return body + note
        body = '{:.2f}'.format(self.mean)
        if self.std is not None:
            body += ' ± {:.2f}'.format(self.std)
        if bold:
            body = '**{}**'.format(body)
        return body + note


def _precision(run):
    return run.get('precision')


def _mode(run):
    """The run's mode, canonical (``run.json`` of an earlier run may hold
    another spelling of it), or None."""
    text = run.get('mode')
    if text is None and run.get('mode_name'):
        text = str(LossScalingSpec(run['mode_name'],
                                   run.get('mode_options') or {}))
    return canonical_mode(text or '')


def _depth_key(model):
    d = model_depth(model)
    return (0, int(d), '') if d.isdigit() else (1, 0, d)


def _precision_order(p):
    p = p or ''
    return (ROW_ORDER.index(p), p) if p in ROW_ORDER else (len(ROW_ORDER), p)


def _rows(runs):
    """``{(precision, dataset, model): runs}`` in table order: a row holds
    the runs of one precision (issue 39: Table 1 of a folder with two
    precisions averaged them). The ``fp32`` runs (float32, the reference)
    join every row of their dataset and model."""
    keys = {(_precision(r), r['dataset'], r['model']) for r in runs
            if r['mode_name'] != 'fp32'}
    pairs = {k[1:] for k in keys}
    keys |= {(_precision(r), r['dataset'], r['model']) for r in runs
             if r['mode_name'] == 'fp32' and
             (r['dataset'], r['model']) not in pairs}
    rows = collections.OrderedDict()
    for key in sorted(keys, key=lambda k: (_precision_order(k[0]), k[1],
                                           _depth_key(k[2]))):
        rows[key] = [r for r in runs if (r['dataset'], r['model']) == key[1:]
                     and (_precision(r) == key[0] or
                          (r['mode_name'] == 'fp32' and key[1:] in pairs))]
    return rows


def by_mode(runs):
    """``{canonical mode: runs}``."""
    cells = collections.defaultdict(list)
    for r in runs:
        cells[_mode(r)].append(r)
    return cells


def _fixed_extremes(cells):
    fixed = [CellStats(v, scale=parse_mode(m).options['scale'])
             for m, v in cells.items() if m and m.startswith('fixed:')]
    fixed.sort(key=lambda c: c.scale)
    if not fixed:
        return CellStats([]), CellStats([])
    ranked = sorted(fixed, key=lambda c: (c.mean is None, -(c.mean or 0)))
    ok = [c for c in ranked if c.mean is not None]
    best = ok[0] if ok else ranked[0]
    return best, ranked[-1]


Table = collections.namedtuple('Table', ('title', 'header', 'rows', 'cells',
                                         'footer'))


def _common_n(stats):
    ns = collections.Counter(s.n for s in stats if s.n)
    return ns.most_common(1)[0][0] if ns else None


def mode_column_list(runs, always=()):
    """``[(label, mode text or None)]`` of the runs' modes but fixed
    (:func:`~ada_loss.experiment.modes.mode_columns`), with an empty column
    for each label of ``always`` that no mode has."""
    cols = mode_columns({m for m in map(_mode, runs)
                         if m and not m.startswith('fixed:')})
    names = {column_label(m) for _, m in cols}
    cols += [(label, None) for label in always if label not in names]

    def order(col):
        label = column_label(col[1]) if col[1] else col[0]
        return (COLUMN_ORDER.index(label) if label in COLUMN_ORDER
                else len(COLUMN_ORDER), mode_sort_key(col[1]) if col[1]
                else ())
    return sorted(cols, key=order)


def not_in_table(runs, used):
    """The footer's note of the runs no cell holds (listed, not dropped)."""
    left = [r for r in runs if id(r) not in used]
    if not left:
        return ''
    names = ', '.join(r.get('name') or os.path.basename(r.get('folder', ''))
                      for r in left[:6]) + (', …' if len(left) > 6 else '')
    return ' Not in this table: {} run{} ({}).'.format(
        len(left), 's' if len(left) > 1 else '', names)


def table1(runs):
    """Table 1 from a list of ``run.json`` dicts: a row per (precision,
    dataset, depth), a column per mode (FP32, None, Fixed best/worst, then
    Dynamic, Adaptive, ... where there are runs: two modes that share a
    name get a column each, labelled by their text)."""
    cols = mode_column_list(runs, always=('FP32', 'None', 'Adaptive'))
    head = [c for c in cols if c[0] in ('FP32', 'None')]
    rest = [c for c in cols if c[0] not in ('FP32', 'None')]
    columns = [c[0] for c in head] + ['Fixed (best)', 'Fixed (worst)'] + \
        [c[0] for c in rest]
    grid = collections.OrderedDict()
    for key, mine in _rows(runs).items():
        cells = by_mode(mine)
        best, worst = _fixed_extremes(cells)
        row = {label: CellStats(cells.get(mode, []) if mode else [])
               for label, mode in cols}
        row['Fixed (best)'], row['Fixed (worst)'] = best, worst
        grid[key] = row
    return _render('Table 1: final test accuracy (%)', ['Dataset', 'Depth'],
                   columns, grid, runs, bold_skip=('Fixed (worst)',))


def table4(runs):
    """Table 4 (accuracy per fixed loss scale) from ``run.json`` dicts, a
    row per (precision, dataset, model)."""
    fixed = [r for r in runs if r['mode_name'] == 'fixed']
    scales = sorted({r['mode_options']['scale'] for r in fixed})
    columns = ['{:g}'.format(s) for s in scales]
    grid = collections.OrderedDict()
    for key, mine in _rows(fixed).items():
        cells = by_mode(mine)
        grid[key] = {'{:g}'.format(s): CellStats(
            cells.get(str(parse_mode('fixed:{!r}'.format(s))), []))
            for s in scales}
    return _render('Table 4: final test accuracy (%) per fixed loss scale S',
                   ['Dataset', 'Model'], columns, grid, runs, bold_skip=None)


def _render(title, lead, columns, grid, runs, bold_skip):
    stats = [s for row in grid.values() for s in row.values()]
    common_n = _common_n(stats)
    several = len({k[0] for k in grid}) > 1
    rows, cells, used = [], [], set()
    for (precision, dataset, model), row in grid.items():
        best = None
        if bold_skip is not None:
            means = [round(s.mean, 2) for c, s in row.items()
                     if c in columns and c not in bold_skip
                     and s.mean is not None]
            best = max(means) if means else None
        label = DATASET_LABELS.get(dataset, dataset)
        lead_vals = ([str(precision)] if several else []) + [
            label, model_depth(model) if lead[1] == 'Depth' else model]
        texts = []
        for c in columns:
            s = row[c]
            bold = best is not None and s.mean is not None and \
                c not in bold_skip and round(s.mean, 2) == best
            texts.append(s.text(common_n, bold))
            cells.append((precision, dataset, model, c, s))
        for s in row.values():
            used.update(id(r) for r in s.runs)
        rows.append(lead_vals + texts)
    # Table 4 is the fixed runs' (the others are Table 1's); Table 1's
    # Fixed (best)/(worst) are chosen among every fixed scale's runs
    used.update(id(r) for r in runs if (r['mode_name'] != 'fixed') ==
                (lead[1] == 'Model'))
    counts = collections.Counter(r.get('status') for r in runs)
    footer = ('{} runs found ({}); mean ± sample std over seeds{}; '
              '"—" = no run, "(k div.)" = k diverged seeds not averaged.{}'
              .format(len(runs), ', '.join('{} {}'.format(v, k) for k, v in
                                           sorted(counts.items())) or 'none',
                      '' if common_n is None else
                      ', n = {} seeds unless noted'.format(common_n),
                      not_in_table(runs, used)))
    return Table(title, (['Precision'] if several else []) + lead + columns,
                 rows, cells, footer)


def to_markdown(table):
    out = ['**{}**'.format(table.title), '',
           '| ' + ' | '.join(table.header) + ' |',
           '|' + '|'.join(['---'] * len(table.header)) + '|']
    out += ['| ' + ' | '.join(map(str, r)) + ' |' for r in table.rows]
    out += ['', table.footer]
    return '\n'.join(out) + '\n'


def to_csv(table):
    """The table's cells with their statistics, or, for a table without
    cell statistics, its header and rows."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator='\n')
    if not table.cells:
        w.writerow(table.header)
        w.writerows([str(c).replace('**', '') for c in r]
                    for r in table.rows)
        return buf.getvalue()
    w.writerow(['precision', 'dataset', 'model', 'column', 'scale',
                'mean_accuracy', 'std_accuracy', 'n_finished', 'n_diverged',
                'n_running', 'text'])
    for precision, dataset, model, column, s in table.cells:
        w.writerow([precision or '', dataset, model, column,
                    '' if s.scale is None else '{:g}'.format(s.scale),
                    '' if s.mean is None else '{:.4f}'.format(s.mean),
                    '' if s.std is None else '{:.4f}'.format(s.std),
                    s.n, s.diverged, s.running, s.text().replace('**', '')])
    return buf.getvalue()


# -- the precision table (not in the paper) -----------------------------------------
# One row per (precision, dataset, model); columns None | Fixed (best) |
# Fixed (worst) | Dynamic | Adaptive | Adaptive (paper) | Amax, each
# shown only when such runs exist; a cell shows the mean number of skipped
# (overflowing) steps per run where there were any. "Adaptive" is the mode
# with its defaults (the overflow guard on), "Adaptive (paper)"
# ``adaptive:guard=false,bound=product``: Algorithms 3-4 and §3.2.3's bound as
# written (another unguarded option set shows there too).
#: row order: widest to narrowest gradient format
ROW_ORDER = ('float32', 'mixed16', 'bf16', 'fp8_e5m2', 'fp8_e4m3', 'fp8')

#: the modes' columns in table order (their labels: modes.column_label)
COLUMN_ORDER = ('FP32', 'None', 'Dynamic', 'Adaptive', 'Adaptive (paper)',
                'Adaptive (authors)', 'Amax')

COLUMNS = ('None', 'Fixed (best)', 'Fixed (worst)', 'Dynamic', 'Adaptive',
           'Adaptive (paper)', 'Adaptive (authors)', 'Amax')


def skipped_note(stats):
    runs = [r for r in stats.runs if r.get('skipped_steps') is not None]
    if not runs:
        return ''
    mean = sum(r['skipped_steps'] for r in runs) / float(len(runs))
    return ' [{:g} skipped]'.format(round(mean, 1)) if mean else ''


def precision_table(runs):
    """The table from a list of ``run.json`` dicts (``precision`` key): a
    column per mode (two modes sharing a name get one each, labelled by
    their text); fp32 runs (and runs without a precision) are listed in
    the footer."""
    every = runs
    runs = [r for r in runs if r.get('precision') and
            r['mode_name'] != 'fp32']
    cols = mode_column_list(runs)
    has_fixed = any(r['mode_name'] == 'fixed' for r in runs)
    columns = [c[0] for c in cols if column_label(c[1]) == 'None'] + (
        ['Fixed (best)', 'Fixed (worst)'] if has_fixed else []) + \
        [c[0] for c in cols if column_label(c[1]) != 'None']
    rows, cells, used = [], [], set()
    for key, mine in _rows(runs).items():
        modes = by_mode(mine)
        best, worst = _fixed_extremes(modes)
        row = {label: CellStats(modes.get(mode, [])) for label, mode in cols}
        row['Fixed (best)'], row['Fixed (worst)'] = best, worst
        texts = []
        for c in columns:
            s = row[c]
            texts.append(s.text() + (skipped_note(s) if s.n else ''))
            cells.append((key[0], key[1], key[2], c, s))
        for s in row.values():
            used.update(id(r) for r in s.runs)
        rows.append([key[0], DATASET_LABELS.get(key[1], key[1]), key[2]]
                    + texts)
    footer = ('{} runs; final test accuracy (%), mean ± sample std over '
              'seeds; [k skipped] = mean overflowing steps skipped per run '
              '(none where not shown); "diverged" = all seeds diverged.{}'
              .format(len(runs), not_in_table(every, used)))
    return Table('Loss scaling across precisions: final test accuracy (%)',
                 ['Precision', 'Dataset', 'Model'] + columns, rows, cells,
                 footer)


def modes_table(runs):
    """Every mode its own row: one row per (precision, dataset, model,
    canonical mode), final test accuracy (%) mean ± sample std over
    seeds, with the mean number of skipped steps."""
    runs = [r for r in runs if r.get('precision')]
    groups = collections.defaultdict(list)
    for r in runs:
        groups[r['precision'], r['dataset'], r['model'], _mode(r) or
               r['mode']].append(r)
    rows = []
    for key in sorted(groups, key=lambda k: (_precision_order(k[0]), k[1],
                                             k[2], _mode_order(k[3]))):
        s = CellStats(groups[key])
        rows.append([key[0], DATASET_LABELS.get(key[1], key[1]), key[2],
                     key[3], s.text(), s.n, s.diverged,
                     '{:g}'.format(round(sum(
                         r.get('skipped_steps') or 0 for r in s.runs)
                         / float(len(s.runs)), 1))])
    footer = ('{} runs; final test accuracy (%), mean ± sample std over '
              'seeds; n = finished runs; skipped = mean overflowing steps '
              'skipped per run.'.format(len(runs)))
    return Table('Every mode: final test accuracy (%)',
                 ['Precision', 'Dataset', 'Model', 'Mode', 'Accuracy', 'n',
                  'diverged', 'skipped'], rows, [], footer)


def _mode_order(mode):
    try:
        return mode_sort_key(mode)
    except ValueError:
        return (len(MODE_ORDER), 0.0, mode)


def write_table(table, folder, name, quiet=False):
    """Writes ``<name>.md`` and ``<name>.csv`` of a :class:`Table` to
    ``folder`` (atomically) and prints the Markdown unless ``quiet``."""
    os.makedirs(folder, exist_ok=True)
    md = to_markdown(table)
    atomic.write_text(os.path.join(folder, name + '.md'), md)
    atomic.write_text(os.path.join(folder, name + '.csv'), to_csv(table))
    if not quiet:
        print(md)
    return table


def build_table(results_dir, layout='table1'):
    """Reads every run below ``results_dir`` and builds the table."""
    runs = R.find_runs(results_dir)
    return {'table1': table1, 'table4': table4,
            'precision': precision_table}[layout](runs)


def write_tables(results_dir, layout='table1', out_dir=None, quiet=False):
    """Builds the table, writes ``<layout>.md`` and ``<layout>.csv`` to
    ``out_dir`` (default ``results_dir``) and prints the Markdown. The
    precision layout also writes ``modes.md`` / ``modes.csv``
    (:func:`modes_table`).

    Returns:
        Table: the table.
    """
    out_dir = out_dir or results_dir
    table = write_table(build_table(results_dir, layout), out_dir, layout,
                        quiet)
    if layout == 'precision':
        write_table(modes_table(R.find_runs(results_dir)), out_dir, 'modes',
                    quiet=True)
    return table
