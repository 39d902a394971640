"""Dynamic (backoff) loss scaling as three sources define it.

The state machines only: each is told after every step whether its gradients
overflowed (such a step is skipped by the caller) and gives the scale of the
next step. They differ in the start and in how fast they move, which matters
most in the first thousand steps (the paper's Table 3, batch 8):

=========== ================================================================
``pytorch`` PyTorch's ``torch.cuda.amp.GradScaler``, the default:
            start at 2^16; ×``backoff_factor`` (0.5) on every overflowing
            step; ×``growth_factor`` (2) after ``growth_interval`` (2000)
            consecutive clean steps. The scale is a float32 value; a growth
            that would make it non-finite is not applied; no lower clamp.
``chainer`` Chainer's own ``Optimizer.loss_scaling(interval=1000)`` (v6/v7,
            what the paper's "Dynamic" columns ran): start at 1; ×2 after
            every clean step until the first overflow ever, then
            ×2^(1/``interval``) per clean step; ×0.5 on overflow; clamped
            to [1, 65504] after every step (``Optimizer.update_loss_scale``).
``tf``      TensorFlow's ``ExponentialUpdateLossScaleManager`` as Huawei's
            Ascend guide *Loss Scaling* uses it: start at 2^32; ×``incr_ratio``
            (2) after ``incr_every_n_steps`` (1000) consecutive clean steps;
            ×``decr_ratio`` (0.5; TF's own default is 0.8) once
            ``decr_every_n_nan_or_inf`` (2) overflowing steps have
            *accumulated* since the last change (clean steps in between
            reset the clean count only); both counts reset whenever the
            scale changes; float32 scale, never below 1, a growth that
            would make it non-finite is not applied.
=========== ================================================================

Every style accepts ``init_scale``, ``min_scale`` and ``max_scale`` (a clamp
after each change; ``None`` keeps the source's own bound). The arithmetic is
the source's: Python floats for Chainer, float32 for PyTorch and TF, so the
trajectories match step for step.
"""
import inspect
import math

import numpy

from ada_loss.loss_scale.checks import (
    factor_above_one as _factor_above_one,
    in_open_unit as _factor_below_one, positive_finite as _positive_finite,
    positive_float32, positive_int as _positive_int)

STYLES = ('pytorch', 'chainer', 'tf')

_F32_MAX = float(numpy.finfo(numpy.float32).max)


def _f32(x):
    """x rounded to float32, as a Python float (the framework's storage)."""
    return float(numpy.float32(x))


def _f32_grown(x):
    """:func:`_f32` of a grown scale: beyond float32's range it is inf, which
    the caller tests and does not apply (as the frameworks do), so NumPy's
    "overflow encountered in cast" would only report the expected."""
    with numpy.errstate(over='ignore'):
        return float(numpy.float32(x))


class _Style(object):
    """Shared parts: clamps, options, state (de)serialization."""

    style = None
    _state_keys = ()

    def _set_clamps(self, min_scale, max_scale):
        self.min_scale = None if min_scale is None else _positive_finite(
            'min_scale', min_scale)
        self.max_scale = None if max_scale is None else _positive_finite(
            'max_scale', max_scale)
        if (self.min_scale is not None and self.max_scale is not None
                and self.min_scale > self.max_scale):
            raise ValueError('min_scale {!r} is above max_scale {!r}'.format(
                min_scale, max_scale))

    def _clamp(self, scale):
        if self.max_scale is not None:
            scale = min(self.max_scale, scale)
        if self.min_scale is not None:
            scale = max(self.min_scale, scale)
        return scale

    def state_dict(self):
        """The mutable state (what a snapshot must hold)."""
        return {k: getattr(self, k) for k in self._state_keys}

    def load_state_dict(self, state):
        for k in self._state_keys:
            setattr(self, k, type(getattr(self, k))(state[k]))

    def __repr__(self):
        return '{}({})'.format(type(self).__name__, ', '.join(
            '{}={!r}'.format(k, v) for k, v in self.state_dict().items()))


class DynamicLossScale(_Style):
    """PyTorch GradScaler's dynamic loss scale (``style=pytorch``).

    ``GradScaler.update`` runs ``_amp_update_scale_``: on an overflow the
    scale is multiplied by ``backoff_factor`` and the growth tracker reset;
    otherwise the tracker counts the clean step and when it reaches
    ``growth_interval`` the scale is multiplied by ``growth_factor`` (only if
    the product is finite in float32) and the tracker reset. The scale is a
    float32 tensor; products are taken in double and rounded to float32.

    Args:
        init_scale (float): initial scale (default 2^16).
        growth_factor (float): > 1 (default 2).
        backoff_factor (float): in (0, 1) (default 0.5).
        growth_interval (int): clean steps before growing (default 2000).
        min_scale, max_scale (float or None): optional clamp, not in
            PyTorch (default None: none, beyond float32's range).
    """

    style = 'pytorch'
    _state_keys = ('scale', 'clean_steps')
    #: how each option is stored (:func:`~ada_loss.loss_scale.checks.
    #: stored_number`): the scale in float32; the factors are doubles
    #: (``_amp_update_scale_`` takes them as double and rounds the product)
    option_kinds = {'init_scale': 'float32', 'growth_factor': 'float',
                    'backoff_factor': 'float', 'growth_interval': 'int',
                    'min_scale': 'float', 'max_scale': 'float'}

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000,
                 min_scale=None, max_scale=None):
        self.scale = _f32(positive_float32('init_scale', init_scale))
        self.growth_factor = _factor_above_one('growth_factor',
                                               growth_factor)
        self.backoff_factor = _factor_below_one('backoff_factor',
                                                backoff_factor)
        self.growth_interval = _positive_int('growth_interval',
                                             growth_interval)
        self._set_clamps(min_scale, max_scale)
        self.clean_steps = 0  # GradScaler's _growth_tracker

    def update(self, found_overflow):
        """Advances the state after one step; returns the new scale."""
        if found_overflow:
            self.scale = self._clamp(_f32(self.scale * self.backoff_factor))
            self.clean_steps = 0
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                grown = _f32_grown(self.scale * self.growth_factor)
                if math.isfinite(grown):
                    self.scale = self._clamp(grown)
                self.clean_steps = 0
        return self.scale


class ChainerLossScale(_Style):
    """Chainer's dynamic loss scale (``style=chainer``): a step-for-step
    re-implementation of ``chainer.Optimizer.loss_scaling(interval)`` with
    ``scale=None``, ``check_nan_in_grads`` and ``update_loss_scale``
    (chainer/optimizer.py, v7.8.1)::

        multiplier = 0.5 if overflow else (2^(1/interval) if an overflow
                                           ever happened else 2.0)
        scale = max(1, min(65504, scale * multiplier))

    Chainer keeps this state outside ``Optimizer.serialize``, so its own
    snapshots restart the scale at 1 on resume; here ``scale`` and
    ``overflowed_ever`` are saved.

    Args:
        interval (int): clean steps per doubling after the first overflow
            (default 1000, Chainer's).
        init_scale (float): initial scale (default 1, Chainer's; not an
            option in Chainer).
        min_scale, max_scale (float): the clamp (default 1 and 65504,
            ``Optimizer._loss_scale_max``, FP16's largest value).
    """

    style = 'chainer'
    _state_keys = ('scale', 'overflowed_ever')
    #: how each option is stored: Chainer's scale is a Python float
    option_kinds = {'interval': 'int', 'init_scale': 'float',
                    'min_scale': 'float', 'max_scale': 'float'}

    def __init__(self, interval=1000, init_scale=1.0, min_scale=1.0,
                 max_scale=65504.0):
        self.interval = _positive_int('interval', interval)
        self.scale = _positive_finite('init_scale', init_scale)
        self._set_clamps(min_scale, max_scale)
        # the same double as Chainer's math.pow(2.0, 1.0 / interval)
        self.multiplier = math.pow(2.0, 1.0 / self.interval)
        self.overflowed_ever = False  # Chainer's _loss_scaling_isnan_ever

    def update(self, found_overflow):
        """Advances the state after one step; returns the new scale."""
        if found_overflow:
            self.overflowed_ever = True
            multiplier = 0.5
        elif self.overflowed_ever:
            multiplier = self.multiplier
        else:
            multiplier = 2.0
        self.scale = float(self._clamp(self.scale * multiplier))
        return self.scale


class TFLossScale(_Style):
    """TensorFlow's ``ExponentialUpdateLossScaleManager`` (``style=tf``;
    tf.contrib.mixed_precision, and its Ascend port in Huawei's guide *Loss Scaling*).

    ``update_loss_scale(finite_grads)``: on a clean step, if ``good_steps +
    1 >= incr_every_n_steps`` the scale becomes ``scale * incr_ratio`` if
    that is finite (float32) and both counts reset, else ``good_steps`` += 1;
    on an overflowing step, if ``bad_steps + 1 >= decr_every_n_nan_or_inf``
    the scale becomes ``max(1, scale * decr_ratio)`` and both counts reset,
    else ``bad_steps`` += 1 and ``good_steps`` = 0. Every overflowing step is
    skipped, whether or not it changes the scale.

    Args:
        init_scale (float): TF's ``init_loss_scale`` (default 2^32, seed
            002's example; TF requires it).
        incr_every_n_steps (int): default 1000 (the Ascend guide's; TF requires it).
        decr_every_n_nan_or_inf (int): default 2 (TF's and the Ascend guide's).
        incr_ratio (float): > 1 (default 2).
        decr_ratio (float): in (0, 1) (default 0.5 as in the Ascend guide; TF's
            signature default is 0.8).
        min_scale (float): default 1 (TF's ``maximum(1., ...)``).
        max_scale (float or None): optional clamp (default None: float32's
            range, as TF).
    """

    style = 'tf'
    _state_keys = ('scale', 'good_steps', 'bad_steps')
    #: how each option is stored: the scale in float32, and the ratios too
    #: (TF multiplies the float32 scale by them as float32 tensors)
    option_kinds = {'init_scale': 'float32', 'incr_every_n_steps': 'int',
                    'decr_every_n_nan_or_inf': 'int', 'incr_ratio': 'float32',
                    'decr_ratio': 'float32', 'min_scale': 'float',
                    'max_scale': 'float'}

    def __init__(self, init_scale=2.0 ** 32, incr_every_n_steps=1000,
                 decr_every_n_nan_or_inf=2, incr_ratio=2.0, decr_ratio=0.5,
                 min_scale=1.0, max_scale=None):
        self.scale = _f32(positive_float32('init_scale', init_scale))
        self.incr_every_n_steps = _positive_int('incr_every_n_steps',
                                                incr_every_n_steps)
        self.decr_every_n_nan_or_inf = _positive_int(
            'decr_every_n_nan_or_inf', decr_every_n_nan_or_inf)
        # stored as used: rounded to float32 (so 2 and 2.00000001 are one
        # state), and checked again after rounding (1.00000001 is 1.0)
        self.incr_ratio = _factor_above_one('incr_ratio as a float32', _f32(
            _factor_above_one('incr_ratio', incr_ratio)))
        self.decr_ratio = _factor_below_one('decr_ratio as a float32', _f32(
            _factor_below_one('decr_ratio', decr_ratio)))
        self._set_clamps(min_scale, max_scale)
        self.good_steps = 0
        self.bad_steps = 0

    def update(self, found_overflow):
        """Advances the state after one step; returns the new scale."""
        if not found_overflow:
            if self.good_steps + 1 >= self.incr_every_n_steps:
                # float32 tensor times the ratio (stored as a float32); the
                # exact product of two float32 rounds the same way
                grown = _f32_grown(self.scale * self.incr_ratio)
                if math.isfinite(grown):
                    self.scale = self._clamp(grown)
                self.good_steps = self.bad_steps = 0
            else:
                self.good_steps += 1
        else:
            if self.bad_steps + 1 >= self.decr_every_n_nan_or_inf:
                self.scale = self._clamp(
                    _f32(self.scale * self.decr_ratio))
                self.good_steps = self.bad_steps = 0
            else:
                self.bad_steps += 1
                self.good_steps = 0
        return self.scale


_CLASSES = {'pytorch': DynamicLossScale, 'chainer': ChainerLossScale,
            'tf': TFLossScale}


def style_options(style):
    """The option names a style accepts, in signature order."""
    return list(style_defaults(style))


def style_option_kinds(style):
    """{option: how the style stores it} (``'int'``, ``'float'``,
    ``'float32'``; :func:`~ada_loss.loss_scale.checks.stored_number`): what
    a mode's canonical text rounds a value to, so that two spellings of
    one state are one text."""
    return dict(_CLASSES[check_style(style)].option_kinds)


def style_defaults(style):
    """{option: default} of a style, in signature order (what a mode's
    canonical text leaves out: :func:`ada_loss.scaling.parse_mode`)."""
    cls = _CLASSES[check_style(style)]
    return {k: p.default for k, p in
            inspect.signature(cls.__init__).parameters.items()
            if k != 'self'}


_SOURCES = {
    'pytorch': "PyTorch GradScaler (the default)",
    'chainer': "Chainer's optimizer.loss_scaling(), the paper's Dynamic",
    'tf': "TensorFlow ExponentialUpdateLossScaleManager (as in the Ascend guide)",
}


def describe_styles():
    """One line per style: the mode string, its source, and its options
    with their defaults (read from the signatures, for ``--help-config``)."""
    lines = []
    for style in STYLES:
        params = inspect.signature(_CLASSES[style].__init__).parameters
        opts = ', '.join('{}={}'.format(
            k, _fmt_default(p.default)) for k, p in params.items()
            if k != 'self')
        lines.append('dynamic:style={}[,k=v...]: {}; {}'.format(
            style, _SOURCES[style], opts))
    return '\n'.join(lines)


def _fmt_default(value):
    if isinstance(value, float) and value >= 1024 and \
            math.log2(value).is_integer():
        return '2^{:d}'.format(int(math.log2(value)))
    return '{:g}'.format(value) if isinstance(value, float) else str(value)


def check_style(style):
    if not isinstance(style, str) or style.strip().lower() not in STYLES:
        raise ValueError('unknown dynamic loss-scaling style {!r}; expected '
                         'one of: {}'.format(style, ', '.join(STYLES)))
    return style.strip().lower()


def make_dynamic_loss_scale(style='pytorch', **options):
    """The state machine of ``style`` (see the module docstring) with the
    given options (the others keep the source's defaults).

    Raises:
        ValueError: an unknown style, an option the style does not take
            (naming those it takes), or a bad value.
    """
    style = check_style(style)
    allowed = style_options(style)
    foreign = sorted(k for k in options if k not in allowed)
    if foreign:
        raise ValueError('dynamic style {} does not take {}; its options '
                         'are: {}'.format(style, ', '.join(foreign),
                                          ', '.join(allowed)))
    return _CLASSES[style](**options)
