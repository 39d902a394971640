"""StandardUpdater whose backward is done by a loss-scaling method."""
import collections

import chainer
import numpy
from chainer import backend
from chainer.training import updaters

from ada_loss.errors import NonFiniteGradientError
from ada_loss.training.skips import SkipRecord, locate_nonfinite


def _format_params(model):
    """ids of the parameters whose gradients are stored in an emulated
    format: those of GEMM links with a backward format (``gemm_formats``,
    :func:`ada_loss.training.apply_precision`). None if no link of the
    model was given a precision (then every gradient is taken to be in the
    format); an empty set under a scaled recipe whose GEMMs produce FP32
    gradients (per-tensor FP8, MX: no parameter gradient is stored in the
    element format, so none can be saturated in it)."""
    ids, declared = set(), False
    for link in model.links():
        formats = getattr(link, 'gemm_formats', None)
        if formats is not None or getattr(link, 'gemm_scaling',
                                          None) is not None:
            declared = True
        if formats is not None and formats[1] is not None:
            ids.update(id(p) for p in link.params(include_uninit=False))
    return ids if declared else None


def _overflowed(param, fmt, in_format, g=None):
    """Whether one gradient (``param.grad``, or the array ``g`` given for
    it) overflowed: one vectorized reduction."""
    if g is None:
        g = param.grad
    if g is None:
        return False
    xp = backend.get_array_module(g)
    if fmt is not None and fmt.saturates and (
            in_format is None or id(param) in in_format):
        # An overflow saturates to +-u_max (the Ascend guide's "saturation mode"),
        # so a value at u_max counts as one; NaN fails the comparison too.
        return not bool((xp.abs(g) < fmt.u_max).all())
    return not bool(xp.isfinite(g).all())


def all_grads_finite(model, fmt=None):
    """True if no parameter gradient overflowed: every gradient is finite
    and, when the gradient format ``fmt`` saturates
    (:attr:`ada_loss.formats.FloatFormat.saturates`), every gradient stored
    in it is below ``fmt.u_max`` in magnitude. One reduction per parameter.

    Gradients that stay FP32 in an emulated precision (batch norm's γ/β,
    ...) are only checked for Inf/NaN: they may exceed u_max legitimately.
    """
    in_format = _format_params(model) if fmt is not None and \
        fmt.saturates else None
    params = list(model.params())
    grads = [p.grad for p in params if p.grad is not None]
    if grads and not isinstance(grads[0], numpy.ndarray):
        # On a device: one flag per gradient, stacked, and a single
        # device-to-host transfer (the step's one synchronization).
        xp = backend.get_array_module(grads[0])
        flags = [_finite_flag(xp, p, fmt, in_format) for p in params
                 if p.grad is not None]
        return bool(xp.stack(flags).all())
    return not any(_overflowed(p, fmt, in_format) for p in params)


def _finite_flag(xp, param, fmt, in_format):
    g = param.grad
    if fmt is not None and fmt.saturates and (
            in_format is None or id(param) in in_format):
        return (xp.abs(g) < fmt.u_max).all()
    return xp.isfinite(g).all()


def nonfinite_params(model, fmt=None):
    """Names of the parameters whose gradients overflowed (as in
    :func:`all_grads_finite`)."""
    in_format = _format_params(model) if fmt is not None and \
        fmt.saturates else None
    return [name for name, p in model.namedparams()
            if _overflowed(p, fmt, in_format)]


def call_loss(loss_func, in_arrays):
    """``loss_func`` applied to a converted batch (a tuple, a dict or one
    array), as Chainer's ``StandardUpdater`` does."""
    if isinstance(in_arrays, tuple):
        return loss_func(*in_arrays)
    if isinstance(in_arrays, dict):
        return loss_func(**in_arrays)
    return loss_func(in_arrays)


class MixedPrecisionUpdater(updaters.StandardUpdater):
    """One training step: forward, scaled backward, finite check, update.

    A step whose gradients overflowed -- Inf/NaN, or in a gradient format
    that saturates (``loss_scaling.fmt.saturates``) a value at ± its u_max --
    never reaches the master weights: with a method that recovers (dynamic,
    adaptive) it is skipped and counted; otherwise
    :class:`NonFiniteGradientError` is raised.

    A skipped step is located (:mod:`ada_loss.training.skips`): the first
    layer in backward order whose gradient went non-finite, kept as
    :attr:`last_skip` and counted per layer in :attr:`skipped_by_layer`.

    Reports ``loss_scale`` and ``skipped_steps`` (cumulative) every step.
    ``optimizer.epoch`` advances as under ``StandardUpdater``: once each
    time the iterator starts a new epoch, skipped steps included.

    Args:
        iterator, optimizer, converter, device, loss_func, auto_new_epoch:
            as ``StandardUpdater``.
        loss_scaling (ada_loss.scaling.LossScaling): the method.
        mode (str): its name, for messages.
    """

    def __init__(self, iterator, optimizer, loss_scaling, mode='',
                 converter=None, device=None, loss_func=None,
                 auto_new_epoch=True):
        kwargs = {} if converter is None else {'converter': converter}
        super(MixedPrecisionUpdater, self).__init__(
            iterator, optimizer, device=device, loss_func=loss_func,
            auto_new_epoch=auto_new_epoch, **kwargs)
        self.loss_scaling = loss_scaling
        self.mode = mode
        self.skipped_steps = 0
        #: {layer: skipped steps it was named in} (``''``: another rank's)
        self.skipped_by_layer = collections.Counter()
        #: the :data:`~ada_loss.training.skips.SkipRecord` of the last
        #: skipped step, or None
        self.last_skip = None
        #: runs the step instead of :meth:`update_core`'s eager body when
        #: set: a :class:`~ada_loss.training.graph_step.CapturableStep` or
        #: a :class:`~ada_loss.training.cuda_graph.CudaGraphStep`
        self.step_runner = None
        loss_scaling.bind(optimizer.target)

    def update_core(self):
        if self.step_runner is not None:
            return self.step_runner.update()
        iterator = self._iterators['main']
        optimizer = self._optimizers['main']
        model = optimizer.target
        batch = iterator.next()
        in_arrays = self.converter(batch, self.input_device)
        loss_func = self.loss_func or model

        model.cleargrads()
        loss = call_loss(loss_func, in_arrays)
        self.loss_scaling.backward(loss)
        finite = self.grads_finite(model)
        where = None if finite else self.locate_nonfinite(model, loss)
        del loss
        self.finish_step(finite, optimizer.update, where=where)

    def locate_nonfinite(self, model, loss):
        """(layer, α, max|g|) of the first non-finite gradient of this step
        in backward order (see :mod:`ada_loss.training.skips`)."""
        found = self.loss_scaling.last_nonfinite()
        if found is not None:
            layer = found.layer if isinstance(found.layer, str) else \
                str(found.layer)
            return layer, float(found.alpha), float(found.max_abs)
        fmt = self.loss_scaling.fmt
        in_format = _format_params(model) if fmt is not None and \
            fmt.saturates else None
        return locate_nonfinite(
            model, loss, lambda p, g: _overflowed(p, fmt, in_format, g),
            self.loss_scaling.scale)

    def finish_step(self, finite, apply, where=None, **observations):
        """The end of a step, after the backward: ``apply()`` (the update)
        if the gradients are ``finite``, else the step is skipped, located
        (``where``: (layer, α, max|g|), see :meth:`locate_nonfinite`) and
        counted (or :class:`NonFiniteGradientError` raised for a mode that
        cannot recover); then the loss scale's update, the epoch, and the
        report (``loss_scale``, ``skipped_steps`` and ``observations``)."""
        iterator = self._iterators['main']
        optimizer = self._optimizers['main']
        model = optimizer.target
        if finite:
            apply()
        else:
            self.skipped_steps += 1
            layer, alpha, peak = where or ('', self.loss_scaling.scale,
                                           float('nan'))
            self.last_skip = SkipRecord(self.iteration + 1, layer, alpha,
                                        peak)
            self.skipped_by_layer[layer] += 1
            if not self.loss_scaling.recovers:
                raise NonFiniteGradientError(
                    'non-finite gradient (Inf/NaN) at iteration {} with loss '
                    'scaling mode {!r}, first in backward order in layer '
                    '{!r} (scale {:g}, max |g| {}), then in: {}. This mode '
                    'cannot recover by skipping steps; use a smaller fixed '
                    'scale, or the dynamic or adaptive mode.'.format(
                        self.iteration + 1, self.mode, layer, alpha, peak,
                        ', '.join(nonfinite_params(
                            model, self.loss_scaling.fmt)[:8])))
            model.cleargrads()
        self.loss_scaling.update(not finite)
        # As StandardUpdater: the epoch is the iterator's, whether or not
        # this step reached the weights.
        if self.auto_new_epoch and iterator.is_new_epoch:
            optimizer.new_epoch(auto=True)
        chainer.report(dict(observations,
                            loss_scale=self.loss_scaling.scale,
                            skipped_steps=self.skipped_steps))

    def grads_finite(self, model):
        """Whether this step's gradients are all finite (and, in a format
        that saturates, below its largest value; see
        :func:`all_grads_finite`). A hook: the distributed updater
        (:mod:`ada_loss.training.distributed`) makes all ranks agree, so they
        skip the same steps."""
        return all_grads_finite(model, self.loss_scaling.fmt)

    def serialize(self, serializer):
        super(MixedPrecisionUpdater, self).serialize(serializer)
        self.skipped_steps = int(serializer('skipped_steps',
                                            self.skipped_steps))
        self._serialize_skips(serializer)
        self.loss_scaling.serialize(serializer['loss_scaling'])
        if self.step_runner is not None and isinstance(
                serializer, chainer.serializer.Deserializer):
            self.step_runner.reload()     # its arrays follow the host state

    def _serialize_skips(self, serializer):
        # the per-layer counts (run.json) survive a resume
        if isinstance(serializer, chainer.serializer.Deserializer):
            try:
                layers = str(serializer('skipped_layers', ''))
            except KeyError:        # a snapshot from before the report
                return
            counts = serializer('skipped_counts', None)
            if counts is None:      # none stored (or a dry run's check)
                counts = ()
            layers = layers.split('\n') if len(counts) else []
            self.skipped_by_layer = collections.Counter(
                {k: int(v) for k, v in zip(layers, counts)})
        else:
            layers = sorted(self.skipped_by_layer)
            serializer('skipped_layers', '\n'.join(layers))
            serializer('skipped_counts', numpy.array(
                [self.skipped_by_layer[k] for k in layers], numpy.int64))
