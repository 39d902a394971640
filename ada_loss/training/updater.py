"""StandardUpdater whose backward is done by a loss-scaling method."""
import chainer
from chainer import backend
from chainer.training import updaters

from ada_loss.scaling.methods import NonFiniteGradientError


def all_grads_finite(model):
    """True if every parameter gradient is finite (one reduction each)."""
    for param in model.params():
        g = param.grad
        if g is None:
            continue
        xp = backend.get_array_module(g)
        if not bool(xp.isfinite(g).all()):
            return False
    return True


def nonfinite_params(model):
    names = []
    for name, param in model.namedparams():
        g = param.grad
        if g is not None and not bool(
                backend.get_array_module(g).isfinite(g).all()):
            names.append(name)
    return names


class MixedPrecisionUpdater(updaters.StandardUpdater):
    """One training step: forward, scaled backward, finite check, update.

    A step whose gradients contain Inf/NaN never reaches the master weights:
    with a method that recovers (dynamic, adaptive) it is skipped and
    counted; otherwise :class:`NonFiniteGradientError` is raised.

    Reports ``loss_scale`` and ``skipped_steps`` (cumulative) every step.

    Args:
        iterator, optimizer, converter, device: as ``StandardUpdater``.
        loss_scaling (ada_loss.scaling.LossScaling): the method.
        mode (str): its name, for messages.
    """

    def __init__(self, iterator, optimizer, loss_scaling, mode='',
                 converter=None, device=None, loss_func=None):
        kwargs = {} if converter is None else {'converter': converter}
        super(MixedPrecisionUpdater, self).__init__(
            iterator, optimizer, device=device, loss_func=loss_func, **kwargs)
        self.loss_scaling = loss_scaling
        self.mode = mode
        self.skipped_steps = 0
        loss_scaling.bind(optimizer.target)

    def update_core(self):
        iterator = self._iterators['main']
        optimizer = self._optimizers['main']
        model = optimizer.target
        batch = iterator.next()
        in_arrays = self.converter(batch, self.input_device)
        loss_func = self.loss_func or model

        model.cleargrads()
        if isinstance(in_arrays, tuple):
            loss = loss_func(*in_arrays)
        elif isinstance(in_arrays, dict):
            loss = loss_func(**in_arrays)
        else:
            loss = loss_func(in_arrays)
        self.loss_scaling.backward(loss)
        del loss

        finite = self.grads_finite(model)
        if finite:
            optimizer.update()
        else:
            self.skipped_steps += 1
            if not self.loss_scaling.recovers:
                raise NonFiniteGradientError(
                    'non-finite gradient (Inf/NaN) at iteration {} with loss '
                    'scaling mode {!r} in: {}. This mode cannot recover by '
                    'skipping steps; use a smaller fixed scale, or the '
                    'dynamic or adaptive mode.'.format(
                        self.iteration + 1, self.mode,
                        ', '.join(nonfinite_params(model)[:8])))
            model.cleargrads()
        self.loss_scaling.update(not finite)
        chainer.report({'loss_scale': self.loss_scaling.scale,
                        'skipped_steps': self.skipped_steps})

    def grads_finite(self, model):
        """Whether this step's gradients are all finite. A hook: the
        distributed updater (:mod:`ada_loss.training.distributed`) makes all
        ranks agree, so they skip the same steps."""
        return all_grads_finite(model)

    def serialize(self, serializer):
        super(MixedPrecisionUpdater, self).serialize(serializer)
        self.skipped_steps = int(serializer('skipped_steps',
                                            self.skipped_steps))
        self.loss_scaling.serialize(serializer['loss_scaling'])
