#!/usr/bin/env python
"""Table 2 of the paper: ResNet-18/50 on ILSVRC2012, top-1 (%) per mode.

    python experiments/table2_imagenet.py \\
        --config configs/table2_imagenet.yaml \\
        [--only model=resnet18,mode=adaptive,seed=0] [--set train.epochs=1] \\
        [--out results] [--resume] [--force] [--mpi] [--list] [--table-only]

§4.2: the training method of He et al. (2016) in its common large-batch
form (Goyal et al. 2017): 90 epochs, MomentumSGD 0.9, lr 0.1 * B / 256 with
a linear warm-up over the first 5 epochs, x0.1 at epochs 30, 60 and 80,
weight decay 1e-4; random-resized crops + flips, 224x224 center crops of
256-resized images for evaluation. Only the loss-scaling mode changes:
FP32 | None | Fixed (128) | Dynamic | Adaptive. Each cell is one run in
``<out>/<table>/<model>-imagenet-<mode>-s<seed>/`` with the harness's files
(``run.json``: status finished/diverged, ``final_test_accuracy`` = top-1 on
the validation set ...). The table goes to ``<out>/<table>/table2.md``.
Under ``mpiexec -n P`` with ``--mpi`` every run is data-parallel (ChainerMN;
``train.batchsize`` is global).
"""
import argparse
import collections
import contextlib
import copy
import datetime
import io
import math
import os
import random
import shutil
import sys

import chainer
import numpy
from chainer import training
from chainer.training import extensions as E

from ada_loss.datasets.imagenet import get_imagenet_datasets
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import tables as T
from ada_loss.experiment.grid import Cell, mode_sort_key, run_name
from ada_loss.experiment.run import build_optimizer
from ada_loss.models import build_model
from ada_loss.scaling import (NonFiniteGradientError, make_loss_scaling,
                              parse_mode, resolve_dtype)
from ada_loss.training import Classifier, MixedPrecisionUpdater, dtype_config
from ada_loss.training import extensions as AE
from ada_loss.training.triggers import IntervalOrEnd, StopAt


def _mode(default, doc):
    def check(value, key):
        try:
            return str(parse_mode(value))
        except ValueError as e:
            raise C.ConfigError(key, str(e))
    return C.Field(default, check, 'a loss-scaling mode', doc)


SCHEMA = {
    'table': C.string('table2_imagenet', 'results subfolder'),
    'description': C.string('', 'free text, copied to every run'),
    'distributed': C.boolean(False, 'ChainerMN data parallelism (--mpi)'),
    'grid': {
        'models': C.list_of(C.string(None, '', choices=('resnet18',
                                                        'resnet50')),
                            ['resnet18', 'resnet50'], 'ImageNet ResNets'),
        'modes': C.list_of(_mode(None, ''), ['fp32', 'none', 'fixed:128',
                                             'dynamic', 'adaptive'],
                           'loss-scaling modes'),
        'seeds': C.list_of(C.integer(None, '', minimum=0), [0], 'seeds'),
    },
    'data': {
        'imagenet_root': C.string(None, 'ILSVRC2012 root with train/ and '
                                  'val/ (null: $ADA_LOSS_IMAGENET_ROOT)',
                                  optional=True),
        'image_size': C.integer(224, 'crop size', minimum=8),
        'eval_resize': C.integer(256, 'shorter side before the center crop',
                                 minimum=8),
        'train_size': C.integer(None, 'random training subset', minimum=1,
                                optional=True),
        'test_size': C.integer(None, 'random validation subset', minimum=1,
                               optional=True),
        'loaderjobs': C.integer(0, 'data loading processes (0: serial)',
                                minimum=0),
    },
    'train': {
        'batchsize': C.integer(256, 'global minibatch size', minimum=1),
        'base_lr': C.number(0.1, 'lr for batch 256 (lr = base_lr * B/256)',
                            positive=True),
        'warmup_epochs': C.number(5, 'linear warm-up length', minimum=0.0),
        'lr_steps': C.list_of(C.number(None, '', positive=True),
                              [30, 60, 80], 'epochs where lr *= lr_decay',
                              nonempty=False),
        'lr_decay': C.number(0.1, 'lr multiplier', positive=True),
        'momentum': C.number(0.9, 'MomentumSGD momentum', minimum=0.0),
        'weight_decay': C.number(1e-4, 'L2 weight decay', minimum=0.0),
        'epochs': C.number(90, 'training length', positive=True),
        'max_iterations': C.integer(None, 'stop after this many iterations '
                                    '(mini runs)', minimum=1, optional=True),
        'eval_batchsize': C.integer(250, 'evaluation batch size', minimum=1),
    },
    'log': {
        'log_interval': C.interval('1 epoch', 'LogReport interval'),
        'eval_interval': C.interval('1 epoch', 'validation interval'),
        'snapshot_interval': C.interval('1 epoch', 'snapshot interval'),
        'loss_scale_interval': C.integer(100, 'adaptive: loss_scales.csv '
                                         'every K iterations', minimum=1),
        'progress': C.boolean(True, 'PrintReport to the console'),
    },
}

PRINT_KEYS = ['epoch', 'iteration', 'main/loss', 'validation/main/loss',
              'main/accuracy', 'validation/main/accuracy', 'lr',
              'loss_scale', 'skipped_steps', 'elapsed_time']


def validate(schema, raw, prefix=''):
    """Checks ``raw`` against ``schema`` (harness Fields), fills defaults."""
    raw = raw or {}
    if not isinstance(raw, dict):
        raise C.ConfigError(prefix.rstrip('.') or '<root>',
                            'expected a mapping')
    for key in raw:
        if key not in schema:
            raise C.ConfigError(prefix + str(key), 'unknown key; allowed: '
                                + ', '.join(sorted(schema)))
    return {key: validate(spec, raw.get(key), prefix + key + '.')
            if isinstance(spec, dict) else spec.check(
                raw[key] if key in raw else copy.deepcopy(spec.default),
                prefix + key)
            for key, spec in schema.items()}


def load_config(path, overrides=()):
    return validate(SCHEMA, C.apply_overrides(C.read_yaml(path), overrides))


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


def _subset(dataset, size, seed):
    if not size or size >= len(dataset):
        return dataset
    order = numpy.random.RandomState(seed).permutation(len(dataset))[:size]
    return chainer.datasets.SubDataset(dataset, 0, size, order=order)


def _iterator(dataset, batchsize, jobs, repeat=True, shuffle=True):
    if jobs:
        return chainer.iterators.MultiprocessIterator(
            dataset, batchsize, repeat=repeat, shuffle=shuffle,
            n_processes=jobs)
    return chainer.iterators.SerialIterator(dataset, batchsize,
                                            repeat=repeat, shuffle=shuffle)


def _last(log, key):
    for entry in reversed(log):
        if key in entry:
            return entry[key]
    return None


def _finite(x):
    return x is not None and math.isfinite(x)


def _now():
    return datetime.datetime.now().isoformat(timespec='seconds')


def run_imagenet(cfg, cell, out_root, resume=False, comm=None):
    """Trains one cell (model, 'imagenet', mode, seed); returns run.json."""
    data_cfg, train_cfg, log_cfg = cfg['data'], cfg['train'], cfg['log']
    spec = parse_mode(cell.mode)
    dtype = resolve_dtype(cell.mode)
    folder = os.path.join(out_root, cfg['table'], run_name(cell))
    writer = comm is None or comm.rank == 0
    resuming = resume and os.path.exists(os.path.join(folder, R.SNAPSHOT))
    old = R.read_run(folder) if resuming else None
    info = {
        'name': run_name(cell), 'table': cfg['table'], 'model': cell.model,
        'dataset': 'imagenet', 'mode': str(spec), 'mode_name': spec.name,
        'mode_options': spec.options, 'seed': cell.seed, 'dtype': dtype,
        'git_commit': R.git_commit(), 'status': R.RUNNING,
        'world_size': 1 if comm is None else comm.size,
        'started': (old or {}).get('started', _now()),
        'resumed': bool(resuming), 'description': cfg['description'],
    }
    if writer:
        if not resuming and os.path.isdir(folder):
            shutil.rmtree(folder)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, R.CONFIG_YAML), 'w') as f:
            f.write(C.dump_config(dict(
                {'run': dict(cell._asdict(), dtype=dtype)},
                **{k: v for k, v in cfg.items() if k != 'grid'})))
        R.write_run(folder, info)

    random.seed(cell.seed)
    numpy.random.seed(cell.seed)
    train, test = get_imagenet_datasets(data_cfg['imagenet_root'],
                                        data_cfg['image_size'],
                                        data_cfg['eval_resize'])
    num_classes = len(train._dataset.label_names)
    train = _subset(train, data_cfg['train_size'], cell.seed)
    test = _subset(test, data_cfg['test_size'], cell.seed + 1)
    with dtype_config(dtype):
        model = Classifier(build_model(cell.model, num_classes), dtype)
    batchsize = train_cfg['batchsize']
    lr = train_cfg['base_lr'] * batchsize / 256.0
    optimizer = build_optimizer(model, dtype, {
        'lr': lr, 'momentum': train_cfg['momentum'],
        'weight_decay': train_cfg['weight_decay']}, comm)
    iters_per_epoch = max(1, len(train) // batchsize)
    if comm is not None:
        import chainermn
        if batchsize % comm.size:
            raise ValueError('batchsize {} is not divisible by the {} ranks'
                             .format(batchsize, comm.size))
        batchsize //= comm.size
        train = chainermn.scatter_dataset(train, comm, shuffle=True,
                                          seed=cell.seed)
        test = chainermn.scatter_dataset(test, comm)
    train_iter = _iterator(train, batchsize, data_cfg['loaderjobs'])
    test_iter = _iterator(test, train_cfg['eval_batchsize'],
                          data_cfg['loaderjobs'], repeat=False, shuffle=False)

    scaling = make_loss_scaling(cell.mode)
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        if comm is None:
            updater = MixedPrecisionUpdater(train_iter, optimizer, scaling,
                                            mode=str(spec))
        else:
            from ada_loss.training import distributed
            updater = distributed.DistributedMixedPrecisionUpdater(
                train_iter, optimizer, scaling, comm, mode=str(spec))
            distributed.prime_multi_node_optimizer(optimizer, comm)
    stop = StopAt(epochs=train_cfg['epochs'],
                  iterations=train_cfg['max_iterations'])
    trainer = training.Trainer(updater, stop, out=folder)

    def every(key):
        n, unit = log_cfg[key]
        return IntervalOrEnd(n, unit, stop)

    evaluator = E.Evaluator(test_iter, model)
    if comm is not None:
        import chainermn
        evaluator = chainermn.create_multi_node_evaluator(evaluator, comm)
    trainer.extend(evaluator, name='validation',
                   trigger=every('eval_interval'))
    trainer.extend(WarmupStepLR(
        lr, train_cfg['lr_steps'], train_cfg['lr_decay'],
        int(round(train_cfg['warmup_epochs'] * iters_per_epoch)),
        optimizer=optimizer))
    trainer.extend(E.observe_lr(), trigger=(1, 'iteration'))
    trainer.extend(AE.FP32MasterWeights(optimizer))
    trainer.extend(E.snapshot(filename=R.SNAPSHOT, autoload=resuming),
                   trigger=every('snapshot_interval') if writer
                   else (lambda _: False))
    if writer:
        trainer.extend(E.LogReport(trigger=every('log_interval')))
        trainer.extend(AE.LogCSV(), trigger=every('log_interval'))
        if log_cfg['progress']:
            trainer.extend(E.PrintReport(PRINT_KEYS),
                           trigger=every('log_interval'))
        if hasattr(scaling, 'loss_scales'):
            trainer.extend(AE.LossScaleRecorder(
                scaling, interval=log_cfg['loss_scale_interval']))
    error = None
    try:
        trainer.run(show_loop_exception_msg=False)
    except NonFiniteGradientError as e:
        error = str(e)
    if not writer:
        return dict(info, status=R.DIVERGED if error else R.FINISHED)
    log = trainer.get_extension('LogReport').log
    accs = [e['validation/main/accuracy'] for e in log
            if 'validation/main/accuracy' in e]
    train_loss = _last(log, 'main/loss')
    test_loss = _last(log, 'validation/main/loss')
    if error is None and not (_finite(train_loss) and _finite(test_loss)):
        error = 'non-finite loss at the end (train {}, test {})'.format(
            train_loss, test_loss)
    diverged = error is not None
    info.update(
        status=R.DIVERGED if diverged else R.FINISHED,
        final_test_accuracy=None if diverged else _last(
            log, 'validation/main/accuracy'),
        best_test_accuracy=None if diverged or not accs else max(accs),
        final_test_loss=test_loss, final_train_loss=train_loss,
        skipped_steps=updater.skipped_steps, iterations=updater.iteration,
        epoch=updater.epoch_detail, wall_time_s=trainer.elapsed_time,
        loss_scale=scaling.scale, error=error, updated=_now())
    R.write_run(folder, info)
    return info


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


def write_table(results_dir, quiet=False):
    table = build_table(R.find_runs(results_dir))
    os.makedirs(results_dir, exist_ok=True)
    md = T.to_markdown(table)
    with open(os.path.join(results_dir, 'table2.md'), 'w') as f:
        f.write(md)
    with open(os.path.join(results_dir, 'table2.csv'), 'w') as f:
        f.write(T.to_csv(table))
    if not quiet:
        print(md)
    return table


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--config', default='configs/table2_imagenet.yaml')
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE')
    p.add_argument('--only', action='append', default=[],
                   help='model=..,mode=..,seed=.. (values joined by |)')
    p.add_argument('--out', default='results')
    p.add_argument('--resume', action='store_true')
    p.add_argument('--force', action='store_true')
    p.add_argument('--mpi', action='store_true')
    p.add_argument('--list', action='store_true')
    p.add_argument('--table-only', action='store_true')
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, args.set)
    except C.ConfigError as e:
        raise SystemExit('error: {}'.format(e))
    from ada_loss.experiment.grid import select
    g = cfg['grid']
    cells = [Cell(m, 'imagenet', mode, s) for s in g['seeds']
             for m in g['models']
             for mode in sorted(g['modes'], key=mode_sort_key)]
    try:
        cells = select(cells, args.only)
    except ValueError as e:
        raise SystemExit('error: {}'.format(e))
    results = os.path.join(args.out, cfg['table'])
    comm = None
    if args.mpi or cfg['distributed']:
        from ada_loss.training.distributed import create_communicator
        comm = create_communicator()
    for cell in cells:
        status = (R.read_run(os.path.join(results, run_name(cell))) or
                  {}).get('status', 'missing')
        if args.list:
            print('{:45s} {}'.format(run_name(cell), status))
            continue
        if args.table_only or (status in (R.FINISHED, R.DIVERGED)
                               and not args.force):
            continue
        run_imagenet(cfg, cell, args.out, resume=args.resume, comm=comm)
    if not args.list and (comm is None or comm.rank == 0):
        write_table(results)
    return 0


if __name__ == '__main__':
    sys.exit(main())
