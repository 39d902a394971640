"""Tables 3 and 5 of the paper (§4.3, Appendix B): SSD512 on PASCAL VOC per
loss-scaling mode.

Table 3 (§4.3): VOC07 test mAP (%) of SSD512 trained on VOC07+12 with batch
8 and 32, columns FP32 | None | Fixed (best) | Dynamic | Adaptive; Table 5
(Appendix B, ``configs/table5_ssd.yaml``): mAP per fixed loss scale at batch
8.

One run (the recipe of :class:`~ada_loss.experiment.recipe.TrainingStudy`,
this study's hooks) is ChainerCV's SSD example (Liu et al. 2016), in mixed16
unless ``train.precision`` says otherwise: VOC07+12 trainval, the SSD
augmentation, MomentumSGD (0.9) at lr 1e-3 x0.1 at 80k and 100k of 120k
iterations, weight decay 5e-4 (biases: 2x lr, no decay), evaluation on VOC2007 test (11-point mAP, difficult objects
ignored). Only the loss-scaling mode (and the batch size: 8 or 32) changes
between runs. A run lives in ``<out>/<table>/<model>-b<batch>-<mode>-s<seed>/``
with the harness's files (``run.json``: ``status``, ``final_map``,
``best_map`` ...). A run whose gradients overflow in a mode that cannot skip
steps, or whose final loss or mAP is not finite, is ``diverged``.
"""
import collections
import dataclasses
import os
from typing import List, Literal, Optional

import chainer

from ada_loss.datasets.errors import DatasetNotFoundError
from ada_loss.datasets.voc import VOC_LABEL_NAMES
from ada_loss.datasets.voc import get_voc_detection_test
from ada_loss.datasets.voc import get_voc_detection_train
from ada_loss.datasets.voc import resolve_voc_root, voc_year_dir
from ada_loss.detection.evaluation import make_voc_evaluator
from ada_loss.detection.model import SSD_MODELS, build_ssd
from ada_loss.detection.ssd_train_chain import MultiboxTrainChain
from ada_loss.detection.ssd_train_chain import setup_ssd_optimizer
from ada_loss.detection.transforms import SSDTrainTransform
from ada_loss.scaling import parse_mode
from ada_loss.experiment import config as C
from ada_loss.experiment import provenance
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import tables as T
from ada_loss.experiment import recipe as RC
from ada_loss.experiment import iterators
from ada_loss.experiment import settings
from ada_loss.experiment import summaries
from ada_loss.experiment.config import section, setting
from ada_loss.experiment.modes import grid_modes, mode_slug, mode_sort_key
from ada_loss.scaling import resolve_precision
from ada_loss.training import extensions as AE
from ada_loss.training.triggers import StopAt


# -- the config ----------------------------------------------------------------------
@dataclasses.dataclass
class Grid:
    model: Literal[SSD_MODELS] = setting('ssd512', 'SSD model')
    batch_sizes: List[int] = setting([8, 32], 'batch sizes (global)',
                                     minimum=1)
    modes: List[C.Mode] = setting(['fp32', 'none', 'dynamic', 'adaptive'],
                                  'loss-scaling modes', nonempty=False)
    fixed_scales: List[C.FixedScale] = setting(
        [], 'fixed loss scales S (modes fixed:S)', nonempty=False)
    seeds: List[int] = setting([0], 'seeds', minimum=0)


@dataclasses.dataclass
class Model:
    pretrained_model: Optional[str] = setting(
        None, "local .npz of initial weights (ChainerCV's VGG-16 ImageNet "
        'weights for SSD); null: random init')


@dataclasses.dataclass
class Data:
    voc_root: Optional[str] = setting(None, 'VOCdevkit folder or its parent '
                                      '(null: $ADA_LOSS_VOC_ROOT)')
    photometric: bool = setting(True, 'ChainerCV photometric distortion')
    train_size: Optional[int] = setting(None, 'random training subset (mini '
                                        'runs)', minimum=1)
    test_size: Optional[int] = setting(None, 'random test subset (mini '
                                       'runs)', minimum=1)
    loaderjobs: int = setting(0, 'data loading processes (0: serial)',
                              minimum=0)
    download: bool = setting(False, 'fetch VOC07+12 first when missing, '
                             "verified against the publishers' checksums "
                             '(python -m ada_loss.datasets.fetch voc); false: '
                             'never download')
    mirror: Optional[str] = setting(None, 'server holding the publishers\' '
                                    'file names to fetch from (null: the '
                                    'publishers\')')


def voc_datasets(data):
    """VOC07+12 trainval and VOC07 test of a Data section, fetched first
    (into ``data.voc_root``, else ``$ADA_LOSS_VOC_ROOT``, else Chainer's
    dataset root) when missing and ``data.download`` is true."""
    try:
        root = resolve_voc_root(data.voc_root)
        return get_voc_detection_train(root), get_voc_detection_test(root)
    except DatasetNotFoundError:
        if not data.download:
            raise
    from ada_loss.datasets.fetch import fetch    # only when asked
    root = fetch('voc', data.voc_root, mirror=data.mirror,
                 log=lambda text: print('[fetch] ' + text, flush=True))
    return get_voc_detection_train(root), get_voc_detection_test(root)


@dataclasses.dataclass
class Train:
    precision: Optional[C.PrecisionName] = settings.precision_setting()
    iterations: int = setting(120000, 'training length', minimum=1)
    lr: float = setting(1e-3, 'initial learning rate', positive=True)
    lr_steps: List[int] = setting([80000, 100000], 'iterations where lr *= '
                                  'lr_decay', minimum=1, nonempty=False)
    lr_decay: float = setting(0.1, 'lr multiplier', positive=True)
    momentum: float = setting(0.9, 'MomentumSGD momentum', minimum=0.0)
    weight_decay: float = setting(5e-4, 'weight decay (not on biases)',
                                  minimum=0.0)
    loc_weight: float = setting(1.0, 'alpha of the multibox loss',
                                minimum=0.0)
    neg_pos_ratio: float = setting(3.0, 'hard negatives per positive (k)',
                                   positive=True)
    eval_batchsize: int = setting(8, 'evaluation batch size', minimum=1)


@dataclasses.dataclass
class SSDLog(settings.Log):
    """The log section with SSD's intervals (iterations)."""
    log_interval: C.Interval = settings.log_setting('log_interval',
                                                    [100, 'iteration'])
    eval_interval: C.Interval = settings.log_setting('eval_interval',
                                                     [10000, 'iteration'])
    snapshot_interval: C.Interval = settings.log_setting('snapshot_interval',
                                                         [1000, 'iteration'])


@dataclasses.dataclass
class Config:
    """The config of Tables 3 and 5."""
    table: str = setting('table3_ssd', 'results subfolder: <out>/<table>/')
    layout: Literal['table3', 'table5'] = setting(
        'table3', 'table3 (modes x batch) or table5 (fixed scales)')
    description: str = setting('', 'free text, copied to every run')
    distributed: bool = setting(False, 'ChainerMN data parallelism (--mpi)')
    blas_threads: int = setting(1, 'BLAS/OpenMP threads of each run '
                                '(recorded in run.json)', minimum=1)
    grid: Grid = section(Grid)
    model: Model = section(Model)
    data: Data = section(Data)
    train: Train = section(Train)
    log: SSDLog = section(SSDLog)

    def modes(self):
        return sorted(grid_modes(self.grid.modes, self.grid.fixed_scales),
                      key=mode_sort_key)

    def check(self):
        """Every mode builds in the precision."""
        settings.check_modes_build(
            [('grid.modes' if m in self.grid.modes else 'grid.fixed_scales',
              m) for m in self.modes()], [self.train.precision])


#: One run: model name, batch size, loss-scaling mode, seed.
SSDCell = collections.namedtuple('SSDCell',
                                 ('model', 'batchsize', 'mode', 'seed'))

PRINT_KEYS = ['iteration', 'main/loss', 'main/loss/loc', 'main/loss/conf',
              'validation/main/map', 'lr', 'loss_scale', 'skipped_steps',
              'elapsed_time']
PLOTS = [('Loss', ['main/loss', 'main/loss/loc', 'main/loss/conf']),
         ('mAP', ['validation/main/map'])]


def ssd_run_name(cell):
    return '{}-b{}-{}-s{}'.format(cell.model, cell.batchsize,
                                  mode_slug(cell.mode), cell.seed)


class IterationStepLR(AE.StepLearningRate):
    """``lr * decay ** k``, k = number of ``steps`` (iterations) reached;
    stateless, so resuming continues with the right value."""

    def value(self, iteration, epoch_detail):
        return self.lr * self.decay ** sum(1 for s in self.steps
                                           if iteration >= s)


class DetectionStudy(RC.TrainingStudy):
    """Tables 3 and 5: SSD on VOC per loss-scaling mode and batch size."""
    Config = Config
    Cell = SSDCell
    only_aliases = {'batch': 'batchsize'}
    print_keys = PRINT_KEYS
    plots = PLOTS

    def cells(self, cfg):
        g = cfg.grid
        return [SSDCell(g.model, b, m, s) for s in g.seeds
                for b in g.batch_sizes for m in cfg.modes()]

    def run_name(self, cfg, cell):
        return ssd_run_name(cell)

    def run_config(self, cfg, cell):
        return self.cell_config(cfg, cell, precision=resolve_precision(
            cell.mode, cfg.train.precision))

    stop_keys = ('train.iterations',)

    def data_record(self, cfg, cell):
        """The resolved VOC root and the split lists read (VOC2007 and
        VOC2012 trainval, VOC2007 test), hashed; the images and
        annotations they name are not (docs/reproducibility.md)."""
        root = os.path.abspath(os.path.expanduser(
            resolve_voc_root(cfg.data.voc_root)))
        return provenance.data_record({'voc_root': root}, [
            os.path.join(voc_year_dir(root, year), 'ImageSets', 'Main',
                         split + '.txt')
            for year, split in (('2007', 'trainval'), ('2012', 'trainval'),
                                ('2007', 'test'))])

    def preload(self, cfg, cells):
        """VOC07+12 trainval and VOC07 test (missing files fail here, before
        any training)."""
        if not cells:
            return None
        return voc_datasets(cfg.data)

    # -- the recipe's hooks (ada_loss.experiment.recipe) ----------------------------
    def run_fields(self, run):
        cell = run.cell
        return [('name', ssd_run_name(cell)), ('table', run.cfg.table),
                ('model', cell.model), ('dataset', 'voc0712'),
                ('batchsize', cell.batchsize)] + \
            RC.mode_fields(run.mode, run.precision) + \
            [('seed', cell.seed), ('precision', str(run.precision))]

    def load_data(self, run, cache):
        return cache or self.preload(run.cfg, [run.cell])

    def model(self, run, data):
        t = run.cfg.train
        model = build_ssd(run.cell.model, len(VOC_LABEL_NAMES),
                          run.precision, run.cfg.model.pretrained_model,
                          initialize=True, seed=run.seed)
        return MultiboxTrainChain(model, alpha=t.loc_weight,
                                  k=t.neg_pos_ratio)

    def datasets(self, run, data, model):
        d = run.cfg.data
        ssd = model.model
        transform = SSDTrainTransform(ssd.coder, ssd.insize, ssd.mean,
                                      photometric=d.photometric)
        train = chainer.datasets.TransformDataset(
            iterators.subset(data[0], d.train_size, run.seed), transform)
        return train, iterators.subset(data[1], d.test_size, run.seed + 1)

    def optimizer(self, run, model):
        t = run.cfg.train
        return setup_ssd_optimizer(model, t.lr, t.momentum, t.weight_decay,
                                   run.precision, run.comm)

    batchsize_key = 'batch size'

    def batchsize(self, run):
        return run.cell.batchsize

    scatter_test = False       # make_voc_evaluator: every rank sees it all

    def iterators(self, run, train, test, batchsize):
        seed = iterators.iterator_seed(run.seed, run.comm)
        return (iterators.make_iterator(
                    train, batchsize, run.cfg.data.loaderjobs, seed=seed),
                iterators.make_iterator(
                    test, run.cfg.train.eval_batchsize, 0, repeat=False,
                    shuffle=False, seed=seed))

    def stop(self, run):
        return StopAt(iterations=run.cfg.train.iterations)

    def evaluator(self, run, model, test, test_iter):
        return make_voc_evaluator(test, model.model,
                                  run.cfg.train.eval_batchsize,
                                  iterator=test_iter, comm=run.comm)

    def lr_schedule(self, run, optimizer):
        t = run.cfg.train
        return IterationStepLR(t.lr, t.lr_steps, t.lr_decay,
                               optimizer=optimizer)

    final_what = 'loss or mAP'
    records_epoch = False

    def final_values(self, run, trainer, updater):
        log = trainer.get_extension('LogReport').log
        return [('train loss', summaries.last(log, 'main/loss')),
                ('mAP', summaries.last(log, 'validation/main/map'))]

    def metrics(self, run, trainer, updater, diverged):
        log = trainer.get_extension('LogReport').log
        maps = [e['validation/main/map'] for e in log
                if summaries.finite(e.get('validation/main/map'))]
        (_, train_loss), (_, final_map) = self.final_values(run, trainer,
                                                            updater)
        return [('final_map', None if diverged else final_map),
                ('best_map', None if diverged or not maps else max(maps)),
                ('last_map', final_map), ('final_train_loss', train_loss)]

    def summary(self, info):
        text = '{:<40s} {:<9s}'.format(info['name'], info['status'])
        if info.get('final_map') is not None:
            text += ' mAP {:6.2f}%'.format(100 * info['final_map'])
        return text

    def write_tables(self, cfg, out, quiet=False, train=True):
        results = os.path.join(out, cfg.table)
        return T.write_table(build_table(R.find_runs(results), cfg.layout),
                             results, cfg.layout, quiet)


# -- tables ------------------------------------------------------------------
class MapStats(T.CellStats):
    """A cell's runs with their final VOC07 mAP (%) as the metric."""

    def __init__(self, runs, scale=None):
        super(MapStats, self).__init__(runs, scale)
        self.accs = [100.0 * r['final_map'] for r in runs
                     if r.get('status') == R.FINISHED
                     and r.get('final_map') is not None]


def build_table(runs, layout):
    """Table 3 (rows: batch sizes, and precisions where the runs have
    several; a column per mode, two modes sharing a name labelled by their
    text, so that no cell averages two) or Table 5 (mAP per fixed
    scale)."""
    keys = sorted({(r.get('precision'), r['batchsize']) for r in runs},
                  key=lambda k: (str(k[0]), k[1]))
    several = len({k[0] for k in keys}) > 1
    rows, cells_out, used = [], [], set()
    scales = sorted({r['mode_options']['scale'] for r in runs
                     if r['mode_name'] == 'fixed'})
    if layout == 'table5':
        cols = [('{:g}'.format(s), 'fixed:{:g}'.format(s)) for s in scales]
        used.update(id(r) for r in runs if r['mode_name'] != 'fixed')
    else:
        cols = T.mode_column_list(runs, always=('FP32', 'None', 'Dynamic',
                                                'Adaptive'))
        n_head = sum(c[0] in ('FP32', 'None') for c in cols)
        cols = cols[:n_head] + [('Fixed (best)', None)] + cols[n_head:]
    columns = [c for c, _ in cols]
    lead = (['Precision'] if several else []) + ['Batch']
    for precision, b in keys:
        by_mode = T.by_mode([r for r in runs if r['batchsize'] == b and
                             r.get('precision') == precision])
        row = {c: MapStats(by_mode.get(mode, []) if mode else [])
               for c, mode in cols}
        if layout != 'table5':
            fixed = [MapStats(v, scale=parse_mode(m).options['scale'])
                     for m, v in sorted(by_mode.items(), key=lambda kv: str(
                         kv[0])) if m and m.startswith('fixed:')]
            ok = [f for f in fixed if f.mean is not None]
            row['Fixed (best)'] = (max(ok, key=lambda f: f.mean) if ok else
                                   fixed[0] if fixed else MapStats([]))
            used.update(id(r) for f in fixed for r in f.runs)
        for c in row.values():
            used.update(id(r) for r in c.runs)
        means = [round(s.mean, 2) for s in row.values() if s.mean is not None]
        top = max(means) if means and layout == 'table3' else None
        rows.append(([str(precision)] if several else []) + [str(b)] + [
            row[c].text(bold=top is not None and (
                row[c].mean is not None and round(row[c].mean, 2) == top))
            for c in columns])
        cells_out += [(precision, 'voc07', 'b{}'.format(b), c, row[c])
                      for c in columns]
    title = ('Table 3: SSD VOC07 test mAP (%)' if layout == 'table3' else
             'Table 5: SSD VOC07 test mAP (%) per fixed loss scale')
    counts = collections.Counter(r.get('status') for r in runs)
    footer = '{} runs ({}); "diverged" = all runs of the cell diverged.{}' \
        .format(len(runs), ', '.join('{} {}'.format(v, k) for k, v in
                                     sorted(counts.items())) or 'none',
                T.not_in_table(runs, used))
    return T.Table(title, lead + columns, rows, cells_out, footer)


#: the one instance the entries run
STUDY = DetectionStudy()
