"""The precision table (not in the paper): loss scaling across formats.

One row per (precision, dataset, model); columns None | Fixed (best) |
Fixed (worst) | Dynamic | Adaptive | Adaptive (paper bound) | Amax — each
shown only when such runs exist. A cell is the mean ± sample standard
deviation over seeds of the final test accuracy (%), with the mean number of
skipped (overflowing) steps per run where there were any; ``diverged`` as
in Table 1. "Adaptive"
is the mode with the default overflow bound (``bound=output``), "Adaptive
(paper bound)" ``adaptive:bound=product`` (§3.2.3 as written).
"""
import collections

from ada_loss.experiment.tables import CellStats, Table, _fixed_extremes
from ada_loss.experiment.tables import DATASET_LABELS
#: row order: widest to narrowest gradient format
ROW_ORDER = ('float32', 'mixed16', 'bf16', 'fp8_e5m2', 'fp8_e4m3', 'fp8')

COLUMNS = ('None', 'Fixed (best)', 'Fixed (worst)', 'Dynamic', 'Adaptive',
           'Adaptive (paper bound)', 'Amax')


def _column(run):
    name, opts = run['mode_name'], run['mode_options']
    if name == 'adaptive':
        return 'Adaptive (paper bound)' if opts.get('bound') == 'product' \
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
