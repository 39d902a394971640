"""BatchNormalization on :func:`ada_loss.functions.batch_normalization`."""
import chainer
import chainer.links as L
from chainer.utils import argument

from ada_loss import functions


class BatchNormalization(L.BatchNormalization):
    """:class:`chainer.links.BatchNormalization` whose training-mode forward
    goes through :func:`ada_loss.functions.batch_normalization`: Chainer's
    own node and results, faster on float16 NumPy inputs (mixed16 on CPU).

    Same constructor, parameters and persistent values as the parent;
    :func:`as_batch_normalization_link` converts a Chainer link in place.
    Evaluation mode (fixed statistics) is the parent's.
    """

    def forward(self, x, **kwargs):
        if not chainer.config.train:
            return super(BatchNormalization, self).forward(x, **kwargs)
        # The training branch of the parent's forward (Chainer 7.8.1), with
        # the batch_normalization function replaced.
        finetune, = argument.parse_kwargs(
            kwargs, ('finetune', False),
            test='test argument is not supported anymore. '
                 'Use chainer.using_config')
        if self.avg_mean is None:
            param_shape = tuple([
                d
                for i, d in enumerate(x.shape)
                if i not in self.axis])
            self._initialize_params(param_shape)

        gamma = self.gamma
        if gamma is None:
            gamma, = self._get_gamma()
        beta = self.beta
        if beta is None:
            beta, = self._get_beta()

        if finetune:
            self.N += 1
            decay = 1. - 1. / self.N
        else:
            decay = self.decay
        avg_mean = self.avg_mean
        avg_var = self.avg_var
        if chainer.config.in_recomputing:
            # Do not update statistics when extra forward computation is
            # called.
            if finetune:
                self.N -= 1  # Revert the count
            avg_mean = None
            avg_var = None
        return functions.batch_normalization(
            x, gamma, beta, eps=self.eps, running_mean=avg_mean,
            running_var=avg_var, decay=decay, axis=self.axis)


def as_batch_normalization_link(link):
    """Makes a ``chainer.links.BatchNormalization`` (exactly that class) a
    :class:`BatchNormalization` in place (parameters, values and names
    unchanged). Returns True if ``link`` is one now."""
    if type(link) is L.BatchNormalization:
        link.__class__ = BatchNormalization
    return isinstance(link, BatchNormalization)
