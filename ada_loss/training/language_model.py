"""LanguageModel wrapper: a next-token model's loss in any precision."""
import chainer

from ada_loss.models.gpt import lm_accuracy, lm_loss
from ada_loss.precision import dtype_config, parse_precision
from ada_loss.training.precision_setup import apply_precision


class LanguageModel(chainer.Chain):
    """What :class:`~ada_loss.training.Classifier` is to an image
    classifier, for a model of token ids ``(B, T)`` → logits ``(B, T, V)``
    (:class:`ada_loss.models.gpt.GPT`): the predictor runs under the
    precision's dtype config with its GEMM links rounding to the
    precision's formats (:func:`apply_precision`; ``seed`` seeds NVFP4's
    stochastic rounding), and the loss is the mean cross-entropy over the
    ``B·T`` tokens in FP32 (:func:`~ada_loss.models.gpt.lm_loss`). Reports
    ``loss`` (nats per token) and ``accuracy``. The token ids stay int32:
    there is nothing to cast.
    """

    def __init__(self, predictor, precision='float32', seed=0):
        super(LanguageModel, self).__init__()
        self.precision = parse_precision(precision).name
        apply_precision(predictor, precision, seed)
        with self.init_scope():
            self.predictor = predictor

    def forward(self, x, t):
        with dtype_config(self.precision):
            y = self.predictor(x)
        loss = lm_loss(y, t)
        chainer.report({'loss': loss, 'accuracy': lm_accuracy(y, t)}, self)
        return loss
