"""Short recorded trainings that produce the paper's Figures 1 and 4 and the
σ_max ratio of §4.2, on the one run path (``experiments/figures.py``).

A cell is one run of the profile's ``modes`` (run name -> mode), all with
the same seed, data order and initialization:

* ``fig1`` (``fp32``): per-layer underflow rate and expected loss scale of
  FP32 activation gradients (Fig. 1);
* ``fixed`` (``fixed:128``) and ``adaptive``, both mixed16: the per-layer
  adaptive loss scales (Fig. 4a), the FP16 underflow difference (Fig. 4b)
  and the σ_max ratio (§4.2).

Every run is a run on Chainer's Trainer with ``log.record_every``
(:func:`ada_loss.experiment.optimization.make_scaling`: a
:class:`~ada_loss.analysis.recorder.RecordingLossScaling`), resumable from
its snapshot; it writes ``records.csv`` (as it goes), ``run.json``, the log
and the snapshot into ``<out>/<table>/<run>/``. The
figures (``fig1.png``, ``fig4a.png``, ``fig4b.png``) and ``summary.json`` go
to ``<out>/<table>/``. The tasks are classification (digits, or ImageNet with
ResNet-18/50) and detection (VOC with SSD).

A config file holds the settings at its top level and/or named partial
settings under ``profiles``; ``profile`` (``--set profile=NAME``) picks one,
merged over the top level; ``--set`` applies last, so it wins::

    profile: digits
    profiles:
      digits: {model: plain_cnn, iterations: 30, ...}
"""
import collections
import dataclasses
import json
import os
from typing import Dict, Literal, Optional

import chainer

from ada_loss import atomic
from ada_loss.analysis import plots
from ada_loss.analysis.recorder import load_csv
from ada_loss.datasets import get_digits
from ada_loss.datasets.imagenet import get_imagenet_datasets
from ada_loss.datasets.voc import get_voc_detection_train, resolve_voc_root
from ada_loss.detection import MultiboxTrainChain, SSDTrainTransform
from ada_loss.detection import build_ssd, setup_ssd_optimizer
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import recipe as RC
from ada_loss.experiment import iterators
from ada_loss.experiment import settings
from ada_loss.experiment.config import setting
from ada_loss.models import build_model
from ada_loss.training import Classifier
from ada_loss.training import dtype_config
from ada_loss.training import setup_optimizer
from ada_loss.training.hooks import add_weight_decay
from ada_loss.training.triggers import StopAt


@dataclasses.dataclass
class Settings:
    """The settings of one profile."""
    table: str = setting('figures', 'results subfolder: <out>/<table>/')
    task: Literal['classification', 'detection'] = setting(
        'classification', 'what is trained')
    dataset: Literal['digits', 'imagenet', 'voc'] = setting(
        'digits', 'training data')
    data_root: Optional[str] = setting(
        None, 'dataset folder (null: $ADA_LOSS_IMAGENET_ROOT / '
        '$ADA_LOSS_VOC_ROOT)')
    model: str = setting('plain_cnn', 'an ada_loss.models name, or ssd512 '
                         '| ssd300 | ssd_tiny')
    model_kwargs: dict = setting({'in_channels': 1, 'depth': 8, 'width': 16},
                                 'keyword arguments of the model')
    num_classes: int = setting(10, 'classes (classification)', minimum=1)
    image_size: int = setting(16, 'input side (digits, imagenet crops)',
                              minimum=4)
    batch_size: int = setting(32, 'minibatch size', minimum=1)
    iterations: int = setting(20, 'training iterations of each run',
                              minimum=1)
    record_every: int = setting(5, 'statistics at iteration 1 and every '
                                'K-th', minimum=1)
    snapshot_every: int = setting(100, 'snapshot every K iterations (and '
                                  'at the end): --resume continues there',
                                  minimum=1)
    lr: float = setting(0.01, 'learning rate', positive=True)
    momentum: float = setting(0.9, 'MomentumSGD momentum', minimum=0.0)
    weight_decay: float = setting(1e-4, 'weight decay', minimum=0.0)
    seed: int = setting(0, 'random seed', minimum=0)
    precision: Optional[C.PrecisionName] = settings.precision_setting()
    photometric: bool = setting(True, 'detection: photometric distortion')
    modes: Dict[str, C.Mode] = setting(
        {'fig1': 'fp32', 'fixed': 'fixed:128', 'adaptive': 'adaptive'},
        "run name -> loss-scaling mode; 'fig1' (FP32) gives Fig. 1, 'fixed' "
        "+ 'adaptive' Fig. 4a/4b and the sigma_max ratio")

    def check(self):
        """Every mode builds in the precision."""
        settings.check_modes_build([('modes.' + run, mode)
                                    for run, mode in self.modes.items()],
                                   [self.precision])


@dataclasses.dataclass
class FileConfig(Settings):
    """A figures config file: settings, and profiles of partial settings."""
    profile: Optional[str] = setting(None, 'the profile of `profiles` to run '
                                     '(null: the top-level settings)')
    profiles: Dict[str, dict] = setting({}, 'name -> partial settings (keys '
                                        'as the top level)')

    def check(self):
        """Nothing: the settings of the profile (merged) are checked."""


def load_config(path=None, overrides=(), profile=None):
    """The checked :class:`Settings` of ``profile`` (default: the file's
    ``profile``) with ``overrides`` (``key=value``, value parsed as YAML)
    applied last. Raises ConfigError."""
    raw = C.read_yaml(path) if path else {}
    raw = C.apply_overrides(raw, overrides)
    full = C.from_dict(FileConfig, raw)      # types of the top level
    name = profile or full.profile
    settings = {k: v for k, v in raw.items()
                if k not in ('profile', 'profiles')}
    if name is None:
        return C.from_dict(Settings, settings)
    if name not in full.profiles:
        raise C.ConfigError('profile', '{!r} is not in profiles; available: '
                            '{}'.format(name, ', '.join(full.profiles) or
                                        '-'))
    partial = full.profiles[name] or {}
    if not isinstance(partial, dict):
        raise C.ConfigError('profiles.' + name, 'expected a mapping')
    settings.update(partial)
    settings.setdefault('table', 'figures/{}'.format(name))
    settings = C.apply_overrides(settings, [
        o for o in overrides
        if C.parse_override(o)[0][0] not in ('profile', 'profiles')])
    return C.from_dict(Settings, settings, 'profiles.{}.'.format(name))


def _classification_data(cfg):
    if cfg.dataset == 'digits':
        train, _ = get_digits(size=cfg.image_size, seed=cfg.seed)
    elif cfg.dataset == 'imagenet':
        train, _ = get_imagenet_datasets(cfg.data_root)
    else:
        raise ValueError('classification dataset must be digits or '
                         'imagenet, got {!r}'.format(cfg.dataset))
    return train


def _detection_data(cfg):
    if cfg.dataset != 'voc':
        raise ValueError('detection dataset must be voc, got {!r}'.format(
            cfg.dataset))
    return get_voc_detection_train(resolve_voc_root(cfg.data_root))


def log_of(cfg):
    """The log section of a figures run: a log line per iteration (the
    losses of ``summary.json``), a snapshot every ``snapshot_every``
    iterations and at the end, the gradient records every
    ``record_every``; nothing on the console, no PNGs but the figures."""
    return settings.Log(log_interval=[1, 'iteration'],
                        eval_interval=[cfg.iterations, 'iteration'],
                        snapshot_interval=[cfg.snapshot_every, 'iteration'],
                        progress='none', plot=False,
                        record_every=cfg.record_every)


FigureRun = collections.namedtuple('FigureRun', ('run', 'mode'))


class FiguresStudy(RC.TrainingStudy):
    """Figures 1 and 4: one recorded run per mode of the profile."""
    Config = Settings
    Cell = FigureRun
    help_notes = ['', 'a config file may also hold `profile` and `profiles` '
                  '(name -> partial settings); --set profile=NAME picks one']

    def load_config(self, path, overrides):
        return load_config(path, overrides)

    def cells(self, cfg):
        return [FigureRun(run, mode) for run, mode in cfg.modes.items()]

    def run_name(self, cfg, cell):
        return cell.run

    # -- the recipe's hooks (ada_loss.experiment.recipe): one recorded run
    # (log_of), resumable from its snapshot, records.csv written as it goes;
    # no evaluation, no learning-rate schedule
    history = None
    print_keys = plots = ()
    scaling_summary = None
    records_epoch = False

    def setup(self, cfg, cell, comm=None):
        return RC.Run(cfg=cfg, cell=cell, config=cfg, mode=cell.mode,
                      precision=RC.run_precision(cell.mode, cfg.precision),
                      seed=cfg.seed,
                      log=log_of(cfg))

    def run_fields(self, run):
        return [('name', run.cell.run), ('table', run.cfg.table),
                ('mode', str(run.mode)), ('precision', str(run.precision))]

    def preload(self, cfg, cells):
        """The training data (missing files fail here, with one error
        line, before any run folder is made)."""
        if not cells:
            return None
        return {'train': _detection_data(cfg) if cfg.task == 'detection'
                else _classification_data(cfg)}

    def load_data(self, run, cache):
        if cache:
            return cache['train']
        if run.cfg.task == 'detection':
            return _detection_data(run.cfg)
        return _classification_data(run.cfg)

    def model(self, run, data):
        cfg = run.cfg
        if cfg.task == 'detection':
            return MultiboxTrainChain(build_ssd(cfg.model, 20,
                                               run.precision, seed=run.seed))
        with dtype_config(run.precision):
            predictor = build_model(cfg.model, cfg.num_classes,
                                    **(cfg.model_kwargs or {}))
        return Classifier(predictor, run.precision, run.seed)

    def datasets(self, run, data, model):
        if run.cfg.task == 'detection':
            ssd = model.model
            data = chainer.datasets.TransformDataset(data, SSDTrainTransform(
                ssd.coder, ssd.insize, ssd.mean,
                photometric=run.cfg.photometric))
        return data, None

    def optimizer(self, run, model):
        cfg = run.cfg
        if cfg.task == 'detection':
            return setup_ssd_optimizer(model, cfg.lr, cfg.momentum,
                                       cfg.weight_decay, run.precision)
        optimizer = chainer.optimizers.MomentumSGD(cfg.lr, cfg.momentum)
        setup_optimizer(optimizer, model, run.precision)
        add_weight_decay(model, cfg.weight_decay)
        return optimizer

    def batchsize(self, run):
        return run.cfg.batch_size

    def iterators(self, run, train, test, batchsize):
        return iterators.make_iterator(train, batchsize), None

    def stop(self, run):
        return StopAt(iterations=run.cfg.iterations)

    def evaluator(self, run, model, test, test_iter):
        return None

    def metrics(self, run, trainer, updater, diverged):
        log = trainer.get_extension('LogReport').log
        return [('iterations_done', updater.iteration),
                ('diverged', run.error or False),
                ('losses', [float(e['main/loss']) for e in log
                            if 'main/loss' in e])]

    def write_tables(self, cfg, out, quiet=False, train=True):
        return make_figures(cfg, os.path.join(out, cfg.table), quiet)


def make_figures(cfg, folder, quiet=False):
    """From the runs' records under ``folder``: ``fig1.png``, ``fig4a.png``,
    ``fig4b.png`` and ``summary.json`` (σ_max ratio, run infos). Returns the
    paths."""
    records, infos = {}, {}
    for run in cfg.modes:
        info = R.read_run(os.path.join(folder, run))
        path = os.path.join(folder, run, 'records.csv')
        if info and os.path.exists(path):
            records[run] = load_csv(path)
            infos[run] = {k: info.get(k) for k in (
                'mode', 'precision', 'iterations_done', 'diverged',
                'losses')}
    name = '{} on {}'.format(cfg.model, cfg.dataset)
    paths = {}
    if 'fig1' in records:
        paths['fig1'] = plots.plot_fig1(
            records['fig1'], os.path.join(folder, 'fig1.png'),
            'Fig. 1: activation gradients, {} ({})'.format(
                name, cfg.modes['fig1']))
    summary = {'config': C.to_dict(cfg), 'runs': infos}
    if 'adaptive' in records:
        fixed_mode = cfg.modes.get('fixed')
        fixed_scale = (fixed_mode.options['scale'] if fixed_mode is not None
                       and fixed_mode.name == 'fixed' else None)
        paths['fig4a'] = plots.plot_fig4a(
            records['adaptive'], os.path.join(folder, 'fig4a.png'),
            fixed_scale, 'Fig. 4a: loss scale of each layer, {}'.format(name))
        if 'fixed' in records:
            paths['fig4b'] = plots.plot_fig4b(
                records['fixed'], records['adaptive'],
                os.path.join(folder, 'fig4b.png'),
                'Fig. 4b: Δ underflow ({} - adaptive), {}'.format(
                    fixed_mode, name))
            summary['sigma_max'] = plots.sigma_max_ratio(
                records['fixed'], records['adaptive'])
            summary['underflow_delta'] = [
                {'layer_id': i, 'layer': n, 'delta_percent': d}
                for i, n, d in plots.underflow_delta(records['fixed'],
                                                     records['adaptive'])]
    paths['summary'] = os.path.join(folder, 'summary.json')
    atomic.write_text(paths['summary'], json.dumps(
        summary, indent=2, default=str, allow_nan=True))
    if not quiet:
        for key, path in sorted(paths.items()):
            print('{}: {}'.format(key, path))
        if 'sigma_max' in summary:
            print('sigma_max fixed / adaptive = {ratio:.4g} '
                  '({sigma_max_fixed:.4g} / {sigma_max_adaptive:.4g})'.format(
                      **summary['sigma_max']))
    return paths


#: the one instance the entry runs
STUDY = FiguresStudy()
