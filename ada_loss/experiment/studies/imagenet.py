"""Table 2 of the paper (§4.2): ResNet-18/50 on ILSVRC2012, top-1 (%) per
loss-scaling mode; the library side of ``experiments/table2_imagenet.py``.

The training method of He et al. (2016) in its common large-batch form
(Goyal et al. 2017): 90 epochs, MomentumSGD 0.9, lr 0.1 * B / 256 with a
linear warm-up over the first 5 epochs, x0.1 at epochs 30, 60 and 80, weight
decay 1e-4; random-resized crops + flips, 224x224 center crops of
256-resized images for evaluation. Only the loss-scaling mode changes:
FP32 | None | Fixed (128) | Dynamic | Adaptive. Each cell is one run
(:meth:`ImageNetStudy.run`)
in ``<out>/<table>/<model>-imagenet-<mode>-s<seed>/`` with the harness's
files (``run.json``: status finished/diverged, ``final_test_accuracy`` =
top-1 on the validation set ...). The table goes to
``<out>/<table>/table2.md``.
"""
import collections
import dataclasses
import os
import random
from typing import List, Literal, Optional

import numpy
from chainer import training

from ada_loss.datasets.imagenet import get_imagenet_datasets
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import tables as T
from ada_loss.experiment import trainer as TR
from ada_loss.experiment.config import section, setting
from ada_loss.experiment.runner import Study
from ada_loss.experiment.studies.classification import (
    PLOTS, mode_sort_key, run_name)
from ada_loss.models import build_model
from ada_loss.scaling import parse_mode, resolve_precision
from ada_loss.training import Classifier, dtype_config
from ada_loss.training import extensions as AE
from ada_loss.training.triggers import StopAt

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
    grid: Grid = section(Grid)
    data: Data = section(Data)
    train: Train = section(Train)
    log: TR.Log = section(TR.Log)


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


class ImageNetStudy(Study):
    """Table 2: ImageNet ResNets per loss-scaling mode."""
    Config = Config
    Cell = ImageNetCell

    def cells(self, cfg):
        g = cfg.grid
        return [ImageNetCell(m, 'imagenet', mode, s) for s in g.seeds
                for m in g.models
                for mode in sorted(g.modes, key=mode_sort_key)]

    def run_name(self, cfg, cell):
        return run_name(cell)

    def run_config(self, cfg, cell):
        return self.cell_config(cfg, cell,
                                precision=resolve_precision(cell.mode))

    def stop_point(self, run_config):
        t = (run_config or {}).get('train') or {}
        return t.get('max_iterations'), t.get('epochs')

    def preload(self, cfg, cells):
        """The datasets (missing files fail here, before any training)."""
        d = cfg.data
        return get_imagenet_datasets(d.imagenet_root, d.image_size,
                                     d.eval_resize) if cells else None

    def run(self, cfg, cell, out, resume=False, comm=None, cache=None):
        """Trains one cell (model, 'imagenet', mode, seed); returns
        run.json."""
        data_cfg, train_cfg, log_cfg = cfg.data, cfg.train, cfg.log
        spec = parse_mode(cell.mode)
        dtype = resolve_precision(cell.mode)
        folder = self.folder(out, cfg, cell)
        info, resuming = TR.open_run(folder, [
            ('name', run_name(cell)), ('table', cfg.table),
            ('model', cell.model), ('dataset', 'imagenet'),
            ('mode', str(spec)), ('mode_name', spec.name),
            ('mode_options', spec.options), ('seed', cell.seed),
            ('precision', dtype)], cfg.description,
            C.dump(self.run_config(cfg, cell)), resume, comm)

        random.seed(cell.seed)
        numpy.random.seed(cell.seed)
        train, test = cache or get_imagenet_datasets(
            data_cfg.imagenet_root, data_cfg.image_size,
            data_cfg.eval_resize)
        num_classes = len(train._dataset.label_names)
        train = TR.subset(train, data_cfg.train_size, cell.seed)
        test = TR.subset(test, data_cfg.test_size, cell.seed + 1)
        with dtype_config(dtype):
            model = Classifier(build_model(cell.model, num_classes), dtype)
        batchsize = train_cfg.batchsize
        lr = train_cfg.base_lr * batchsize / 256.0
        optimizer = TR.build_optimizer(model, dtype, lr, train_cfg.momentum,
                                       train_cfg.weight_decay, comm)
        iters_per_epoch = max(1, len(train) // batchsize)
        train, test, batchsize = TR.scatter(train, test, batchsize, comm,
                                            cell.seed)
        seed = TR.iterator_seed(cell.seed, comm)
        train_iter = TR.make_iterator(train, batchsize, data_cfg.loaderjobs,
                                      seed=seed)
        test_iter = TR.make_iterator(test, train_cfg.eval_batchsize,
                                     data_cfg.loaderjobs, repeat=False,
                                     shuffle=False, seed=seed)

        scaling = TR.make_scaling(cell.mode, dtype, log_cfg, comm)
        updater = TR.make_updater(train_iter, optimizer, scaling, spec, comm)
        stop = StopAt(epochs=train_cfg.epochs,
                      iterations=train_cfg.max_iterations)
        trainer = training.Trainer(updater, stop, out=folder)
        TR.extend_trainer(
            trainer, stop, log_cfg, TR.evaluator(test_iter, model, comm),
            WarmupStepLR(lr, train_cfg.lr_steps, train_cfg.lr_decay,
                         int(round(train_cfg.warmup_epochs *
                                   iters_per_epoch)), optimizer=optimizer),
            optimizer, scaling, resuming, comm,
            print_keys=PRINT_KEYS, plots=PLOTS)

        def finalize(info, error):
            log = trainer.get_extension('LogReport').log
            accs = [e['validation/main/accuracy'] for e in log
                    if 'validation/main/accuracy' in e]
            train_loss = TR.last(log, 'main/loss')
            test_loss = TR.last(log, 'validation/main/loss')
            if error is None and not (TR.finite(train_loss) and
                                      TR.finite(test_loss)):
                error = 'non-finite loss at the end (train {}, test ' \
                    '{})'.format(train_loss, test_loss)
            TR.summarize(info, trainer, updater, scaling, error,
                         lambda diverged: [
                             ('final_test_accuracy', None if diverged else
                              TR.last(log, 'validation/main/accuracy')),
                             ('best_test_accuracy', None if diverged or
                              not accs else max(accs)),
                             ('final_test_loss', test_loss),
                             ('final_train_loss', train_loss)])

        return TR.run_trainer(trainer, updater, info, folder, finalize,
                              log_cfg, comm, threads=cfg.blas_threads)

    def write_tables(self, cfg, out, quiet=False):
        results = os.path.join(out, cfg.table)
        return T.write_table(build_table(R.find_runs(results)), results,
                             'table2', quiet)


# -- the table ---------------------------------------------------------------
COLUMNS = (('FP32', 'fp32'), ('None', 'none'), ('Fixed (128)', 'fixed'),
           ('Dynamic', 'dynamic'), ('Adaptive', 'adaptive'))


def build_table(runs):
    """Table 2: rows ResNet-18/50, top-1 (%) per mode; the Fixed column
    shows the fixed scale(s) found (the paper's is 128)."""
    rows, cells = [], []
    for model in sorted({r['model'] for r in runs}):
        mine = [r for r in runs if r['model'] == model]
        row = {}
        for column, name in COLUMNS:
            sel = [r for r in mine if r['mode_name'] == name]
            scales = sorted({r['mode_options'].get('scale') for r in sel
                             if name == 'fixed'})
            row[column] = T.CellStats(
                sel, scale=scales[0] if len(scales) == 1 else None)
        means = [round(s.mean, 2) for s in row.values() if s.mean is not None]
        top = max(means) if means else None
        label = {'resnet18': 'ResNet-18', 'resnet50': 'ResNet-50'}.get(
            model, model)
        rows.append([label] + [row[c].text(bold=row[c].mean is not None and
                                           round(row[c].mean, 2) == top)
                               for c, _ in COLUMNS])
        cells += [('imagenet', model, c, row[c]) for c, _ in COLUMNS]
    counts = collections.Counter(r.get('status') for r in runs)
    footer = '{} runs ({}); top-1 on the ILSVRC2012 validation set; ' \
        '"diverged" = all runs of the cell diverged.'.format(
            len(runs), ', '.join('{} {}'.format(v, k) for k, v in
                                 sorted(counts.items())) or 'none')
    return T.Table('Table 2: ImageNet top-1 accuracy (%)',
                   ['Model'] + [c for c, _ in COLUMNS], rows, cells, footer)


#: the one instance the entries run
STUDY = ImageNetStudy()
