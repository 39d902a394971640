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
        self.running = sum(r.get('status') == R.RUNNING for r in runs)

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


def _key(run):
    return run['dataset'], run['model']


def _row_order(runs):
    seen = []
    for r in sorted(runs, key=lambda r: (r['dataset'], _depth_key(
            r['model']))):
        if _key(r) not in seen:
            seen.append(_key(r))
    return seen


def _depth_key(model):
    d = model_depth(model)
    return (0, int(d), '') if d.isdigit() else (1, 0, d)


def _by_mode(runs):
    cells = collections.defaultdict(list)
    for r in runs:
        cells[r['mode_name'], r['mode_options'].get('scale')].append(r)
    return cells


def _fixed_extremes(cells):
    fixed = [CellStats(v, scale=s) for (name, s), v in sorted(
        cells.items(), key=lambda kv: kv[0][1] or 0) if name == 'fixed']
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


def table1(runs):
    """Table 1 from a list of ``run.json`` dicts."""
    has_dynamic = any(r['mode_name'] == 'dynamic' for r in runs)
    columns = ['FP32', 'None', 'Fixed (best)', 'Fixed (worst)'] + (
        ['Dynamic'] if has_dynamic else []) + ['Adaptive']
    grid = collections.OrderedDict()
    for key in _row_order(runs):
        cells = _by_mode([r for r in runs if _key(r) == key])
        best, worst = _fixed_extremes(cells)
        row = {'FP32': CellStats(cells.get(('fp32', None), [])),
               'None': CellStats(cells.get(('none', None), [])),
               'Fixed (best)': best, 'Fixed (worst)': worst,
               'Dynamic': CellStats(cells.get(('dynamic', None), [])),
               'Adaptive': CellStats(cells.get(('adaptive', None), []))}
        grid[key] = row
    return _render('Table 1: final test accuracy (%)', ['Dataset', 'Depth'],
                   columns, grid, runs, bold_skip=('Fixed (worst)',))


def table4(runs):
    """Table 4 (accuracy per fixed loss scale) from ``run.json`` dicts."""
    runs = [r for r in runs if r['mode_name'] == 'fixed']
    scales = sorted({r['mode_options']['scale'] for r in runs})
    columns = ['{:g}'.format(s) for s in scales]
    grid = collections.OrderedDict()
    for key in _row_order(runs):
        cells = _by_mode([r for r in runs if _key(r) == key])
        grid[key] = {'{:g}'.format(s): CellStats(cells.get(('fixed', s), []))
                     for s in scales}
    return _render('Table 4: final test accuracy (%) per fixed loss scale S',
                   ['Dataset', 'Model'], columns, grid, runs, bold_skip=None)


def _render(title, lead, columns, grid, runs, bold_skip):
    stats = [s for row in grid.values() for s in row.values()]
    common_n = _common_n(stats)
    rows, cells = [], []
    for (dataset, model), row in grid.items():
        best = None
        if bold_skip is not None:
            means = [round(s.mean, 2) for c, s in row.items()
                     if c in columns and c not in bold_skip
                     and s.mean is not None]
            best = max(means) if means else None
        label = DATASET_LABELS.get(dataset, dataset)
        lead_vals = [label, model_depth(model) if lead[1] == 'Depth'
                     else model]
        texts = []
        for c in columns:
            s = row[c]
            bold = best is not None and s.mean is not None and \
                c not in bold_skip and round(s.mean, 2) == best
            texts.append(s.text(common_n, bold))
            cells.append((dataset, model, c, s))
        rows.append(lead_vals + texts)
    counts = collections.Counter(r.get('status') for r in runs)
    footer = ('{} runs found ({}); mean ± sample std over seeds{}; '
              '"—" = no run, "(k div.)" = k diverged seeds not averaged.'
              .format(len(runs), ', '.join('{} {}'.format(v, k) for k, v in
                                           sorted(counts.items())) or 'none',
                      '' if common_n is None else
                      ', n = {} seeds unless noted'.format(common_n)))
    return Table(title, lead + columns, rows, cells, footer)


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
    w.writerow(['dataset', 'model', 'column', 'scale', 'mean_accuracy',
                'std_accuracy', 'n_finished', 'n_diverged', 'n_running',
                'text'])
    for dataset, model, column, s in table.cells:
        w.writerow([dataset, model, column,
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

COLUMNS = ('None', 'Fixed (best)', 'Fixed (worst)', 'Dynamic', 'Adaptive',
           'Adaptive (paper)', 'Adaptive (authors)', 'Amax')


def _column(run):
    name, opts = run['mode_name'], run['mode_options']
    if name == 'adaptive':
        if opts.get('style') == 'authors':
            return 'Adaptive (authors)'     # docs/authors.md
        return 'Adaptive (paper)' if opts.get('guard') is False \
            else 'Adaptive'
    return {'none': 'None', 'dynamic': 'Dynamic', 'amax': 'Amax'}.get(name)


def _precision_order(p):
    return (ROW_ORDER.index(p), p) if p in ROW_ORDER else (len(ROW_ORDER), p)


def skipped_note(stats):
    runs = [r for r in stats.runs if r.get('skipped_steps') is not None]
    if not runs:
        return ''
    mean = sum(r['skipped_steps'] for r in runs) / float(len(runs))
    return ' [{:g} skipped]'.format(round(mean, 1)) if mean else ''


def precision_table(runs):
    """The table from a list of ``run.json`` dicts (``precision`` key)."""
    runs = [r for r in runs if r.get('precision') and
            r['mode_name'] != 'fp32']
    keys = sorted({(r['precision'], r['dataset'], r['model']) for r in runs},
                  key=lambda k: (_precision_order(k[0]), k[1], k[2]))
    present = {_column(r) for r in runs} | (
        {'Fixed (best)', 'Fixed (worst)'}
        if any(r['mode_name'] == 'fixed' for r in runs) else set())
    columns = [c for c in COLUMNS if c in present]
    rows, cells = [], []
    for key in keys:
        mine = [r for r in runs if (r['precision'], r['dataset'],
                                    r['model']) == key]
        by_col = collections.defaultdict(list)
        fixed = collections.defaultdict(list)
        for r in mine:
            if r['mode_name'] == 'fixed':
                fixed['fixed', r['mode_options']['scale']].append(r)
            elif _column(r):
                by_col[_column(r)].append(r)
        best, worst = _fixed_extremes(fixed)
        row = {c: CellStats(by_col.get(c, [])) for c in columns}
        row['Fixed (best)'], row['Fixed (worst)'] = best, worst
        texts = []
        for c in columns:
            s = row[c]
            texts.append(s.text() + (skipped_note(s) if s.n else ''))
            cells.append((key[1], key[2], '{} {}'.format(key[0], c), s))
        rows.append([key[0], DATASET_LABELS.get(key[1], key[1]), key[2]]
                    + texts)
    footer = ('{} runs; final test accuracy (%), mean ± sample std over '
              'seeds; [k skipped] = mean overflowing steps skipped per run '
              '(none where not shown); "diverged" = all seeds diverged.'
              .format(len(runs)))
    return Table('Loss scaling across precisions: final test accuracy (%)',
                 ['Precision', 'Dataset', 'Model'] + columns, rows, cells,
                 footer)


def modes_table(runs):
    """Every mode string its own row, where the precision table merges
    the variants of a mode into one column: one row per (precision,
    dataset, model, mode), final test accuracy (%) mean ± sample std over
    seeds, with the mean number of skipped steps."""
    runs = [r for r in runs if r.get('precision')]
    groups = collections.defaultdict(list)
    for r in runs:
        groups[r['precision'], r['dataset'], r['model'], r['mode']].append(r)
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
    name, _, options = mode.partition(':')
    order = ('fp32', 'none', 'fixed', 'dynamic', 'adaptive', 'amax')
    scale = float(options) if name == 'fixed' else 0.0
    return (order.index(name) if name in order else len(order), scale, mode)


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
