"""Classifier wrapper: casts to the compute dtype and back for the loss."""
import chainer
import chainer.functions as F
import numpy

from ada_loss.precision import compute_dtype, dtype_config, parse_precision
from ada_loss.training.precision_setup import apply_precision


class Classifier(chainer.Chain):
    """Like :class:`chainer.links.Classifier`, in any precision
    (:mod:`ada_loss.precision`).

    The input is cast to the compute dtype (FP16 in mixed16), the predictor
    runs under the precision's dtype config, and the logits are cast to FP32
    before the softmax cross entropy (MPT computes reductions such as the
    loss in FP32). The gradient entering the network is therefore cast back
    to FP16: where a loss scale is needed. In an emulated precision the
    predictor's GEMM links round to its formats (:func:`apply_precision`;
    ``seed``, the run's, seeds NVFP4's stochastic rounding).
    """

    def __init__(self, predictor, precision='float32', seed=0):
        super(Classifier, self).__init__()
        self.precision = parse_precision(precision).name
        self._xdtype = compute_dtype(precision)
        apply_precision(predictor, precision, seed)
        with self.init_scope():
            self.predictor = predictor

    def forward(self, x, t):
        with dtype_config(self.precision):
            if x.dtype != self._xdtype:
                x = F.cast(x, self._xdtype)
            y = self.predictor(x)
        if y.dtype != numpy.float32:
            y = F.cast(y, numpy.float32)
        loss = F.softmax_cross_entropy(y, t)
        accuracy = F.accuracy(y, t)
        chainer.report({'loss': loss, 'accuracy': accuracy}, self)
        return loss
