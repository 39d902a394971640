"""Short recorded trainings that produce the paper's Figures 1 and 4.

Three runs with the same seed, data order and initialization:

* ``fig1`` mode (``fp32``): per-layer underflow rate and expected loss scale
  of FP32 activation gradients (Fig. 1);
* ``fixed`` mode (``fixed:128``) and ``adaptive`` mode, both mixed16: the
  per-layer adaptive loss scales (Fig. 4a), the FP16 underflow difference
  (Fig. 4b) and the σ_max ratio (§4.2).

Every run is a plain loop of :class:`ada_loss.training.MixedPrecisionUpdater`
steps with a :class:`RecordingLossScaling`. The tasks are classification
(digits, or ImageNet with ResNet-18/50) and detection (VOC with SSD).
"""
import functools
import json
import os
import random

import chainer
import numpy

from ada_loss import atomic
from ada_loss.analysis import plots
from ada_loss.analysis.recorder import GradientRecorder
from ada_loss.analysis.recorder import RecordingLossScaling
from ada_loss.scaling import AdaptiveScaling
from ada_loss.scaling import NonFiniteGradientError
from ada_loss.scaling import make_loss_scaling
from ada_loss.scaling import resolve_precision
from ada_loss.training import Classifier
from ada_loss.training import MixedPrecisionUpdater
from ada_loss.training import dtype_config
from ada_loss.training import setup_optimizer
from ada_loss.training.hooks import add_weight_decay

#: Defaults of a figure configuration (configs/figures.yaml overrides).
DEFAULTS = {
    'task': 'classification',     # classification | detection
    'dataset': 'digits',          # digits | imagenet | voc
    'data_root': None,
    'model': 'plain_cnn',
    'model_kwargs': {'in_channels': 1, 'depth': 8, 'width': 16},
    'num_classes': 10,
    'image_size': 16,
    'batch_size': 32,
    'iterations': 20,
    'record_every': 5,
    'lr': 0.01,
    'momentum': 0.9,
    'weight_decay': 1e-4,
    'seed': 0,
    'photometric': True,
    'modes': {'fig1': 'fp32', 'fixed': 'fixed:128', 'adaptive': 'adaptive'},
    'out': 'results/figures',
}


def _seed(seed):
    random.seed(seed)
    numpy.random.seed(seed)


def _classification(cfg, mode, dtype):
    from ada_loss.models import build_model
    if cfg['dataset'] == 'digits':
        from ada_loss.datasets import get_digits
        train, _ = get_digits(size=cfg['image_size'], seed=cfg['seed'])
    elif cfg['dataset'] == 'imagenet':
        from ada_loss.datasets.imagenet import get_imagenet_datasets
        train, _ = get_imagenet_datasets(cfg['data_root'])
    else:
        raise ValueError('classification dataset must be digits or '
                         'imagenet, got {!r}'.format(cfg['dataset']))
    with dtype_config(dtype):
        predictor = build_model(cfg['model'], cfg['num_classes'],
                                **(cfg.get('model_kwargs') or {}))
    chain = Classifier(predictor, dtype)
    optimizer = chainer.optimizers.MomentumSGD(cfg['lr'], cfg['momentum'])
    setup_optimizer(optimizer, chain, dtype)
    add_weight_decay(chain, cfg['weight_decay'])
    return train, chain, optimizer


def _detection(cfg, mode, dtype):
    from ada_loss.datasets.voc import get_voc_detection_train
    from ada_loss.datasets.voc import resolve_voc_root
    from ada_loss.detection import MultiboxTrainChain, SSDTrainTransform
    from ada_loss.detection import build_ssd, setup_ssd_optimizer
    if cfg['dataset'] != 'voc':
        raise ValueError('detection dataset must be voc, got {!r}'.format(
            cfg['dataset']))
    model = build_ssd(cfg['model'], 20, dtype)
    train = chainer.datasets.TransformDataset(
        get_voc_detection_train(resolve_voc_root(cfg['data_root'])),
        SSDTrainTransform(model.coder, model.insize, model.mean,
                          photometric=cfg['photometric']))
    chain = MultiboxTrainChain(model)
    optimizer = setup_ssd_optimizer(chain, cfg['lr'], cfg['momentum'],
                                    cfg['weight_decay'], dtype)
    return train, chain, optimizer


def run_recorded(cfg, mode):
    """Trains ``cfg['iterations']`` steps in ``mode`` while recording.

    Returns:
        (records, info): the recorder's rows and ``{'mode', 'dtype',
        'iterations_done', 'diverged', 'losses'}``.
    """
    _seed(cfg['seed'])
    dtype = resolve_precision(mode)
    build = _detection if cfg['task'] == 'detection' else _classification
    train, chain, optimizer = build(cfg, mode, dtype)
    iterator = chainer.iterators.SerialIterator(train, cfg['batch_size'])
    inner = make_loss_scaling(mode, dtype)
    if isinstance(inner, AdaptiveScaling):
        inner.bind = functools.partial(inner.bind, verbose=False)
    scaling = RecordingLossScaling(inner, GradientRecorder(),
                                   cfg['record_every'])
    updater = MixedPrecisionUpdater(iterator, optimizer, scaling, mode)
    info = {'mode': mode, 'dtype': dtype, 'iterations_done': 0,
            'diverged': False, 'losses': []}
    reporter = chainer.Reporter()
    reporter.add_observer('main', chain)
    reporter.add_observers('main', chain.namedlinks(skipself=True))
    for _ in range(cfg['iterations']):
        observation = {}
        try:
            with reporter.scope(observation):
                updater.update()
        except NonFiniteGradientError as e:
            info['diverged'] = str(e)
            break
        info['iterations_done'] += 1
        loss = observation.get('main/loss')
        info['losses'].append(float(getattr(loss, 'array', loss)))
    return scaling.recorder.records, info


def make_figures(cfg):
    """Runs the three recorded trainings and writes, under ``cfg['out']``:
    ``records_<run>.csv``, ``fig1.png``, ``fig4a.png``, ``fig4b.png`` and
    ``summary.json`` (σ_max ratio, run infos). Returns the paths."""
    cfg = dict(DEFAULTS, **cfg)
    out = cfg['out']
    os.makedirs(out, exist_ok=True)
    records, infos = {}, {}
    for run, mode in cfg['modes'].items():
        recs, info = run_recorded(cfg, mode)
        rec = GradientRecorder()
        rec.records = recs
        rec.save_csv(os.path.join(out, 'records_{}.csv'.format(run)))
        records[run], infos[run] = recs, info
    name = '{} on {}'.format(cfg['model'], cfg['dataset'])
    paths = {}
    if 'fig1' in records:
        paths['fig1'] = plots.plot_fig1(
            records['fig1'], os.path.join(out, 'fig1.png'),
            'Fig. 1: activation gradients, {} ({})'.format(
                name, cfg['modes']['fig1']))
    summary = {'config': cfg, 'runs': infos}
    if 'adaptive' in records:
        fixed_mode = cfg['modes'].get('fixed', '')
        fixed_scale = (float(fixed_mode.split(':', 1)[1])
                       if fixed_mode.startswith('fixed:') else None)
        paths['fig4a'] = plots.plot_fig4a(
            records['adaptive'], os.path.join(out, 'fig4a.png'), fixed_scale,
            'Fig. 4a: loss scale of each layer, {}'.format(name))
        if 'fixed' in records:
            paths['fig4b'] = plots.plot_fig4b(
                records['fixed'], records['adaptive'],
                os.path.join(out, 'fig4b.png'),
                'Fig. 4b: Δ underflow ({} - adaptive), {}'.format(
                    fixed_mode, name))
            summary['sigma_max'] = plots.sigma_max_ratio(
                records['fixed'], records['adaptive'])
            summary['underflow_delta'] = [
                {'layer_id': i, 'layer': n, 'delta_percent': d}
                for i, n, d in plots.underflow_delta(records['fixed'],
                                                     records['adaptive'])]
    paths['summary'] = os.path.join(out, 'summary.json')
    atomic.write_text(paths['summary'], json.dumps(
        summary, indent=2, default=str, allow_nan=True))
    return paths
