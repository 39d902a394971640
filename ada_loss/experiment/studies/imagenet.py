"""Table 2 of the paper (§4.2): ResNet-18/50 on ILSVRC2012, top-1 (%) per
loss-scaling mode; the library side of ``experiments/table2_imagenet.py``.

The training method of He et al. (2016) in its common large-batch form
(Goyal et al. 2017): 90 epochs, MomentumSGD 0.9, lr 0.1 * B / 256 with a
linear warm-up over the first 5 epochs, x0.1 at epochs 30, 60 and 80, weight
decay 1e-4; random-resized crops + flips, 224x224 center crops of
256-resized images for evaluation. Only the loss-scaling mode changes:
FP32 | None | Fixed (128) | Dynamic | Adaptive, in mixed16 unless
``train.precision`` says otherwise (any precision of
:mod:`ada_loss.precision`). Each cell is one run (the recipe of
:class:`~ada_loss.experiment.recipe.TrainingStudy`, this study's hooks)
in ``<out>/<table>/<model>-imagenet-<mode>-s<seed>/`` with the harness's
files (``run.json``: status finished/diverged, ``final_test_accuracy`` =
top-1 on the validation set ...). The table goes to
``<out>/<table>/table2.md``.
"""
import collections
import dataclasses
import os
from typing import List, Literal, Optional

from ada_loss.datasets.imagenet import get_imagenet_datasets
from ada_loss.scaling import parse_mode
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import tables as T
from ada_loss.experiment import recipe as RC
from ada_loss.experiment import devices
from ada_loss.experiment import iterators
from ada_loss.experiment import optimization
from ada_loss.experiment import settings
from ada_loss.experiment import summaries
from ada_loss.experiment.config import section, setting
from ada_loss.experiment.modes import mode_sort_key
from ada_loss.experiment.studies.classification import PLOTS, run_name
from ada_loss.models import build_model
from ada_loss.scaling import resolve_precision
from ada_loss.training import Classifier, dtype_config
from ada_loss.training import extensions as AE

@dataclasses.dataclass
class Grid:
    models: List[Literal['resnet18', 'resnet50']] = setting(
        ['resnet18', 'resnet50'], 'ImageNet ResNets')
    modes: List[C.Mode] = setting(['fp32', 'none', 'fixed:128', 'dynamic',
                                   'adaptive'], 'loss-scaling modes')
    seeds: List[int] = setting([0], 'seeds', minimum=0)


@dataclasses.dataclass
class Data:
    imagenet_root: Optional[str] = setting(
        None, 'ILSVRC2012 root with train/ and val/ (null: '
        '$ADA_LOSS_IMAGENET_ROOT)')
    image_size: int = setting(224, 'crop size', minimum=8)
    eval_resize: int = setting(256, 'shorter side before the center crop',
                               minimum=8)
    train_size: Optional[int] = setting(None, 'random training subset',
                                        minimum=1)
    test_size: Optional[int] = setting(None, 'random validation subset',
                                       minimum=1)
    loaderjobs: int = setting(0, 'data loading processes (0: serial)',
                              minimum=0)


@dataclasses.dataclass
class Train:
    precision: Optional[C.PrecisionName] = settings.precision_setting()
    batchsize: int = setting(256, 'global minibatch size', minimum=1)
    base_lr: float = setting(0.1, 'lr for batch 256 (lr = base_lr * B/256)',
                             positive=True)
    warmup_epochs: float = setting(5, 'linear warm-up length', minimum=0.0)
    lr_steps: List[float] = setting([30, 60, 80], 'epochs where lr *= '
                                    'lr_decay', positive=True, nonempty=False)
    lr_decay: float = setting(0.1, 'lr multiplier', positive=True)
    momentum: float = setting(0.9, 'MomentumSGD momentum', minimum=0.0)
    weight_decay: float = setting(1e-4, 'L2 weight decay', minimum=0.0)
    epochs: float = setting(90, 'training length', positive=True)
    max_iterations: Optional[int] = setting(
        None, 'stop after this many iterations (mini runs)', minimum=1)
    eval_batchsize: int = setting(250, 'evaluation batch size', minimum=1)


@dataclasses.dataclass
class Config:
    """The config of Table 2."""
    table: str = setting('table2_imagenet', 'results subfolder')
    description: str = setting('', 'free text, copied to every run')
    distributed: bool = setting(False, 'ChainerMN data parallelism (--mpi)')
    blas_threads: int = setting(1, 'BLAS/OpenMP threads of each run '
                                '(recorded in run.json)', minimum=1)
    device: Optional[C.Device] = settings.device_setting()
    grid: Grid = section(Grid)
    data: Data = section(Data)
    train: Train = section(Train)
    log: settings.Log = section(settings.Log)

    def check(self):
        """Every mode builds in the precision (and runs on the device)."""
        modes = [('grid.modes', m) for m in self.grid.modes]
        settings.check_modes_build(modes, [self.train.precision])
        devices.check_device_config(self.device, modes, [('log', self.log)],
                                    self.distributed)


PRINT_KEYS = ['epoch', 'iteration', 'main/loss', 'validation/main/loss',
              'main/accuracy', 'validation/main/accuracy', 'lr',
              'loss_scale', 'skipped_steps', 'elapsed_time']


class WarmupStepLR(AE.StepLearningRate):
    """``lr * min(1, (iteration + 1) / warm-up iterations) * decay ** k``,
    k = number of ``steps`` (epochs) reached (Goyal et al. 2017)."""

    def __init__(self, lr, steps, decay, warmup_iterations, optimizer=None):
        super(WarmupStepLR, self).__init__(lr, steps, decay,
                                           optimizer=optimizer)
        self.warmup = warmup_iterations

    def value(self, iteration, epoch_detail):
        k = sum(1 for s in self.steps if epoch_detail >= s)
        ramp = min(1.0, (iteration + 1) / self.warmup) if self.warmup else 1.
        return self.lr * ramp * self.decay ** k


ImageNetCell = collections.namedtuple('ImageNetCell',
                                      ('model', 'dataset', 'mode', 'seed'))


class ImageNetStudy(RC.TrainingStudy):
    """Table 2: ImageNet ResNets per loss-scaling mode."""
    Config = Config
    Cell = ImageNetCell
    print_keys = PRINT_KEYS
    plots = PLOTS

    def cells(self, cfg):
        g = cfg.grid
        return [ImageNetCell(m, 'imagenet', mode, s) for s in g.seeds
                for m in g.models
                for mode in sorted(g.modes, key=mode_sort_key)]

    def run_name(self, cfg, cell):
        return run_name(cell)

    def run_config(self, cfg, cell):
        return self.cell_config(cfg, cell, precision=resolve_precision(
            cell.mode, cfg.train.precision))

    stop_keys = ('train.max_iterations', 'train.epochs')

    def preload(self, cfg, cells):
        """The datasets (missing files fail here, before any training)."""
        d = cfg.data
        devices.training_device(cfg.device)     # CuPy and the GPU are there
        return get_imagenet_datasets(d.imagenet_root, d.image_size,
                                     d.eval_resize) if cells else None

    # -- the recipe's hooks (ada_loss.experiment.recipe) ----------------------------
    def run_fields(self, run):
        cell = run.cell
        return [('name', run_name(cell)), ('table', run.cfg.table),
                ('model', cell.model), ('dataset', 'imagenet')] + \
            RC.mode_fields(run.mode, run.precision) + [
                ('seed', cell.seed), ('precision', str(run.precision))]

    def load_data(self, run, cache):
        d = run.cfg.data
        return cache or get_imagenet_datasets(d.imagenet_root, d.image_size,
                                              d.eval_resize)

    def model(self, run, data):
        num_classes = len(data[0]._dataset.label_names)
        with dtype_config(run.precision):
            return Classifier(build_model(run.cell.model, num_classes),
                              run.precision, run.seed)

    def datasets(self, run, data, model):
        d, t = run.cfg.data, run.cfg.train
        train = iterators.subset(data[0], d.train_size, run.seed)
        test = iterators.subset(data[1], d.test_size, run.seed + 1)
        run.iters_per_epoch = max(1, len(train) // t.batchsize)
        return train, test

    def optimizer(self, run, model):
        t = run.cfg.train
        return optimization.build_optimizer(
            model, run.precision, self.lr(run), t.momentum, t.weight_decay,
            run.comm)

    @staticmethod
    def lr(run):
        """lr = base_lr * B / 256 (Goyal et al. 2017)."""
        return run.cfg.train.base_lr * run.cfg.train.batchsize / 256.0

    def iterators(self, run, train, test, batchsize):
        d, t = run.cfg.data, run.cfg.train
        seed = iterators.iterator_seed(run.seed, run.comm)
        return (iterators.make_iterator(train, batchsize, d.loaderjobs,
                                        seed=seed),
                iterators.make_iterator(test, t.eval_batchsize, d.loaderjobs,
                                        repeat=False, shuffle=False,
                                        seed=seed))

    scaling_summary = None

    def lr_schedule(self, run, optimizer):
        t = run.cfg.train
        return WarmupStepLR(self.lr(run), t.lr_steps, t.lr_decay,
                            int(round(t.warmup_epochs *
                                      run.iters_per_epoch)),
                            optimizer=optimizer)

    def final_values(self, run, trainer, updater):
        log = trainer.get_extension('LogReport').log
        return [('train', summaries.last(log, 'main/loss')),
                ('test', summaries.last(log, 'validation/main/loss'))]

    def metrics(self, run, trainer, updater, diverged):
        log = trainer.get_extension('LogReport').log
        accs = [e['validation/main/accuracy'] for e in log
                if 'validation/main/accuracy' in e]
        (_, train_loss), (_, test_loss) = self.final_values(run, trainer,
                                                            updater)
        return [('final_test_accuracy', None if diverged else
                 summaries.last(log, 'validation/main/accuracy')),
                ('best_test_accuracy', None if diverged or not accs
                 else max(accs)),
                ('final_test_loss', test_loss),
                ('final_train_loss', train_loss)]

    def write_tables(self, cfg, out, quiet=False, train=True):
        results = os.path.join(out, cfg.table)
        return T.write_table(build_table(R.find_runs(results)), results,
                             'table2', quiet)


# -- the table ---------------------------------------------------------------
def build_table(runs):
    """Table 2: rows ResNet-18/50 (and precision, where the runs have
    several), top-1 (%) per mode: FP32, None, a Fixed (S) column per fixed
    scale found (the paper's is 128), Dynamic, Adaptive; a column per
    mode, so that no cell averages two (two modes sharing a name are
    labelled by their text)."""
    cols = T.mode_column_list(runs, always=('FP32', 'None', 'Dynamic',
                                            'Adaptive'))
    scales = sorted({r['mode_options'].get('scale') for r in runs
                     if r['mode_name'] == 'fixed'}) or [128.0]
    fixed = [('Fixed ({:g})'.format(s), 'fixed:{:g}'.format(s))
             for s in scales]
    n_head = sum(c[0] in ('FP32', 'None') for c in cols)
    cols = cols[:n_head] + fixed + cols[n_head:]
    keys = sorted({(r.get('precision'), r['model']) for r in runs},
                  key=lambda k: (str(k[0]), k[1]))
    several = len({k[0] for k in keys}) > 1
    rows, cells, used = [], [], set()
    for precision, model in keys:
        mine = T.by_mode([r for r in runs if r['model'] == model and
                          r.get('precision') == precision])
        row = {c: T.CellStats(mine.get(mode, []) if mode else [], scale=(
            parse_mode(mode).options['scale'] if c.startswith('Fixed')
            else None)) for c, mode in cols}
        for c in row.values():
            used.update(id(r) for r in c.runs)
        means = [round(s.mean, 2) for s in row.values() if s.mean is not None]
        top = max(means) if means else None
        label = {'resnet18': 'ResNet-18', 'resnet50': 'ResNet-50'}.get(
            model, model)
        rows.append(([str(precision)] if several else []) + [label] + [
            row[c].text(bold=row[c].mean is not None and
                        round(row[c].mean, 2) == top) for c, _ in cols])
        cells += [(precision, 'imagenet', model, c, row[c]) for c, _ in cols]
    counts = collections.Counter(r.get('status') for r in runs)
    footer = '{} runs ({}); top-1 on the ILSVRC2012 validation set; ' \
        '"diverged" = all runs of the cell diverged.{}'.format(
            len(runs), ', '.join('{} {}'.format(v, k) for k, v in
                                 sorted(counts.items())) or 'none',
            T.not_in_table(runs, used))
    return T.Table('Table 2: ImageNet top-1 accuracy (%)',
                   (['Precision'] if several else []) + ['Model'] +
                   [c for c, _ in cols], rows, cells, footer)


#: the one instance the entries run
STUDY = ImageNetStudy()
