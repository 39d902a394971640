"""SSD's training objective as a Chain (Liu et al. 2016, Eq. 1; paper §4.3).

``loss = conf_loss + alpha * loc_loss`` from ChainerCV's ``multibox_loss``
(softmax confidence loss with hard negative mining at negatives:positives =
``k``:1, smooth-L1 localization loss, both divided by the number of
positives), as in ChainerCV's ``examples/ssd/train.py`` (k=3, alpha=1).
The multibox outputs are cast to FP32 first: in mixed16 the loss (a
reduction) is computed in FP32 and the gradient is cast back to FP16 where it
enters the network -- where a loss scale matters.
"""
import chainer
import chainer.functions as F
import numpy
from chainercv.links.model.ssd import GradientScaling
from chainercv.links.model.ssd import multibox_loss

from ada_loss.training.distributed import create_multi_node_optimizer
from ada_loss.training.hooks import WeightDecay
from ada_loss.training.precision_setup import setup_optimizer


class MultiboxTrainChain(chainer.Chain):
    """Computes and reports ``loss``, ``loss/loc``, ``loss/conf``.

    A batch without any positive default box (possible after random
    cropping) has no multibox loss; ChainerCV returns a constant 0 there, on
    which no backward can run. This chain returns ``0 * (sum of outputs)``
    instead: a zero loss with zero gradients, so every loss-scaling mode can
    run its backward (the update then applies only weight decay/momentum).
    """

    def __init__(self, model, alpha=1.0, k=3):
        super(MultiboxTrainChain, self).__init__()
        with self.init_scope():
            self.model = model
        self.alpha = alpha
        self.k = k

    def forward(self, imgs, gt_mb_locs, gt_mb_labels):
        mb_locs, mb_confs = self.model(imgs)
        if mb_locs.dtype != numpy.float32:
            mb_locs = F.cast(mb_locs, numpy.float32)
        if mb_confs.dtype != numpy.float32:
            mb_confs = F.cast(mb_confs, numpy.float32)
        loc_loss, conf_loss = multibox_loss(
            mb_locs, mb_confs, gt_mb_locs, gt_mb_labels, self.k)
        if loc_loss.creator is None:       # no positives in the batch
            loss = (F.sum(mb_locs) + F.sum(mb_confs)) * 0.0
        else:
            loss = loc_loss * self.alpha + conf_loss
        chainer.report({'loss': loss, 'loss/loc': loc_loss,
                        'loss/conf': conf_loss}, self)
        return loss


def setup_ssd_optimizer(train_chain, lr=1e-3, momentum=0.9,
                        weight_decay=5e-4, precision='float32', comm=None):
    """MomentumSGD as in ChainerCV's SSD example: biases get twice the
    learning rate (``GradientScaling(2)``), other parameters weight decay
    (both per-parameter hooks: they see the unscaled FP32 gradient; the
    decay is :mod:`ada_loss.training.hooks`' WeightDecay, whose rate does
    not depend on the loss scale, unlike Chainer's). FP32 master
    weights in mixed16 (``precision``); ChainerMN's multi-node optimizer
    (with the loss-scale synchronization of
    :mod:`ada_loss.training.distributed`) when ``comm`` is given."""
    optimizer = chainer.optimizers.MomentumSGD(lr=lr, momentum=momentum)
    if comm is not None:
        optimizer = create_multi_node_optimizer(optimizer, comm)
    setup_optimizer(optimizer, train_chain, precision)
    for param in train_chain.params():
        if param.name == 'b':
            param.update_rule.add_hook(GradientScaling(2))
        else:
            param.update_rule.add_hook(WeightDecay(weight_decay))
    return optimizer
