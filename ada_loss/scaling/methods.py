"""The loss-scaling methods behind the modes, with one interface.

Each method runs the backward pass (so it can scale it) and is told after
every step whether the gradients were finite. Gradients always reach the
optimizer *scaled*, with ``param._loss_scale`` set; Chainer's ``UpdateRule``
divides them by it in FP32 (on the FP32 master copy under
``use_fp32_update()``), never in FP16.
"""

import chainer

from ada_loss.formats import get_format
from ada_loss.loss_scale.dynamic import DynamicLossScale
from ada_loss.loss_scale.gemm import check_scale
from ada_loss.scaling.modes import parse_mode


class NonFiniteGradientError(FloatingPointError):
    """Inf/NaN gradients in a mode that cannot recover by skipping."""


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
        loss.backward(loss_scale=self._scale)

    @property
    def scale(self):
        return self._scale


class DynamicScaling(LossScaling):
    """``dynamic``: backoff scaling (Kuchaiev et al., 2018); see
    :class:`ada_loss.loss_scale.DynamicLossScale` for the defaults."""

    recovers = True

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000):
        self.state = DynamicLossScale(init_scale, growth_factor,
                                      backoff_factor, growth_interval)

    def backward(self, loss):
        loss.backward(loss_scale=self.state.scale)

    def update(self, found_nonfinite):
        self.state.update(found_nonfinite)

    @property
    def scale(self):
        return self.state.scale

    def serialize(self, serializer):
        self.state.scale = float(serializer('scale', self.state.scale))
        self.state.clean_steps = int(
            serializer('clean_steps', self.state.clean_steps))


class AdaptiveScaling(LossScaling):
    """``adaptive``: layer-wise adaptive loss scaling (the paper); options
    as :class:`ada_loss.AdaLossScaled`."""

    recovers = True

    def __init__(self, init_scale=1.0, t_uf=1e-3, update_interval=1,
                 fmt='float16', bound='output', max_layer_scale=None,
                 max_accum_scale=None):
        self.options = dict(
            init_scale=init_scale, t_uf=t_uf, update_interval=update_interval,
            fmt=fmt, bound=bound,
            max_layer_scale=max_layer_scale, max_accum_scale=max_accum_scale)
        self.ada = None
        # Validate now, before any model exists (bad input stops early).
        from ada_loss.adaptive import AdaLossScaled
        AdaLossScaled(chainer.Chain(), verbose=False, **self.options)

    def bind(self, model, verbose=True):
        from ada_loss.adaptive import AdaLossScaled
        self.ada = AdaLossScaled(model, verbose=verbose, **self.options)

    def backward(self, loss):
        if self.ada is None:
            raise RuntimeError('AdaptiveScaling.bind(model) was not called')
        self.ada.backward(loss)

    def loss_scales(self):
        return self.ada.loss_scales() if self.ada is not None else {}

    @property
    def scale(self):
        return self.options['init_scale']

    def serialize(self, serializer):
        if self.ada is not None:
            self.ada.serialize(serializer)


def make_loss_scaling(mode):
    """The :class:`LossScaling` of a mode string (see :func:`parse_mode`)."""
    spec = parse_mode(mode)
    if spec.name in ('fp32', 'none'):
        return NoScaling()
    if spec.name == 'fixed':
        return FixedScaling(spec.options['scale'])
    cls = DynamicScaling if spec.name == 'dynamic' else AdaptiveScaling
    try:
        return cls(**spec.options)
    except (TypeError, ValueError, OverflowError) as e:
        # e.g. a string where a number is needed, int(inf) for an interval
        # (OverflowError), an out-of-range value (the option's own message)
        raise ValueError('bad options for mode {}: {}'.format(spec, e))
