"""The settings every training study's config shares: the ``log`` section
(:class:`Log`, and :func:`log_setting` for a study's other defaults),
``train.precision`` (:func:`precision_setting`; every mode must build in
every precision it runs in, :func:`check_modes_build`) and ``device``
(:func:`device_setting`)."""
import dataclasses
from typing import Literal, Optional

from ada_loss.experiment import config as C
from ada_loss.experiment.config import setting
from ada_loss.scaling import make_loss_scaling, resolve_precision


@dataclasses.dataclass
class Log:
    """The ``log`` section of every training study: how often a run logs,
    evaluates and writes its snapshot, and what it shows
    (:func:`extend_trainer`). A study with other units or intervals
    subclasses it with other defaults (:func:`log_setting`)."""
    log_interval: C.Interval = setting([1, 'epoch'], 'LogReport / log.csv '
                                       '/ PrintReport / PlotReport interval')
    eval_interval: C.Interval = setting([1, 'epoch'], 'evaluation interval '
                                        '(also at the end)')
    snapshot_interval: C.Interval = setting([1, 'epoch'], 'trainer snapshot '
                                            'interval (also at the end)')
    loss_scale_interval: int = setting(100, 'layer-wise modes: record '
                                       'per-layer loss scales '
                                       '(loss_scales.csv) every K '
                                       'iterations', minimum=1)
    progress: Literal['report', 'bar', 'both', 'none'] = setting(
        'report', 'console output of a run: PrintReport, ProgressBar, both '
        'or none')
    plot: bool = setting(True, "PlotReport PNGs of the study's curves and, "
                         'for layer-wise modes, loss_scales.png')
    probe_every: Optional[int] = setting(
        None, 'probe every GEMM layer at step 1 and every K steps '
        '(underflow, overflow, bounds, errors; ada_loss/analysis/'
        'gemm_probe.py) into probe.csv; null: off', minimum=1)
    record_every: Optional[int] = setting(
        None, "record every GEMM layer's activation-gradient statistics "
        '(the paper\'s Fig. 1 and 4; ada_loss/analysis/recorder.py) at '
        'step 1 and every K steps into records.csv; null: off', minimum=1)
    tensorboard: bool = setting(
        True, 'TensorBoard event files in the run folder (ada_loss/training/'
        'tensorboard.py): every logged key, alpha/<layer> at '
        'loss_scale_interval, the observers\' per-layer rates and log2|g| '
        'histograms, the settings as HParams; false: off')

    def check(self):
        if self.probe_every is not None and self.record_every is not None:
            raise C.ConfigError('log.record_every', 'expected null while '
                                'log.probe_every is set (one observer of '
                                'the backward per run)')


def log_setting(key, default):
    """The :class:`Log` setting ``key`` with another default (its doc and
    constraints kept), for a subclass::

        @dataclasses.dataclass
        class SSDLog(Log):
            log_interval: C.Interval = log_setting('log_interval',
                                                   [100, 'iteration'])
    """
    meta = dict(Log.__dataclass_fields__[key].metadata)
    return setting(default, meta.pop('doc'), **meta)


def precision_setting():
    """The ``train.precision`` setting of every training study: a precision
    of :mod:`ada_loss.precision`, null for the mode's default (float32 for
    ``fp32``, mixed16 for every other mode); checked against the modes by
    :func:`check_modes_build`."""
    return setting(None, 'which format stores what in training (null: '
                   'float32 for fp32, mixed16 for every other mode)')


def device_setting():
    """The top-level ``device`` setting of a training study's config (a
    :class:`~ada_loss.experiment.config.Device`, null for the CPU), read by
    :meth:`TrainingStudy.run` and checked by :func:`check_device_config`
    (what a device run cannot do) and :func:`training_device` (CuPy and
    the GPU are there)."""
    return setting(None, "where every run trains: '@numpy' or null (the "
                   "CPU) or '@cupy:N' (GPU N; --set device=@cupy:0; "
                   'docs/gpu.md)')


def check_modes_build(modes, precisions):
    """Every mode builds in every precision it runs in
    (:func:`ada_loss.scaling.make_loss_scaling`): ``modes`` is ``[(key,
    mode)]``, ``key`` the config key named in the ConfigError (``fp32`` runs
    only in float32; a fixed scale must be below the gradient format's
    largest value; options must suit the mode)."""
    for key, mode in modes:
        try:
            for precision in precisions:
                make_loss_scaling(mode, resolve_precision(mode, precision))
        except ValueError as e:
            raise C.ConfigError(key, 'mode {}: {}'.format(mode, e))
