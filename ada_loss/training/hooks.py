"""Update-rule hooks that run on unscaled gradients.

Chainer's ``optimizer_hooks.WeightDecay`` multiplies its rate by
``param._loss_scale``: it assumes it runs as an *optimizer* hook, before
``UpdateRule`` unscales the gradient. Registered on an update rule instead
(after the unscaling), it would decay an FP32 parameter of a mixed16 model
(batch normalization's γ, β) by ``rate · α``: with a loss scale of 2^16, a
weight decay of 1e-4 becomes 6.5. :class:`WeightDecay` here applies the
plain rate to the already unscaled FP32 gradient (the FP32 master copy for
FP16 parameters), independently of the loss scale and of the mode.
"""
import chainer


class WeightDecay(object):
    """``grad += rate * param`` in an update rule's pre-update hook.

    Register per parameter, ``param.update_rule.add_hook(WeightDecay(r))``
    (see :func:`add_weight_decay`), not with ``optimizer.add_hook``.
    """

    name = 'WeightDecay'
    call_for_each_param = True
    timing = 'pre'

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, rule, param):
        p, g = param.array, param.grad
        if p is None or g is None:
            return
        with chainer.using_device(param.device):
            g += p.dtype.type(self.rate) * p


def add_weight_decay(model, rate):
    """Adds :class:`WeightDecay` to the update rule of every parameter of
    ``model`` (after ``optimizer.setup``)."""
    hook = WeightDecay(rate)
    for param in model.params():
        if param.update_rule is not None:
            param.update_rule.add_hook(hook)
