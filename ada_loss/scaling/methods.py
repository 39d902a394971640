"""The loss-scaling methods behind the modes, with one interface.

Each method runs the backward pass (so it can scale it) and is told after
every step whether the gradients were finite. Gradients always reach the
optimizer *scaled*, with ``param._loss_scale`` set; Chainer's ``UpdateRule``
divides them by it in FP32 (on the FP32 master copy under
``use_fp32_update()``), never in FP16.
"""

import chainer
import numpy

from ada_loss import adaptive
from ada_loss.errors import NonFiniteGradientError  # NOQA (re-exported)
from ada_loss.formats import canonical_format, get_format
from ada_loss.functions.scales import host_float
from ada_loss.loss_scale.dynamic import make_dynamic_loss_scale
from ada_loss.loss_scale.gemm import check_scale


def _scaled_backward():
    """NumPy's overflow/invalid warnings off for a scaled backward pass: a
    loss scale too large for the gradients' format shows as Inf/NaN, which
    the updater tests every step and handles (the step skipped, or
    :class:`NonFiniteGradientError`), so NumPy 2's "overflow encountered in
    cast" (Chainer's FP32->FP16 casts) and "invalid value encountered in
    dot" (Inf * 0 after it) would only report the expected. The forward
    pass and unscaled backprop (``fp32``, ``none``) keep their warnings."""
    return numpy.errstate(over='ignore', invalid='ignore')


class LossScaling(object):
    """Interface of a loss-scaling method.

    Attributes:
        recovers (bool): whether a step with non-finite gradients is skipped
            and training goes on (else :class:`NonFiniteGradientError`).
        fmt (ada_loss.formats.FloatFormat): the format the scaled gradients
            are stored in (the precision's backward format; float16 unless
            :func:`make_loss_scaling` is told otherwise). Its range is what
            the method targets; ``fmt.saturates`` says whether an overflow
            shows as ± ``fmt.u_max`` instead of Inf/NaN.
    """

    recovers = False
    fmt = get_format('float16')

    def bind(self, model):
        """Called once with the model before training."""

    def backward(self, loss):
        raise NotImplementedError

    def update(self, found_nonfinite):
        """Called after every step (skipped or not)."""

    def last_nonfinite(self):
        """Where the last backward's first non-finite gradient entered a
        layer (:data:`ada_loss.adaptive.backward.NonFinite`), for the
        layer-wise methods, which see every layer's incoming gradient;
        None otherwise (the updater then names the first parameter, in
        backward order, whose gradient is non-finite)."""
        return None

    @property
    def scale(self):
        """The current (initial, for adaptive) loss scale, for reports."""
        return 1.0

    def serialize(self, serializer):
        pass


class NoScaling(LossScaling):
    """``fp32`` and ``none``: plain backprop."""

    def backward(self, loss):
        loss.backward()


class FixedScaling(LossScaling):
    """``fixed:S``: static loss scale (Micikevicius et al., 2018)."""

    def __init__(self, scale):
        self._scale = check_scale(scale, 'fixed loss scale')

    def backward(self, loss):
        with _scaled_backward():
            loss.backward(loss_scale=self._scale)

    @property
    def scale(self):
        return self._scale


class DynamicScaling(LossScaling):
    """``dynamic[:style=...,k=v]``: one global backoff loss scale, as its
    source defines it (:mod:`ada_loss.loss_scale.dynamic`):

    * ``style=pytorch`` (default): GradScaler; options ``init_scale``
      (2^16), ``growth_factor`` (2), ``backoff_factor`` (0.5),
      ``growth_interval`` (2000), ``min_scale``/``max_scale`` (none).
    * ``style=chainer``: Chainer's ``optimizer.loss_scaling()``, the paper's
      "Dynamic"; options ``interval`` (1000), ``init_scale`` (1),
      ``min_scale`` (1), ``max_scale`` (65504).
    * ``style=tf``: ``ExponentialUpdateLossScaleManager`` (TensorFlow);
      options ``init_scale`` (2^32), ``incr_every_n_steps`` (1000),
      ``decr_every_n_nan_or_inf`` (2), ``incr_ratio`` (2), ``decr_ratio``
      (0.5), ``min_scale`` (1), ``max_scale`` (none).

    An option left out (or ``None``) keeps the style's default; an option
    of another style is a ``ValueError``. The keyword arguments are the
    union of the styles' options (the mode parser takes them from here).
    """

    recovers = True

    def __init__(self, style='pytorch', init_scale=None, growth_factor=None,
                 backoff_factor=None, growth_interval=None, interval=None,
                 incr_every_n_steps=None, decr_every_n_nan_or_inf=None,
                 incr_ratio=None, decr_ratio=None, min_scale=None,
                 max_scale=None):
        given = dict(
            init_scale=init_scale, growth_factor=growth_factor,
            backoff_factor=backoff_factor, growth_interval=growth_interval,
            interval=interval, incr_every_n_steps=incr_every_n_steps,
            decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
            incr_ratio=incr_ratio, decr_ratio=decr_ratio,
            min_scale=min_scale, max_scale=max_scale)
        self.state = make_dynamic_loss_scale(
            style, **{k: v for k, v in given.items() if v is not None})
        self.style = self.state.style

    def backward(self, loss):
        with _scaled_backward():
            loss.backward(loss_scale=self.state.scale)

    def update(self, found_overflow):
        self.state.update(found_overflow)

    @property
    def scale(self):
        return self.state.scale

    def serialize(self, serializer):
        # every key of the style's state (a PyTorch-style snapshot keeps the
        # keys of earlier versions: scale, clean_steps)
        state = self.state.state_dict()
        self.state.load_state_dict(
            {k: serializer(k, v) for k, v in state.items()})


class AdaptiveScaling(LossScaling):
    """``adaptive``: layer-wise adaptive loss scaling (the paper); options
    as :class:`ada_loss.AdaLossScaled`. ``fmt`` defaults to the precision's
    gradient format; ``init_scale`` to ``'format'`` (α_{N+1} = 1, the
    paper's, wherever the gradient format holds 1/B as a normal number;
    ``init_scale=1`` is the paper's constant everywhere)."""

    recovers = True
    _impl = 'AdaLossScaled'
    #: how the numeric options are stored (doubles, ints, caps: None for
    #: inf; a mode's canonical text prints them so:
    #: :func:`ada_loss.scaling.parse_mode`)
    option_kinds = {'init_scale': 'float', 't_uf': 'float',
                    'update_interval': 'int', 'max_layer_scale': 'cap',
                    'max_accum_scale': 'cap', 'backoff_window': 'int'}

    def __init__(self, init_scale='format', t_uf=1e-3, update_interval=1,
                 fmt=None, bound=None, max_layer_scale=None,
                 max_accum_scale=None, guard=True, backoff_window=100,
                 style='paper', nonlinear_scale=True, split_scales=True):
        self._init(dict(
            init_scale=init_scale, t_uf=t_uf, update_interval=update_interval,
            fmt=fmt, bound=bound, max_layer_scale=max_layer_scale,
            max_accum_scale=max_accum_scale, guard=guard,
            backoff_window=backoff_window, style=style,
            nonlinear_scale=nonlinear_scale, split_scales=split_scales))

    def _init(self, options):
        self.options = options
        self.ada = None
        if options.get('fmt') is not None:
            # the one object of the format's numbers (e5m2 is fp8_e5m2)
            self.fmt = canonical_format(options['fmt'])
        # Validate now, before any model exists (bad input stops early).
        built = self._build(chainer.Chain(), verbose=False)
        if 'bound' in options:
            # the bound the style resolved None to (the probe reads it)
            options['bound'] = built.bound

    def _build(self, model, verbose):
        options = dict(self.options, fmt=self.fmt)
        return getattr(adaptive, self._impl)(model, verbose=verbose,
                                             **options)

    def set_format(self, fmt):
        """Targets ``fmt`` unless the mode named a format itself."""
        if self.options.get('fmt') is None:
            self.fmt = canonical_format(fmt)

    def bind(self, model, verbose=True):
        self.ada = self._build(model, verbose)

    def backward(self, loss):
        if self.ada is None:
            raise RuntimeError('{}.bind(model) was not called'.format(
                type(self).__name__))
        with _scaled_backward():
            self.ada.backward(loss)

    def update(self, found_nonfinite):
        if self.ada is not None:
            self.ada.step_done(found_nonfinite)

    def last_nonfinite(self):
        return self.ada.last_nonfinite() if self.ada is not None else None

    def loss_scales(self):
        return self.ada.loss_scales() if self.ada is not None else {}

    @property
    def scale(self):
        """α_{N+1}, the scale the next backward starts from."""
        if self.ada is not None:
            # α_{N+1} set on the device (init_scale='format'/'amax'/
            # 'auto') is read
            # when asked (the updater reports it every step)
            return host_float(self.ada.init_scale)
        init = self.options['init_scale']
        return 1.0 if isinstance(init, str) else init

    def serialize(self, serializer):
        if self.ada is not None:
            self.ada.serialize(serializer)


class AmaxScaling(AdaptiveScaling):
    """``amax``: max-based layer-wise scaling on the same ⟨α, δ⟩ backward
    (:class:`ada_loss.adaptive.AmaxLossScaled`): β of each GEMM maps the
    largest magnitude of its input gradient over the last ``history`` steps
    to u_max / 2^margin."""

    _impl = 'AmaxLossScaled'
    option_kinds = {'init_scale': 'float', 'margin': 'int', 'history': 'int',
                    'max_accum_scale': 'cap', 'backoff_window': 'int'}

    def __init__(self, init_scale=1.0, margin=8, history=16, fmt=None,
                 max_accum_scale=2.0 ** 24, guard=True, backoff_window=100,
                 nonlinear_scale=True, split_scales=True):
        self._init(dict(init_scale=init_scale, margin=margin,
                        history=history, fmt=fmt,
                        max_accum_scale=max_accum_scale, guard=guard,
                        backoff_window=backoff_window,
                        nonlinear_scale=nonlinear_scale,
                        split_scales=split_scales))
