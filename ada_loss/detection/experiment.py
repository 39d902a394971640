"""Tables 3 and 5 of the paper (§4.3, Appendix B): SSD512 on PASCAL VOC per
loss-scaling mode; the library side of ``experiments/table3_ssd.py``.

Table 3 (§4.3): VOC07 test mAP (%) of SSD512 trained on VOC07+12 with batch
8 and 32, columns FP32 | None | Fixed (best) | Dynamic | Adaptive; Table 5
(Appendix B, ``configs/table5_ssd.yaml``): mAP per fixed loss scale at batch
8. The config (:data:`SCHEMA`, :func:`load_config`), the grid
(:func:`cells`, ``--only`` :func:`select`), the tables (:func:`build_table`,
:func:`write_table`) and the command line (:func:`main`); one run is
:func:`ada_loss.detection.train.run_ssd`.
"""
import collections
import os

from ada_loss import atomic
from ada_loss.detection.model import SSD_MODELS
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import tables as T
from ada_loss.experiment.grid import mode_sort_key
from ada_loss.scaling import parse_mode


SCHEMA = {
    'table': C.string('table3_ssd', 'results subfolder: <out>/<table>/'),
    'layout': C.string('table3', 'table3 (modes x batch) or table5 (fixed '
                       'scales)', choices=('table3', 'table5')),
    'description': C.string('', 'free text, copied to every run'),
    'distributed': C.boolean(False, 'ChainerMN data parallelism (--mpi)'),
    'blas_threads': C.integer(1, 'BLAS/OpenMP threads of each run '
                              '(recorded in run.json)', minimum=1),
    'grid': {
        'model': C.string('ssd512', 'SSD model', choices=SSD_MODELS),
        'batch_sizes': C.list_of(C.integer(None, '', minimum=1), [8, 32],
                                 'batch sizes (global)'),
        'modes': C.list_of(C._mode_field(None, ''), ['fp32', 'none', 'dynamic',
                                             'adaptive'],
                           'loss-scaling modes', nonempty=False),
        'fixed_scales': C.list_of(C.number(None, '', positive=True), [],
                                  'fixed loss scales S (modes fixed:S)',
                                  nonempty=False),
        'seeds': C.list_of(C.integer(None, '', minimum=0), [0], 'seeds'),
    },
    'model': {
        'pretrained_model': C.string(
            None, 'local .npz of initial weights (ChainerCV\'s VGG-16 '
            'ImageNet weights for SSD); null: random init', optional=True),
    },
    'data': {
        'voc_root': C.string(None, 'VOCdevkit folder or its parent (null: '
                             '$ADA_LOSS_VOC_ROOT)', optional=True),
        'photometric': C.boolean(True, 'ChainerCV photometric distortion'),
        'train_size': C.integer(None, 'random training subset (mini runs)',
                                minimum=1, optional=True),
        'test_size': C.integer(None, 'random test subset (mini runs)',
                               minimum=1, optional=True),
        'loaderjobs': C.integer(0, 'data loading processes (0: serial)',
                                minimum=0),
    },
    'train': {
        'iterations': C.integer(120000, 'training length', minimum=1),
        'lr': C.number(1e-3, 'initial learning rate', positive=True),
        'lr_steps': C.list_of(C.integer(None, '', minimum=1),
                              [80000, 100000], 'iterations where lr *= '
                              'lr_decay', nonempty=False),
        'lr_decay': C.number(0.1, 'lr multiplier', positive=True),
        'momentum': C.number(0.9, 'MomentumSGD momentum', minimum=0.0),
        'weight_decay': C.number(5e-4, 'weight decay (not on biases)',
                                 minimum=0.0),
        'loc_weight': C.number(1.0, 'alpha of the multibox loss',
                               minimum=0.0),
        'neg_pos_ratio': C.number(3.0, 'hard negatives per positive (k)',
                                  positive=True),
        'eval_batchsize': C.integer(8, 'evaluation batch size', minimum=1),
    },
    'log': {
        'log_interval': C.interval('100 iteration', 'LogReport interval'),
        'eval_interval': C.interval('10000 iteration', 'VOC07 test mAP '
                                    'interval (and at the end)'),
        'snapshot_interval': C.interval('1000 iteration', 'snapshot interval'),
        'loss_scale_interval': C.integer(100, 'adaptive: loss_scales.csv '
                                         'every K iterations', minimum=1),
        'progress': C.boolean(True, 'PrintReport to the console'),
    },
}


def load_config(path, overrides=()):
    return C.validate_schema(SCHEMA, C.apply_overrides(C.read_yaml(path),
                                                       overrides))


def grid_modes(cfg):
    return sorted(C.grid_modes(cfg), key=mode_sort_key)


def cells(cfg):
    from ada_loss.detection.train import SSDCell
    g = cfg['grid']
    return [SSDCell(g['model'], b, m, s) for s in g['seeds']
            for b in g['batch_sizes'] for m in grid_modes(cfg)]


def select(all_cells, only):
    """``--only batch=8|32,mode=adaptive,seed=0`` filters (any matches)."""
    if not only:
        return all_cells
    chosen = []
    for text in only:
        filters = {}
        for token in text.split(','):
            key, eq, value = token.partition('=')
            if not eq or key not in ('batch', 'mode', 'seed'):
                raise SystemExit('bad --only {!r}: use batch=..,mode=..,'
                                 'seed=..'.format(text))
            vals = value.split('|')
            filters[key] = ({str(parse_mode(v)) for v in vals}
                            if key == 'mode' else {int(v) for v in vals})
        for c in all_cells:
            if all(getattr(c, {'batch': 'batchsize'}.get(k, k)) in v
                   for k, v in filters.items()) and c not in chosen:
                chosen.append(c)
    if not chosen:
        raise SystemExit('--only matches no run of the grid')
    return [c for c in all_cells if c in chosen]


# -- tables ------------------------------------------------------------------
class MapStats(T.CellStats):
    """A cell's runs with their final VOC07 mAP (%) as the metric."""

    def __init__(self, runs, scale=None):
        super(MapStats, self).__init__(runs, scale)
        self.accs = [100.0 * r['final_map'] for r in runs
                     if r.get('status') == R.FINISHED
                     and r.get('final_map') is not None]


def _cells_by_mode(runs):
    out = collections.defaultdict(list)
    for r in runs:
        out[r['mode_name'], r['mode_options'].get('scale')].append(r)
    return out


def build_table(runs, layout):
    """Table 3 (rows: batch sizes) or Table 5 (mAP per fixed scale)."""
    batches = sorted({r['batchsize'] for r in runs})
    rows, cells_out = [], []
    if layout == 'table5':
        scales = sorted({r['mode_options']['scale'] for r in runs
                         if r['mode_name'] == 'fixed'})
        columns = ['{:g}'.format(s) for s in scales]
        lead = ['Batch']
    else:
        columns = ['FP32', 'None', 'Fixed (best)', 'Dynamic', 'Adaptive']
        lead = ['Batch']
    for b in batches:
        by_mode = _cells_by_mode([r for r in runs if r['batchsize'] == b])
        if layout == 'table5':
            row = {c: MapStats(by_mode.get(('fixed', s), []))
                   for c, s in zip(columns, scales)}
        else:
            fixed = [MapStats(v, scale=s) for (n, s), v in by_mode.items()
                     if n == 'fixed']
            ok = [f for f in fixed if f.mean is not None]
            best = (max(ok, key=lambda f: f.mean) if ok else
                    fixed[0] if fixed else MapStats([]))
            row = {'FP32': MapStats(by_mode.get(('fp32', None), [])),
                   'None': MapStats(by_mode.get(('none', None), [])),
                   'Fixed (best)': best,
                   'Dynamic': MapStats(by_mode.get(('dynamic', None), [])),
                   'Adaptive': MapStats(by_mode.get(('adaptive', None), []))}
        means = [round(s.mean, 2) for s in row.values() if s.mean is not None]
        top = max(means) if means and layout == 'table3' else None
        rows.append([str(b)] + [row[c].text(bold=top is not None and (
            row[c].mean is not None and round(row[c].mean, 2) == top))
            for c in columns])
        cells_out += [('voc07', 'b{}'.format(b), c, row[c]) for c in columns]
    title = ('Table 3: SSD VOC07 test mAP (%)' if layout == 'table3' else
             'Table 5: SSD VOC07 test mAP (%) per fixed loss scale')
    counts = collections.Counter(r.get('status') for r in runs)
    footer = '{} runs ({}); "diverged" = all runs of the cell diverged.' \
        .format(len(runs), ', '.join('{} {}'.format(v, k) for k, v in
                                     sorted(counts.items())) or 'none')
    return T.Table(title, lead + columns, rows, cells_out, footer)


def write_table(results_dir, layout, quiet=False):
    table = build_table(R.find_runs(results_dir), layout)
    os.makedirs(results_dir, exist_ok=True)
    md = T.to_markdown(table)
    atomic.write_text(os.path.join(results_dir, layout + '.md'), md)
    atomic.write_text(os.path.join(results_dir, layout + '.csv'),
                      T.to_csv(table))
    if not quiet:
        print(md)
    return table


def main(argv=None, default_config='configs/table3_ssd.yaml',
         description=None):
    """The command line of ``experiments/table3_ssd.py`` (flags of
    :func:`ada_loss.experiment.runner.build_table_parser`)."""
    from ada_loss.experiment import runner
    args = runner.build_table_parser(description,
                                     default_config).parse_args(argv)
    cfg = runner.load_or_exit(load_config, args)
    from ada_loss.detection.train import run_ssd, ssd_run_name
    todo = select(cells(cfg), args.only)
    return runner.run_table_cells(
        args, cfg, todo, ssd_run_name, run_ssd,
        lambda results: write_table(results, cfg['layout']))
