"""Image classification under every loss-scaling mode: Table 1 (paper §4.1),
Table 4 (Appendix A), the mini reproduction and the precision table (not in
the paper), one study with one config.

A cell is (model, dataset, mode, seed, precision); its run lives in
``<out>/<table>/<run name>/`` (``<out>/<table>/<precision>/<run name>/`` when
the config sweeps ``grid.precisions``) with run name
``<model>-<dataset>-<mode>-s<seed>``, the mode's ``:`` and ``,`` made ``_``
(``fixed:128`` -> ``fixed_128``).

One run (the recipe of :class:`ada_loss.experiment.recipe.TrainingStudy`,
with this study's hooks) builds the model in the run's precision (float32
for ``fp32``, mixed16 unless given otherwise), MomentumSGD
with FP32 master weights and a per-parameter weight-decay hook (it runs
inside the update rule, after the gradient is unscaled in FP32), the
loss-scaling method of the mode, and Chainer's Trainer with the extensions of
:func:`ada_loss.experiment.trainer_extensions.extend_trainer` (evaluator,
StepLearningRate, LogReport + ``log.csv``, PrintReport / ProgressBar,
PlotReport ``loss.png`` / ``accuracy.png``, the snapshot and, for the
layer-wise modes, ``loss_scales.csv``). A run whose gradients overflow in a
mode that cannot skip steps, or whose final loss is not finite, ends with
status ``diverged`` instead of stopping the grid.

The defaults are the CIFAR recipe of He et al. (2016, §4.2) that the paper
keeps (§4.1): batch 128, momentum SGD 0.9, lr 0.1 divided by 10 at epochs 81
and 122 of 164, weight decay 1e-4; ResNet-110 warms up at lr 0.01 for about
400 iterations (``per_model.resnet110.train.warmup_iterations``).
"""
import collections
import dataclasses
import os
from typing import List, Literal, Optional

from ada_loss.communication.policy import CommPolicy
from ada_loss.communication.summation import ORDERS
from ada_loss.experiment import config as C
from ada_loss.experiment import tables
from ada_loss.experiment import recipe as RC
from ada_loss.experiment import devices
from ada_loss.experiment import iterators
from ada_loss.experiment import optimization
from ada_loss.experiment import settings
from ada_loss.experiment import summaries
from ada_loss.experiment import trainer_extensions
from ada_loss.experiment.config import setting, section
from ada_loss.experiment.data import (DATASETS, data_record, dataset_info,
                                      load_datasets)
from ada_loss.experiment.models import MODEL_HELP, build
from ada_loss.experiment.modes import grid_modes, mode_slug, mode_sort_key
from ada_loss.loss_scale.dynamic import describe_styles
from ada_loss.scaling import resolve_precision
from ada_loss.training import Classifier, dtype_config
from ada_loss.training import extensions as AE
from ada_loss.precision import PRECISION_HELP

# -- the config ----------------------------------------------------------------------
@dataclasses.dataclass
class Grid:
    models: List[C.ModelName] = setting(['resnet20'],
                                        'models ({})'.format(MODEL_HELP))
    datasets: List[C.Dataset] = setting(['cifar10'], 'datasets: ' +
                                        ', '.join(sorted(DATASETS)))
    modes: List[C.Mode] = setting(
        ['fp32', 'none', 'dynamic', 'adaptive'], 'loss-scaling modes (fp32, '
        'none, fixed:S, dynamic[:style=pytorch|chainer|tf,k=v], '
        'adaptive[:k=v], amax[:k=v])', nonempty=False)
    fixed_scales: List[C.FixedScale] = setting(
        [], 'fixed loss scales S, run as modes fixed:S', nonempty=False)
    seeds: List[int] = setting([0], 'random seeds (one run each)', minimum=0)
    precisions: List[C.PrecisionName] = setting(
        [], 'precisions to sweep, each into <out>/<table>/<precision>/ (the '
        'precision table); empty: train.precision only', nonempty=False)


@dataclasses.dataclass
class Model:
    width: Optional[int] = setting(None, 'filters of the first stage (null: '
                                   "the model's default, 16 for CIFAR "
                                   'ResNets)', minimum=1)
    in_channels: Optional[int] = setting(None, 'input channels (null: from '
                                         'the dataset)', minimum=1)
    shortcut: Optional[Literal['A', 'B', 'authors']] = setting(
        None, "CIFAR ResNet shortcut option (null: A); authors: the "
        "authors' CIFAR ResNet (projection shortcut in each stage's first "
        'block, HeNormal fan_out; ada_loss/models/cifar_resnet.py)')


@dataclasses.dataclass
class Data:
    cifar_root: Optional[str] = setting(None, 'CIFAR files (null: '
                                        '$ADA_LOSS_CIFAR_ROOT)')
    fashion_mnist_root: str = setting('/usr/share/datasets/fashion-mnist',
                                      'folder of the Fashion-MNIST IDX files')
    digits_size: int = setting(16, 'side of the upsampled sklearn digits',
                               minimum=8)
    augment: bool = setting(True, 'CIFAR: pad 4, random crop, random flip '
                                  '(He et al. 2016, §4.2)')
    train_size: Optional[int] = setting(None, 'use a random subset of this '
                                        'many training examples', minimum=1)
    test_size: Optional[int] = setting(None, 'use a random subset of this '
                                       'many test examples', minimum=1)
    split_seed: int = setting(0, 'seed of the digits split and of subsets',
                              minimum=0)
    val_size: Optional[int] = setting(
        None, 'selection split: this many training images, never trained '
        'on, on which what a table tunes is chosen (final_val_accuracy in '
        'run.json); drawn outside data.train_size\'s subset where there are '
        'enough, else taken out of the training set (null: none)',
        minimum=1)
    download: bool = setting(False, 'fetch missing data first, verified '
                             "against the publishers' checksums (python -m "
                             'ada_loss.datasets.fetch); false: never download')
    mirror: Optional[str] = setting(None, 'server holding the publishers\' '
                                    'file names to fetch from (null: the '
                                    'publishers\')')


@dataclasses.dataclass
class Train:
    renamed = {'dtype': 'precision'}

    precision: Optional[C.PrecisionName] = settings.precision_setting()
    batchsize: int = setting(128, 'minibatch size (global, all ranks)',
                             minimum=1)
    lr: float = setting(0.1, 'initial learning rate', positive=True)
    momentum: float = setting(0.9, 'MomentumSGD momentum', minimum=0.0)
    weight_decay: float = setting(1e-4, 'L2 weight decay (a per-parameter '
                                  'hook: sees unscaled FP32 gradients)',
                                  minimum=0.0)
    epochs: float = setting(164, 'training length in epochs', positive=True)
    lr_steps: List[float] = setting([81, 122], 'epochs at which lr is '
                                    'multiplied by lr_decay', positive=True,
                                    nonempty=False)
    lr_decay: float = setting(0.1, 'lr multiplier at each step',
                              positive=True)
    warmup_iterations: int = setting(0, 'iterations at warmup_lr first '
                                     '(ResNet-110: ~400)', minimum=0)
    warmup_lr: float = setting(0.01, 'learning rate during warm-up',
                               positive=True)
    max_iterations: Optional[int] = setting(
        None, 'stop after this many iterations (overrides epochs; mini runs, '
        'tests)', minimum=1)
    eval_batchsize: int = setting(256, 'minibatch size of the evaluation',
                                  minimum=1)
    # (YAML 1.1 reads a bare on/off as true/false: both spellings taken)
    cuda_graph: Optional[Literal['auto', 'on', 'off', True, False]] = \
        setting(None, 'replay the whole training step as a CUDA graph: '
                'auto (null is auto: a config.yaml written before the key '
                'compares equal) is on for a CUDA device and off on the '
                'CPU, where on is an error; ada_loss.training.cuda_graph')


@dataclasses.dataclass
class Comm:
    """Low-precision gradient communication of a data-parallel run (APS,
    Han et al.; :mod:`ada_loss.communication`)."""
    format: Optional[C.FormatName] = setting(
        None, 'gradient format of the all-reduce, e.g. e4m3, e5m2, '
        'fp4_e2m1 (null: ChainerMN\'s FP32 averaging); needs --mpi')
    aps: bool = setting(True, 'APS: shift each layer by a power of two so '
                              'that no partial sum overflows')
    order: Literal[ORDERS] = setting('ring', 'ring, or hierarchical (groups '
                                     'of group_size ranks)')
    group_size: Optional[int] = setting(None, 'k of the hierarchical order',
                                        minimum=1)
    kahan: bool = setting(False, 'Kahan summation in the format (§5.1.1)')
    fp32_layers: List[str] = setting([], 'parameters kept in FP32 (fnmatch '
                                     'patterns, e.g. "*/fc/*")',
                                     nonempty=False)
    fp32_epochs: float = setting(0, 'FP32 communication for the first E '
                                 'epochs', minimum=0.0)
    wire: bool = setting(True, 'send codes of the format through MPI (1 '
                               'byte, or half a byte, per element); false: '
                               'the emulation (FP32 payloads gathered)')

    def policy(self):
        """The :class:`~ada_loss.communication.CommPolicy`, or None for
        ChainerMN's own FP32 averaging."""
        if self.format is None:
            return None
        return CommPolicy(self.format, self.aps, self.order, self.group_size,
                          self.kahan, self.fp32_layers, self.fp32_epochs)


#: Sections that ``per_model.<model>`` may override for one model.
PER_MODEL_SECTIONS = {'model': Model, 'data': Data, 'train': Train,
                      'log': settings.Log}


class PerModel(object):
    """``per_model``: model -> {section: {key: value}}, each value checked
    against its section's type."""
    expected = 'a mapping model -> {section: {key: value}}'

    @staticmethod
    def parse(value, key):
        if not isinstance(value, dict):
            C.fail(key, PerModel.expected, value)
        out = {}
        for model, partial in value.items():
            mkey = '{}.{}'.format(key, model)
            name = C.ModelName.parse(str(model), mkey)
            if not isinstance(partial, dict):
                raise C.ConfigError(mkey, 'expected a mapping of sections '
                                    '({})'.format(', '.join(
                                        PER_MODEL_SECTIONS)))
            out[name] = {}
            for sec, values in partial.items():
                skey = '{}.{}'.format(mkey, sec)
                if sec not in PER_MODEL_SECTIONS:
                    raise C.ConfigError(skey, 'unknown section; allowed: '
                                        '{}'.format(', '.join(
                                            PER_MODEL_SECTIONS)))
                out[name][sec] = C.from_dict(PER_MODEL_SECTIONS[sec],
                                             values or {}, skey + '.',
                                             partial=True)
        return out


@dataclasses.dataclass
class Config:
    """The config of Tables 1 and 4, the mini reproduction and the
    precision table."""
    table: str = setting('table1', 'results subfolder: <out>/<table>/<run>/')
    layout: Literal['table1', 'table4', 'precision'] = setting(
        'table1', 'the table built from the runs')
    description: str = setting('', 'free text, copied to every run')
    distributed: bool = setting(False, 'ChainerMN data parallelism '
                                       '(mpiexec); same as --mpi')
    blas_threads: int = setting(1, 'BLAS/OpenMP threads of each run '
                                   '(results depend on it; fixed so that '
                                   'they do not depend on --jobs; recorded '
                                   'in run.json)', minimum=1)
    device: Optional[C.Device] = settings.device_setting()
    grid: Grid = section(Grid)
    model: Model = section(Model)
    data: Data = section(Data)
    train: Train = section(Train)
    log: settings.Log = section(settings.Log)
    comm: Comm = section(Comm)
    per_model: PerModel = setting({}, 'per-model overrides of the sections '
                                  + ', '.join(PER_MODEL_SECTIONS))

    def modes(self):
        """The grid's modes: ``grid.modes`` then ``fixed:S`` per scale."""
        return grid_modes(self.grid.modes, self.grid.fixed_scales)

    def precisions(self):
        """The precisions the grid runs in (None: per mode's default)."""
        return list(self.grid.precisions) or [self.train.precision]

    def for_model(self, model):
        """This config with ``per_model[model]`` merged into its
        sections."""
        out = self
        for sec, values in self.per_model.get(model, {}).items():
            out = C.replace(out, **{sec: C.replace(getattr(out, sec),
                                                   **values)})
        return out

    def check(self):
        """Every mode of the grid builds, in every precision it runs in; the
        communication policy is a valid one."""
        if self.comm.format is not None:
            try:
                self.comm.policy()
            except ValueError as e:
                raise C.ConfigError('comm', str(e))
        if not self.modes():
            raise C.ConfigError('grid.modes', 'no mode to run: give '
                                'grid.modes and/or grid.fixed_scales')
        precisions = set(self.precisions())
        for partial in self.per_model.values():
            if 'precision' in partial.get('train', {}):
                precisions.add(partial['train']['precision'])
        modes = [('grid.modes' if i < len(self.grid.modes)
                  else 'grid.fixed_scales', mode)
                 for i, mode in enumerate(self.modes())]
        settings.check_modes_build(modes, precisions)
        if self.train.cuda_graph in ('on', True) and self.device is None:
            raise C.ConfigError('train.cuda_graph', 'on needs a CUDA device '
                                '(device: @cupy:N); the CPU has no graphs '
                                'to replay: use auto or off')
        devices.check_device_config(
            self.device, modes, [('log', self.log)] + [
                ('per_model.{}.log'.format(m), p['log'])
                for m, p in self.per_model.items() if 'log' in p],
            self.distributed)


HELP_NOTES = ['', 'dynamic loss scaling styles (grid.modes '
              'dynamic:style=..):', describe_styles(), '',
              'precisions (train.precision, grid.precisions): ' +
              PRECISION_HELP]


# -- the study -----------------------------------------------------------------------
Cell = collections.namedtuple('Cell', ('model', 'dataset', 'mode', 'seed',
                                       'precision'))
Cell.__new__.__defaults__ = (None,)

PRINT_KEYS = ['epoch', 'iteration', 'main/loss', 'validation/main/loss',
              'main/accuracy', 'validation/main/accuracy', 'lr',
              'loss_scale', 'skipped_steps', 'elapsed_time']
PLOTS = [('Loss', ['main/loss', 'validation/main/loss']),
         ('Accuracy', ['main/accuracy', 'validation/main/accuracy'])]


def run_name(cell):
    return '{}-{}-{}-s{}'.format(cell.model, cell.dataset,
                                 mode_slug(cell.mode), cell.seed)


class ClassificationStudy(RC.TrainingStudy):
    """Tables 1 and 4, the mini reproduction, the precision table."""
    Config = Config
    Cell = Cell
    help_notes = HELP_NOTES
    print_keys = PRINT_KEYS
    plots = PLOTS
    history = ['validation/main/accuracy', 'validation/main/loss']

    def cells(self, cfg):
        """Seed-major (a partial grid already holds complete rows), then
        precision, model, dataset, mode in the paper's column order."""
        g = cfg.grid
        modes = sorted(cfg.modes(), key=mode_sort_key)
        sweep = list(g.precisions) or [None]
        return [Cell(m, d, mode, s, p) for s in g.seeds for p in sweep
                for m in g.models for d in g.datasets for mode in modes]

    def run_name(self, cfg, cell):
        return run_name(cell)

    def folder(self, out, cfg, cell):
        parts = [out, cfg.table] + ([str(cell.precision)] if cell.precision
                                    else []) + [run_name(cell)]
        return os.path.join(*parts)

    def run_config(self, cfg, cell):
        """The resolved config of one run (what ``config.yaml`` holds)."""
        c = cfg.for_model(cell.model)
        precision = resolve_precision(cell.mode, cell.precision or
                                      c.train.precision)
        out = {'run': {'model': cell.model, 'dataset': cell.dataset,
                       'mode': str(cell.mode), 'seed': cell.seed,
                       'precision': precision}}
        d = C.to_dict(c)
        if cell.precision:    # the sweep's run: as its own config says
            d['train']['precision'] = str(cell.precision)
            d['table'] = '{}/{}'.format(cfg.table, cell.precision)
            d['layout'] = 'precision'
        out.update((k, v) for k, v in d.items()
                   if k not in ('grid', 'per_model'))
        return out

    stop_keys = ('train.max_iterations', 'train.epochs')

    def data_record(self, cfg, cell):
        """The resolved data roots and the files' sizes and hashes
        (:func:`~ada_loss.experiment.data.data_record`)."""
        return data_record(cell.dataset, cfg.for_model(cell.model).data)

    def preload(self, cfg, cells):
        """Every dataset the cells need: {(dataset, data section): (train,
        test)}."""
        if cfg.comm.format is not None and not cfg.distributed:
            raise C.ConfigError(
                'comm.format', 'low-precision gradient communication needs '
                'data-parallel ranks: run under mpiexec with --mpi (or '
                'distributed: true); to study it in one process, see '
                'experiments/aps_table4.py')
        devices.training_device(cfg.device)     # CuPy and the GPU are there
        cache = {}
        for cell in cells:
            data = cfg.for_model(cell.model).data
            key = (cell.dataset, repr(data))
            if key not in cache:
                cache[key] = load_datasets(cell.dataset, data,
                                           selection=True)
        return cache

    # -- the recipe's hooks (ada_loss.experiment.recipe) ----------------------------
    def setup(self, cfg, cell, comm=None):
        c = cfg.for_model(cell.model)
        policy = c.comm.policy() if comm is not None else None
        if policy is not None:
            try:
                policy.check(comm.size)
            except ValueError as e:
                raise C.ConfigError('comm.group_size', str(e))
        return RC.Run(cfg=cfg, cell=cell, config=c, mode=cell.mode,
                      precision=RC.run_precision(cell.mode, cell.precision or
                                                 c.train.precision),
                      seed=cell.seed, log=c.log, policy=policy,
                      table=self.run_config(cfg, cell)['table'])

    def run_fields(self, run):
        cell = run.cell
        return [('name', run_name(cell)), ('table', run.table),
                ('model', cell.model), ('dataset', cell.dataset)] + \
            RC.mode_fields(run.mode, run.precision) + [
                ('seed', cell.seed), ('precision', str(run.precision))]

    def load_data(self, run, cache):
        key = (run.cell.dataset, repr(run.config.data))
        return (cache or {}).get(key) or load_datasets(
            run.cell.dataset, run.config.data, selection=True)

    def datasets(self, run, data, model):
        """``(train, test)``; the selection split (``data.val_size``), if
        any, waits on ``run.selection`` for :meth:`metrics`."""
        train, test, run.selection = data
        return train, test

    def model(self, run, data):
        m = run.config.model
        num_classes, in_channels = dataset_info(run.cell.dataset)
        with dtype_config(run.precision):
            return Classifier(build(
                run.cell.model, num_classes, m.in_channels or in_channels,
                m.width, m.shortcut), run.precision, run.seed)

    def optimizer(self, run, model):
        t = run.config.train
        return optimization.build_optimizer(
            model, run.precision, t.lr, t.momentum, t.weight_decay, run.comm,
            run.policy, run.config.comm.wire)

    batchsize_key = 'train.batchsize'

    def updater(self, run, train_iter, optimizer, scaling):
        return optimization.make_updater(
            train_iter, optimizer, scaling, run.mode, run.comm,
            os.path.join(run.folder, 'scaling.txt'),
            aps=run.policy is not None, device=run.device)

    def lr_schedule(self, run, optimizer):
        t = run.config.train
        return AE.StepLearningRate(t.lr, t.lr_steps, t.lr_decay,
                                   t.warmup_iterations, t.warmup_lr,
                                   optimizer=optimizer)

    def final_values(self, run, trainer, updater):
        return [('train', summaries.last(
                    trainer.get_extension('LogReport').log, 'main/loss')),
                ('test', trainer.get_extension('TestHistory').last(
                    'validation/main/loss'))]

    def metrics(self, run, trainer, updater, diverged):
        tests = trainer.get_extension('TestHistory')
        acc_key = 'validation/main/accuracy'
        (_, train_loss), (_, test_loss) = self.final_values(run, trainer,
                                                            updater)
        return [('final_test_accuracy', None if diverged
                 else tests.last(acc_key)),
                ('best_test_accuracy', None if diverged
                 else tests.best(acc_key)),
                ('last_test_accuracy', tests.last(acc_key)),
                ('final_test_loss', test_loss),
                ('final_train_loss', train_loss)] + (
                    [] if run.selection is None else
                    [('final_val_accuracy', None if diverged
                      else self.selection_accuracy(run, trainer))])

    def selection_accuracy(self, run, trainer):
        """Accuracy of the trained model on the selection split (every
        rank evaluates all of it: the same number everywhere)."""
        model = trainer.updater.get_optimizer('main').target
        it = iterators.make_iterator(run.selection,
                                     run.config.train.eval_batchsize,
                                     repeat=False, shuffle=False)
        ev = trainer_extensions.evaluator(it, model, None, run.device)
        ev.name = 'selection'
        return float(ev()['selection/main/accuracy'])

    def summarized(self, run, info, scaling):
        # the last step's α (also after a resume with no step left)
        alphas = list(run.loss_scales.values())
        if alphas:
            info['alpha_min'], info['alpha_max'] = min(alphas), max(alphas)

    def write_tables(self, cfg, out, quiet=False, train=True):
        return tables.write_tables(os.path.join(out, cfg.table), cfg.layout,
                                   quiet=quiet)


#: the one instance the entries run
STUDY = ClassificationStudy()
