"""One SSD training run of Table 3 / Table 5 (paper §4.3, Appendix B).

The recipe is ChainerCV's SSD example (Liu et al. 2016): VOC07+12 trainval,
the SSD augmentation, MomentumSGD (0.9) at lr 1e-3 x0.1 at 80k and 100k of
120k iterations, weight decay 5e-4 (biases: 2x lr, no decay), evaluation on
VOC2007 test (11-point mAP, difficult objects ignored). Only the loss-scaling
mode (and the batch size: 8 or 32) changes between runs.

A run lives in ``<out>/<table>/<model>-b<batch>-<mode>-s<seed>/`` with the
harness's files (:mod:`ada_loss.experiment.runinfo`): ``run.json``
(``status`` running/finished/diverged, ``final_map``, ``best_map`` ...),
``config.yaml``, ``log``/``log.csv``, ``snapshot_latest`` (``--resume``),
``loss_scales.csv`` for adaptive. A run whose gradients overflow in a mode
that cannot skip steps, or whose final loss or mAP is not finite, is
``diverged``.
"""
import collections
import os
import random

import chainer
import numpy
import yaml
from chainer import training

from ada_loss.datasets.voc import VOC_LABEL_NAMES
from ada_loss.datasets.voc import get_voc_detection_test
from ada_loss.datasets.voc import get_voc_detection_train
from ada_loss.datasets.voc import resolve_voc_root
from ada_loss.detection.evaluation import make_voc_evaluator
from ada_loss.detection.model import build_ssd
from ada_loss.detection.ssd_train_chain import MultiboxTrainChain
from ada_loss.detection.ssd_train_chain import setup_ssd_optimizer
from ada_loss.detection.transforms import SSDTrainTransform
from ada_loss.experiment import trainer as harness
from ada_loss.experiment.grid import mode_slug
from ada_loss.scaling import make_loss_scaling
from ada_loss.scaling import parse_mode
from ada_loss.scaling import resolve_precision
from ada_loss.training import extensions as AE
from ada_loss.training.triggers import StopAt

#: One run: model name, batch size, loss-scaling mode, seed.
SSDCell = collections.namedtuple('SSDCell',
                                 ('model', 'batchsize', 'mode', 'seed'))

PRINT_KEYS = ['iteration', 'main/loss', 'main/loss/loc', 'main/loss/conf',
              'validation/main/map', 'lr', 'loss_scale', 'skipped_steps',
              'elapsed_time']


def ssd_run_name(cell):
    return '{}-b{}-{}-s{}'.format(cell.model, cell.batchsize,
                                  mode_slug(cell.mode), cell.seed)


class IterationStepLR(AE.StepLearningRate):
    """``lr * decay ** k``, k = number of ``steps`` (iterations) reached;
    stateless, so resuming continues with the right value."""

    def value(self, iteration, epoch_detail):
        return self.lr * self.decay ** sum(1 for s in self.steps
                                           if iteration >= s)


def run_ssd(cfg, cell, out_root, resume=False, comm=None):
    """Trains one SSD cell; writes and returns its ``run.json`` dict.

    Args:
        cfg (dict): validated config (``experiments/table3_ssd.py``):
            sections ``data``, ``model``, ``train``, ``log``.
        cell (SSDCell): model, batch size, mode, seed.
        out_root (str): the run goes to ``<out_root>/<table>/<name>/``.
        resume (bool): continue from ``snapshot_latest`` if present.
        comm: a ChainerMN communicator (data parallel), or None.
    """
    data_cfg, train_cfg, log_cfg = cfg['data'], cfg['train'], cfg['log']
    spec = parse_mode(cell.mode)
    dtype = resolve_precision(cell.mode)
    name = ssd_run_name(cell)
    folder = os.path.join(out_root, cfg['table'], name)
    info, resuming = harness.open_run(folder, [
        ('name', name), ('table', cfg['table']), ('model', cell.model),
        ('dataset', 'voc0712'), ('batchsize', cell.batchsize),
        ('mode', str(spec)), ('mode_name', spec.name),
        ('mode_options', spec.options), ('seed', cell.seed),
        ('precision', dtype)], cfg.get('description', ''),
        yaml.safe_dump({'run': dict(cell._asdict(), precision=dtype),
                        **{k: v for k, v in cfg.items() if k != 'grid'}},
                       sort_keys=False), resume, comm)

    random.seed(cell.seed)
    numpy.random.seed(cell.seed)
    root = resolve_voc_root(data_cfg['voc_root'])
    model = build_ssd(cell.model, len(VOC_LABEL_NAMES), dtype,
                      cfg['model']['pretrained_model'], initialize=True)
    chain = MultiboxTrainChain(model, alpha=train_cfg['loc_weight'],
                               k=train_cfg['neg_pos_ratio'])
    transform = SSDTrainTransform(model.coder, model.insize, model.mean,
                                  photometric=data_cfg['photometric'])
    train = chainer.datasets.TransformDataset(
        harness.subset(get_voc_detection_train(root),
                       data_cfg['train_size'], cell.seed), transform)
    test = harness.subset(get_voc_detection_test(root),
                          data_cfg['test_size'], cell.seed + 1)
    optimizer = setup_ssd_optimizer(
        chain, train_cfg['lr'], train_cfg['momentum'],
        train_cfg['weight_decay'], dtype, comm)

    train, _, batchsize = harness.scatter(train, None, cell.batchsize, comm,
                                          cell.seed, 'batch size')
    seed = harness.iterator_seed(cell.seed, comm)
    train_iter = harness.make_iterator(train, batchsize,
                                       data_cfg['loaderjobs'], seed=seed)
    test_iter = harness.make_iterator(test, train_cfg['eval_batchsize'], 0,
                                      repeat=False, shuffle=False, seed=seed)

    scaling = make_loss_scaling(cell.mode, dtype)
    updater = harness.make_updater(train_iter, optimizer, scaling, spec,
                                   comm, os.path.join(folder, 'scaling.txt'))

    stop = StopAt(iterations=train_cfg['iterations'])
    trainer = training.Trainer(updater, stop, out=folder)

    evaluator = make_voc_evaluator(test, model, train_cfg['eval_batchsize'])
    evaluator._iterators['main'] = test_iter
    if comm is not None:
        evaluator.comm = comm
    harness.extend_trainer(
        trainer, stop, log_cfg, evaluator,
        IterationStepLR(train_cfg['lr'], train_cfg['lr_steps'],
                        train_cfg['lr_decay'], optimizer=optimizer),
        optimizer, scaling, resuming, comm,
        reporters=lambda every: harness.print_report(PRINT_KEYS, every,
                                                     log_cfg['progress']))

    def finalize(info, error):
        log = trainer.get_extension('LogReport').log
        maps = [e['validation/main/map'] for e in log
                if harness.finite(e.get('validation/main/map'))]
        train_loss = harness.last(log, 'main/loss')
        final_map = harness.last(log, 'validation/main/map')
        if error is None and not (harness.finite(train_loss) and
                                  harness.finite(final_map)):
            error = 'non-finite loss or mAP at the end (train loss {}, ' \
                'mAP {})'.format(train_loss, final_map)
        harness.summarize(
            info, trainer, updater, scaling, error, lambda diverged: [
                ('final_map', None if diverged else final_map),
                ('best_map', None if diverged or not maps else max(maps)),
                ('last_map', final_map), ('final_train_loss', train_loss)],
            epoch=False)

    return harness.run_trainer(trainer, updater, info, folder, finalize,
                               comm, threads=harness.blas_threads(cfg))
