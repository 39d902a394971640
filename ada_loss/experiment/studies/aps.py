"""The APS measurements (Han et al., *Auto-Precision Scaling for Distributed
Deep Learning*) as studies on the one run path.

* Table 4 analogue (§4.1, :class:`Table4Study`, ``experiments/aps_table4.py``):
  test accuracy with FP32 vs (5, 2), (4, 3), (3, 0) gradient communication,
  with and without APS, N simulated workers (ring all-reduce), a large global
  batch; mean ± std over seeds, diverged runs counted. A cell (format, APS,
  seed) trains on Chainer's Trainer with the N-worker simulator
  (:class:`~ada_loss.communication.simulator.SimulatedDataParallelUpdater`),
  resumable like every run.
* Table 9 analogue (§4.2, :class:`Table9Study`, ``experiments/aps_table9.py``):
  Eq. 5's average relative round-off error of one layer's gradient reduced
  over N = 256 workers, ring vs hierarchical groups of k, with and without
  Kahan (§5.1.1); a cell is a seed (model init and batch).
* Communication cost (:class:`CostStudy`, ``experiments/aps_cost.py``): bytes
  per worker and all-reduce steps from a model's parameter shapes (§3.3.3,
  §4.2); one cell.

Worker counts, group sizes and batch sizes are checked against each other
when the config loads.
"""
import collections
import contextlib
import dataclasses
import io
import math
import os
from typing import List, Literal, Optional

import chainer
import numpy

from ada_loss.communication.allreduce import allreduce_low_precision
from ada_loss.communication.cost import cost_rows
from ada_loss.communication.policy import CommPolicy
from ada_loss.communication.roundoff import (
    average_round_off_error, exact_mean)
from ada_loss.communication.simulator import SimulatedDataParallelUpdater
from ada_loss.communication.summation import ORDERS
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import tables as T
from ada_loss.experiment import recipe as RC
from ada_loss.experiment import run_folder
from ada_loss.experiment import settings
from ada_loss.experiment.config import section, setting
from ada_loss.experiment.data import (data_record, dataset_info,
                                      load_datasets)
from ada_loss.experiment.models import build
from ada_loss.experiment.runner import Study
from ada_loss.formats import get_format
from ada_loss.errors import NonFiniteGradientError
from ada_loss.training import Classifier, dtype_config
from ada_loss.training import extensions as AE
from ada_loss.training.triggers import StopAt


# -- config sections -------------------------------------------------------------
@dataclasses.dataclass
class Sim:
    workers: int = setting(8, 'N, the number of simulated data-parallel '
                           'workers', minimum=1)
    order: Literal[ORDERS] = setting('ring', 'all-reduce order: ring (§4.1) '
                                     'or hierarchical (§4.2, needs '
                                     'group_size)')
    group_size: Optional[int] = setting(None, 'k of the hierarchical '
                                        'all-reduce (workers % k == 0)',
                                        minimum=1)
    kahan: bool = setting(False, 'Kahan summation in the low precision '
                                 '(§5.1.1)')
    fp32_layers: List[str] = setting([], 'parameters kept in FP32 (fnmatch '
                                     'patterns, e.g. "*/fc/*": Table 7)',
                                     nonempty=False)
    fp32_epochs: float = setting(0, 'hybrid schedule: FP32 communication '
                                 'for the first E epochs (Table 6)',
                                 minimum=0.0)

    def policy(self, fmt, aps):
        return CommPolicy(fmt, aps, self.order, self.group_size, self.kahan,
                          self.fp32_layers, self.fp32_epochs)


@dataclasses.dataclass
class Data:
    dataset: Literal['digits', 'fashion_mnist', 'cifar10'] = setting(
        'digits', 'digits (sklearn, 16x16) or fashion_mnist (if its files '
        'exist); cifar10 when given')
    digits_size: int = setting(16, 'side of the upsampled digits', minimum=8)
    fashion_mnist_root: str = setting('/usr/share/datasets/fashion-mnist',
                                      'folder of the Fashion-MNIST IDX files')
    cifar_root: Optional[str] = setting(None, 'CIFAR files (null: '
                                        '$ADA_LOSS_CIFAR_ROOT)')
    train_size: Optional[int] = setting(None, 'random training subset',
                                        minimum=1)
    test_size: Optional[int] = setting(None, 'random test subset', minimum=1)
    split_seed: int = setting(0, 'seed of the digits split and subsets',
                              minimum=0)
    augment: bool = setting(False, 'CIFAR only: pad-4 random crop and flip')
    download: bool = setting(False, 'fetch missing data first, verified '
                             "against the publishers' checksums (python -m "
                             'ada_loss.datasets.fetch); false: never download')
    mirror: Optional[str] = setting(None, 'server holding the publishers\' '
                                    'file names to fetch from (null: the '
                                    'publishers\')')


@dataclasses.dataclass
class Model:
    name: C.ModelName = setting('small_cnn', 'model (resnet8/20/..., '
                                'small_cnn, plain_cnn, ...)')
    width: Optional[int] = setting(None, 'width (null: the model default)',
                                   minimum=1)


@dataclasses.dataclass
class ResNet20(Model):
    name: C.ModelName = setting('resnet20', 'model')


def load_data(data):
    """``(train, test, (num_classes, in_channels))`` of a Data section."""
    train, test = load_datasets(data.dataset, data)
    return train, test, dataset_info(data.dataset)


def make_model(model_cfg, info, precision, seed):
    numpy.random.seed(seed)
    with dtype_config(precision):
        return Classifier(build(model_cfg.name, info[0], info[1],
                                model_cfg.width), precision, seed)


def _policy_error(key, fn):
    try:
        return fn()
    except ValueError as e:
        raise C.ConfigError(key, str(e))


def mean_std(values):
    """``'m ± s'`` (%) of fractions, ``'—'`` when empty."""
    if not values:
        return '—'
    m = numpy.mean(values) * 100
    if len(values) == 1:
        return '{:.2f}'.format(m)
    return '{:.2f} ± {:.2f}'.format(m, numpy.std(values, ddof=1) * 100)


def compute_run(folder, fields, config_text, compute):
    """A run that computes rather than trains: ``compute()`` -> dict of
    results, stored in ``run.json`` with status finished."""
    info, _ = run_folder.open_run(folder, fields, '', config_text)
    info.update(compute())
    info.update(status=R.FINISHED, updated=run_folder.now())
    R.write_run(folder, info)
    return info


# -- Table 4 ----------------------------------------------------------------------
@dataclasses.dataclass
class Table4Grid:
    formats: List[C.FormatName] = setting(
        ['float32', 'e5m2', 'e4m3', 'e3m0'], 'gradient formats; float32 = '
        'the baseline')
    aps: List[bool] = setting([True, False], 'with / without APS (ignored '
                              'for float32)')
    seeds: List[int] = setting([0, 1], 'seeds (model init and data order)',
                               minimum=0)


@dataclasses.dataclass
class Table4Train:
    mode: C.Mode = setting('fp32', 'loss-scaling mode (gradients arrive '
                           'scaled; fp32 = no scaling)')
    precision: Optional[C.PrecisionName] = settings.precision_setting()
    batchsize: int = setting(256, 'global batch (workers x per-worker)',
                             minimum=1)
    epochs: float = setting(12, 'epochs', positive=True)
    lr: float = setting(0.2, 'learning rate', positive=True)
    warmup_epochs: float = setting(1, 'linear lr warm-up from lr/10 (large '
                                   'batch, Goyal et al.)', minimum=0.0)
    lr_steps: List[float] = setting([8, 11], 'epochs where lr *= lr_decay',
                                    positive=True, nonempty=False)
    lr_decay: float = setting(0.1, 'lr multiplier', positive=True)
    momentum: float = setting(0.9, 'MomentumSGD momentum', minimum=0.0)
    weight_decay: float = setting(1e-4, 'weight decay', minimum=0.0)
    eval_batchsize: int = setting(512, 'evaluation batch', minimum=1)


#: console columns and PlotReports of a Table 4 run (``log.progress``,
#: ``log.plot``); ``shard_loss``: the mean loss of the workers' shards
TABLE4_PRINT_KEYS = ['epoch', 'iteration', 'shard_loss',
                     'validation/main/accuracy', 'lr', 'loss_scale',
                     'skipped_steps', 'elapsed_time']
TABLE4_PLOTS = [('Loss', ['shard_loss']),
                ('Accuracy', ['validation/main/accuracy'])]


@dataclasses.dataclass
class Table4Log(settings.Log):
    """Table 4 runs many cells at once: quiet, no PNGs, one test at the
    end."""
    eval_interval: C.Interval = settings.log_setting('eval_interval',
                                                     [1000000, 'epoch'])
    progress: Literal['report', 'bar', 'both', 'none'] = settings.log_setting(
        'progress', 'none')
    plot: bool = settings.log_setting('plot', False)


@dataclasses.dataclass
class Table4Config:
    """The APS Table 4 analogue."""
    table: str = setting('aps_table4', 'results subfolder: <out>/<table>/')
    description: str = setting('', 'free text')
    blas_threads: int = setting(1, 'BLAS/OpenMP threads of each run',
                                minimum=1)
    grid: Table4Grid = section(Table4Grid)
    sim: Sim = section(Sim)
    model: Model = section(Model)
    data: Data = section(Data)
    train: Table4Train = section(Table4Train)
    log: Table4Log = section(Table4Log)

    def check(self):
        _policy_error('sim.group_size', lambda: self.sim.policy(
            'e5m2', True).check(self.sim.workers))
        if self.train.batchsize % self.sim.workers:
            raise C.ConfigError(
                'train.batchsize', 'global batch {} cannot be split into {} '
                'equal shards (sim.workers); use a multiple of it'.format(
                    self.train.batchsize, self.sim.workers))
        settings.check_modes_build([('train.mode', self.train.mode)],
                                   [self.train.precision])
        for key in ('probe_every', 'record_every'):
            if getattr(self.log, key) is not None:
                raise C.ConfigError(
                    'log.' + key, 'not available with simulated workers (a '
                    'step runs one backward pass per worker); expected null')

    def precision(self):
        """The :class:`~ada_loss.precision.Precision` of the runs."""
        return RC.run_precision(self.train.mode, self.train.precision)


class WarmupFromTenthLR(AE.StepLearningRate):
    """``lr * decay ** k`` (k: steps reached), ramped linearly from lr/10
    over the first ``warmup`` epochs (large batch, Goyal et al. 2017)."""

    def __init__(self, lr, steps, decay, warmup_epochs, optimizer=None):
        super(WarmupFromTenthLR, self).__init__(lr, steps, decay,
                                                optimizer=optimizer)
        self.warmup_epochs = warmup_epochs

    def value(self, iteration, epoch_detail):
        lr = self.lr * self.decay ** sum(1 for s in self.steps
                                         if epoch_detail >= s)
        w = self.warmup_epochs
        if w > 0 and epoch_detail < w:
            lr *= 0.1 + 0.9 * epoch_detail / w
        return lr


class StopWhenNonFinite(chainer.training.Extension):
    """Ends a run whose loss or weights became non-finite (a reduction that
    overflowed): training on cannot recover."""
    trigger = 1, 'iteration'

    def __call__(self, trainer):
        up = trainer.updater
        model = up.get_optimizer('main').target
        if not math.isfinite(up.last_loss) or not all(
                bool(numpy.isfinite(p.array).all()) for p in model.params()):
            raise NonFiniteGradientError(
                'non-finite loss or weights at iteration {}'.format(
                    up.iteration))


APSCell = collections.namedtuple('APSCell', ('format', 'aps', 'seed'))


class Table4Study(RC.TrainingStudy):
    """Accuracy with low-precision gradient communication, ± APS."""
    Config = Table4Config
    Cell = APSCell
    #: ``--only format=E4M3`` is the grid's e4m3 (fp8_e4m3, OCP's E4M3
    #: with 448 as its largest value, is another format)
    only_types = {'format': C.FormatName}
    print_keys = TABLE4_PRINT_KEYS
    plots = TABLE4_PLOTS
    history = ['validation/main/accuracy']

    def cells(self, cfg):
        return [APSCell(fmt, aps, seed) for fmt in cfg.grid.formats
                for aps in ([True] if get_format(fmt).is_float32
                            else cfg.grid.aps)
                for seed in cfg.grid.seeds]

    def run_name(self, cfg, cell):
        return '{}-{}-s{}'.format(cell.format,
                                  'aps' if cell.aps else 'noaps', cell.seed)

    def run_config(self, cfg, cell):
        return self.cell_config(cfg, cell)

    stop_keys = ('train.epochs',)

    def data_record(self, cfg, cell):
        """The resolved data root and the files' sizes and hashes
        (:func:`~ada_loss.experiment.data.data_record`)."""
        return data_record(cfg.data.dataset, cfg.data)

    def preload(self, cfg, cells):
        return load_data(cfg.data) if cells else None

    # -- the recipe's hooks (ada_loss.experiment.recipe): a run trains with
    # the N-worker simulator
    def setup(self, cfg, cell, comm=None):
        return RC.Run(cfg=cfg, cell=cell, config=cfg, mode=cfg.train.mode,
                      precision=cfg.precision(), seed=cell.seed, log=cfg.log,
                      policy=cfg.sim.policy(cell.format, cell.aps))

    def run_fields(self, run):
        cell = run.cell
        return [('name', self.run_name(run.cfg, cell)),
                ('table', run.cfg.table),
                ('format', get_format(cell.format).name), ('aps', cell.aps),
                ('seed', cell.seed), ('workers', run.cfg.sim.workers),
                ('policy', run.policy.describe()), ('mode', str(run.mode)),
                ('mode_name', run.mode.name),
                ('precision', str(run.precision))]

    def seed(self, run):
        pass        # make_model seeds NumPy's stream (Python's is not used)

    def load_data(self, run, cache):
        return cache or load_data(run.cfg.data)

    def model(self, run, data):
        return make_model(run.cfg.model, data[2], run.precision, run.seed)

    def datasets(self, run, data, model):
        return data[0], data[1]

    def iterators(self, run, train, test, batchsize):
        numpy.random.seed(run.seed)     # the data order
        return super(Table4Study, self).iterators(run, train, test,
                                                  batchsize)

    def updater(self, run, train_iter, optimizer, scaling):
        with contextlib.redirect_stdout(io.StringIO()):  # layer list
            return SimulatedDataParallelUpdater(
                train_iter, optimizer, scaling, run.cfg.sim.workers,
                run.policy, mode=str(run.mode))

    def stop(self, run):
        return StopAt(epochs=run.cfg.train.epochs)

    def lr_schedule(self, run, optimizer):
        t = run.cfg.train
        return WarmupFromTenthLR(t.lr, t.lr_steps, t.lr_decay,
                                 t.warmup_epochs, optimizer=optimizer)

    def extend(self, run, trainer):
        trainer.extend(StopWhenNonFinite())

    def final_values(self, run, trainer, updater):
        return [(None, getattr(updater, 'last_loss', None))]

    def metrics(self, run, trainer, updater, diverged):
        tests = trainer.get_extension('TestHistory')
        return [('final_test_accuracy', None if diverged else
                 tests.last('validation/main/accuracy')),
                ('final_train_loss', getattr(updater, 'last_loss', None))]

    def write_tables(self, cfg, out, quiet=False, train=True):
        folder = os.path.join(out, cfg.table)
        runs = R.find_runs(folder)
        return T.write_table(table4(cfg, runs), folder, 'table', quiet)


def table4(cfg, runs):
    """The Table 4 analogue from the runs' ``run.json`` dicts."""
    sim = cfg.sim
    title = ('APS Table 4 analogue: test accuracy (%), {} simulated workers '
             '({}), global batch {}, {}, {}, loss scaling {}'.format(
                 sim.workers, sim.policy('float32', True).describe().split(
                     ', ', 2)[-1], cfg.train.batchsize, cfg.model.name,
                 cfg.data.dataset, cfg.train.mode))
    rows = []
    for fmt in cfg.grid.formats:
        f = get_format(fmt)
        for aps in ([True] if f.is_float32 else cfg.grid.aps):
            rs = [r for r in runs if r.get('format') == f.name
                  and r.get('aps') == aps
                  and r.get('status') in (R.FINISHED, R.DIVERGED)]
            accs = [r['final_test_accuracy'] for r in rs
                    if r['status'] == R.FINISHED]
            div = sum(1 for r in rs if r['status'] == R.DIVERGED)
            label = '({}, {}): {} bits'.format(f.exp_bits, f.man_bits,
                                               1 + f.exp_bits + f.man_bits)
            rows.append([label, '/' if f.is_float32 else
                         ('yes' if aps else 'no'), mean_std(accs),
                         '{}/{}'.format(div, len(rs))])
    footer = ('mean ± sample std over seeds {} of the runs that did not '
              'diverge; "diverged" = runs with non-finite loss or weights / '
              'runs.'.format(cfg.grid.seeds))
    return T.Table(title, ['Precision (exp, man)', 'APS', 'accuracy',
                           'diverged'], rows, [], footer)


# -- Table 9 ----------------------------------------------------------------------
@dataclasses.dataclass
class Table9Config:
    """The APS Table 9 analogue."""
    table: str = setting('aps_table9', 'results subfolder')
    description: str = setting('', 'free text')
    formats: List[C.FormatName] = setting(['e5m2'], 'formats (the paper: '
                                          '(5, 2))')
    aps: bool = setting(True, 'APS shift before the cast')
    workers: int = setting(256, 'N', minimum=1)
    group_sizes: List[int] = setting([4, 8, 16, 32, 64], 'hierarchical '
                                     'group sizes (the ring is always '
                                     'included)', minimum=1)
    kahan: List[bool] = setting([False, True], 'without / with Kahan '
                                'summation')
    seeds: List[int] = setting([0, 1, 2], 'seeds (model init and batch)',
                               minimum=0)
    layer: Optional[str] = setting(None, 'parameter whose gradient is '
                                   'reduced (null: the first GEMM weight, '
                                   'e.g. /predictor/conv1/W)')
    per_worker_batch: int = setting(4, 'examples per worker', minimum=1)
    model: ResNet20 = section(ResNet20)
    data: Data = section(Data)

    def check(self):
        for i, k in enumerate(self.group_sizes):
            _policy_error('group_sizes[{}]'.format(i), lambda: CommPolicy(
                'e5m2', order='hierarchical', group_size=k).check(
                    self.workers))

    def columns(self):
        return [('hierarchical', k) for k in self.group_sizes] + \
            [('ring', None)]


def worker_gradients(cfg, seed, data):
    """The chosen layer's FP32 gradient on each of N workers (shard r of a
    random global batch of N × per_worker_batch examples)."""
    train, _, info = data
    n, b = cfg.workers, cfg.per_worker_batch
    if n * b > len(train):
        raise ValueError('workers x per_worker_batch = {} exceeds the {} '
                         'training examples'.format(n * b, len(train)))
    model = make_model(cfg.model, info, 'float32', seed)
    names = [name for name, p in model.namedparams()]
    layer = cfg.layer
    if layer is None:
        layer = next(name for name, p in sorted(model.namedparams())
                     if p.array.ndim >= 2 and 'conv1/W' in name)
    if layer not in names:
        raise ValueError('no parameter {!r}; the model has: {}'.format(
            layer, ', '.join(sorted(names))))
    param = dict(model.namedparams())[layer]
    order = numpy.random.RandomState(seed).permutation(len(train))[:n * b]
    grads = []
    for r in range(n):
        x, t = chainer.dataset.concat_examples(
            [train[int(i)] for i in order[r * b:(r + 1) * b]])
        model.cleargrads()
        model(x, t).backward()
        grads.append(param.grad.astype(numpy.float32).copy())
    return layer, grads


SeedCell = collections.namedtuple('SeedCell', ('seed',))


class Table9Study(Study):
    """Round-off error of a low-precision all-reduce; a cell is a seed."""
    Config = Table9Config
    Cell = SeedCell

    def cells(self, cfg):
        return [SeedCell(s) for s in cfg.seeds]

    def run_name(self, cfg, cell):
        return 's{}'.format(cell.seed)

    def preload(self, cfg, cells):
        data = load_data(cfg.data) if cells else None
        if data is not None and cfg.workers * cfg.per_worker_batch > \
                len(data[0]):
            raise ValueError('workers x per_worker_batch = {} exceeds the {} '
                             'training examples'.format(
                                 cfg.workers * cfg.per_worker_batch,
                                 len(data[0])))
        return data

    def run(self, cfg, cell, out, resume=False, comm=None, cache=None):
        def compute():
            layer, grads = worker_gradients(cfg, cell.seed, cache or
                                            load_data(cfg.data))
            exact = exact_mean(grads)
            errors = [{'format': get_format(fmt).name, 'kahan': kahan,
                       'group_size': k,
                       'error': average_round_off_error(
                           exact, allreduce_low_precision(
                               grads, fmt, cfg.aps, order, k, kahan))}
                      for fmt in cfg.formats for kahan in cfg.kahan
                      for order, k in cfg.columns()]
            return {'layer': layer, 'shape': list(grads[0].shape),
                    'errors': errors}
        return compute_run(self.folder(out, cfg, cell), [
            ('name', self.run_name(cfg, cell)), ('table', cfg.table),
            ('seed', cell.seed), ('data', self.data_record(cfg, cell))],
            C.dump(self.run_config(cfg, cell)), compute)

    def data_record(self, cfg, cell):
        """The resolved data root and the files' sizes and hashes
        (:func:`~ada_loss.experiment.data.data_record`)."""
        return data_record(cfg.data.dataset, cfg.data)

    def summary(self, info):
        return '{:<10s} {} ({} errors)'.format(info['name'], info['status'],
                                               len(info.get('errors', [])))

    def write_tables(self, cfg, out, quiet=False, train=True):
        folder = os.path.join(out, cfg.table)
        runs = [r for r in R.find_runs(folder) if r['status'] == R.FINISHED
                and r['seed'] in cfg.seeds]
        if not runs:
            return None
        return T.write_table(table9(cfg, runs), folder, 'table', quiet)


def table9(cfg, runs):
    errors = collections.defaultdict(list)
    for r in sorted(runs, key=lambda r: r['seed']):
        for e in r['errors']:
            errors[e['format'], e['kahan'], e['group_size']].append(
                e['error'])
    columns = cfg.columns()
    head = ['{}'.format(k) for _, k in columns[:-1]] + \
        ['{} (ring)'.format(cfg.workers)]
    title = ('APS Table 9 analogue: average round-off error (Eq. 5, %) of {} '
             '({} gradient, shape {}) over {} workers, {} APS, {} examples '
             'per worker'.format(
                 runs[0]['layer'], cfg.model.name, tuple(runs[0]['shape']),
                 cfg.workers, 'with' if cfg.aps else 'without',
                 cfg.per_worker_batch))
    rows = [['({}, {})'.format(f.exp_bits, f.man_bits),
             'Kahan' if kahan else 'naive'] +
            [mean_std(errors[(f.name, kahan, k)]) for _, k in columns]
            for f in map(get_format, cfg.formats) for kahan in cfg.kahan]
    footer = ('mean ± sample std over seeds {} (model init and batch); '
              'elements with an exact zero mean left out of Eq. 5.'.format(
                  sorted(r['seed'] for r in runs)))
    return T.Table(title, ['format', 'summation', 'group size: ' + head[0]]
                   + head[1:], rows, [], footer)


# -- communication cost --------------------------------------------------------------
@dataclasses.dataclass
class CostConfig:
    """Bytes and steps of gradient communication for a model."""
    table: str = setting('aps_cost', 'results subfolder')
    model: ResNet20 = section(ResNet20)
    num_classes: int = setting(10, 'classes of the model', minimum=2)
    in_channels: int = setting(3, 'input channels', minimum=1)
    formats: List[C.FormatName] = setting(
        ['float32', 'float16', 'e5m2', 'e4m3', 'e3m0'], 'formats')
    workers: List[int] = setting([8, 256], 'worker counts p', minimum=2)
    group_sizes: List[int] = setting([16], 'hierarchical group sizes k',
                                     minimum=2)
    fp32_layers: List[str] = setting([], 'parameters kept in FP32 (fnmatch '
                                     'patterns)', nonempty=False)


ModelCell = collections.namedtuple('ModelCell', ('model',))


class CostStudy(Study):
    """Communication cost per step from a model's parameter shapes."""
    Config = CostConfig
    Cell = ModelCell

    def cells(self, cfg):
        return [ModelCell(cfg.model.name)]

    def run_name(self, cfg, cell):
        return cell.model

    def run(self, cfg, cell, out, resume=False, comm=None, cache=None):
        def compute():
            model = build(cfg.model.name, cfg.num_classes, cfg.in_channels,
                          cfg.model.width)
            named = sorted(model.namedparams())
            sizes = [p.array.size for _, p in named]
            pol = CommPolicy('float32', fp32_layers=cfg.fp32_layers)
            mask = [pol.is_fp32_layer(n) for n, _ in named]
            return {'sizes': sizes, 'rows': cost_rows(
                sizes, cfg.formats, cfg.workers, cfg.group_sizes, mask)}
        return compute_run(self.folder(out, cfg, cell), [
            ('name', cell.model), ('table', cfg.table)],
            C.dump(self.run_config(cfg, cell)), compute)

    def summary(self, info):
        return '{:<10s} {}'.format(info['name'], info['status'])

    def write_tables(self, cfg, out, quiet=False, train=True):
        folder = os.path.join(out, cfg.table)
        info = R.read_run(os.path.join(folder, cfg.model.name))
        if not info or info.get('status') != R.FINISHED:
            return None
        return T.write_table(cost_table(cfg, info), folder, 'table', quiet)


def cost_table(cfg, info):
    rows, sizes, ks = info['rows'], info['sizes'], cfg.group_sizes
    base = {r['p']: r['message_bytes'] for r in rows
            if r['format'] == 'float32'}
    header = (['format', 'bits', 'APS', 'p', 'exponents [B]', 'payload [B]',
               'message [KiB]', 'vs FP32', 'ring: sent per worker [KiB]',
               'ring steps 2(p−1)'] +
              ['hier. k={} steps 4(k−1)+2(p/k−1)'.format(k) for k in ks])
    body = [[r['format'], r['bits'], 'yes' if r['aps'] else 'no', r['p'],
             r['exponent_bytes'], '{:.0f}'.format(r['payload_bytes']),
             '{:.1f}'.format(r['message_bytes'] / 1024.0),
             '{:.3f}'.format(r['message_bytes'] /
                             base.get(r['p'], float('nan'))),
             '{:.1f}'.format(r['ring_sent_bytes'] / 1024.0), r['ring_steps']]
            + [str(r.get('steps_k{}'.format(k), '—')) for k in ks]
            for r in rows]
    return T.Table('Communication per step: {} ({} parameters in {} '
                   'tensors)'.format(cfg.model.name, sum(sizes), len(sizes)),
                   header, body, [], '')


#: the instances the entries run
TABLE4 = Table4Study()
TABLE9 = Table9Study()
COST = CostStudy()
