"""Batch normalization of float16 inputs with FP32 γ/β (mixed16 on CPU).

Chainer's mixed16 batch normalization already computes in float32
(``GeneralBatchNormalizationImpl``: ``numpy.promote_types(float16, float32)``)
and rounds the output, and the input gradient, to float16 at the end; its
float16 inputs enter float32 expressions and reductions through NumPy's
slow float16 casts, and the two float32 → float16 casts hit NumPy's slow
path for subnormal results (input gradients have many).

:class:`Float16BatchNormalizationImpl` runs the same float32 expressions, in
the same order, on exactly widened inputs and rounds with
:func:`ada_loss.formats.narrow`. The reductions over float16 data (mean and
variance of x, Σ gy) are fed :func:`ada_loss.formats.widen_summable`
copies, which NumPy sums exactly as it sums the float16 arrays; reductions
over float32 data (Σ gy·x̂) are the same calls on the same float32 arrays.
So every output — y, the statistics, the running averages, gx, gγ, gβ —
is bit for bit Chainer's.

It plugs into Chainer's own ``BatchNormalization`` node through its
``impl_selector`` argument (Chainer's extension point for CPU/cuDNN/iDeep
implementations), so the graph, the retained arrays and double
backpropagation stay Chainer's.
"""
import numpy

from chainer.functions.normalization import batch_normalization as _bn
from chainer.utils import argument

from ada_loss.formats import narrow, widen, widen_summable
from ada_loss.functions.fp16_elementwise import emulates_fp16_elementwise


class Float16BatchNormalizationImpl(_bn.GeneralBatchNormalizationImpl):
    """``GeneralBatchNormalizationImpl`` (NumPy path) for float16 x and
    float32 γ: same expressions, exact widening, fast rounding."""

    def forward(self, axis, gamma, x, x_layout, xp, expander,
                beta, eps, decay, running_mean, running_var):
        interm_dtype = numpy.promote_types(x.dtype, gamma.dtype)
        xs = widen_summable(x)

        gamma = gamma[expander].astype(interm_dtype, copy=False)
        beta = beta[expander].astype(interm_dtype, copy=False)
        mean, var = self.get_mean_and_var(axis, gamma, xs, xp, interm_dtype)
        inv_std = numpy.reciprocal(numpy.sqrt(var + eps, dtype=interm_dtype))

        # _apply_bn_fwd
        y = _bn._x_hat(xs, mean[expander], inv_std[expander])
        y *= gamma
        y += beta
        y = narrow(y)

        if running_mean is not None:
            m = x.size // gamma.size
            adjust = m / max(m - 1., 1.)  # unbiased estimation
            running_mean *= decay
            running_mean += (1 - decay) * mean
            running_var *= decay
            running_var += (1 - decay) * adjust * var

        return y, x_layout, running_mean, running_var, mean, var, inv_std, \
            None

    def backward(self, axis, gamma, gy, x, x_layout, xp,
                 expander, mean, inv_std, eps, var, forward_data):
        gys = widen_summable(gy)
        x_hat = _bn._x_hat(widen(x), mean[expander], inv_std[expander])
        gbeta, ggamma = self.get_ggamma_and_gbeta(axis, gamma, gys, x_hat,
                                                  xp)
        inv_m = gamma.dtype.type(1. / (x.size // gamma.size))
        gx = (gamma * inv_std)[expander] * (
            gys - (x_hat * ggamma[expander] + gbeta[expander]) * inv_m)
        return narrow(gx), None, ggamma, gbeta


def select_impl(batch_norm_func, inputs):
    """``impl_selector`` of Chainer's ``BatchNormalization`` node:
    :class:`Float16BatchNormalizationImpl` for float16 NumPy x with float32
    γ (emulated mode), Chainer's own choice otherwise."""
    x, gamma, _ = inputs
    if emulates_fp16_elementwise(x) and gamma.dtype == numpy.float32:
        return Float16BatchNormalizationImpl()
    return _bn._impl_selector(batch_norm_func, inputs)


def batch_normalization(x, gamma, beta, **kwargs):
    """batch_normalization(x, gamma, beta, eps=2e-5, running_mean=None, \
running_var=None, decay=0.9, axis=None)

    :func:`chainer.functions.batch_normalization` (the same keyword-only
    arguments and errors) with :func:`select_impl`: the same node and
    results, faster on float16 NumPy inputs with float32 γ/β."""
    eps, running_mean, running_var, decay, axis = argument.parse_kwargs(
        kwargs, ('eps', 2e-5), ('running_mean', None),
        ('running_var', None), ('decay', 0.9), ('axis', None),
        train='train argument is not supported anymore. '
        'Use chainer.using_config')
    return _bn.BatchNormalization(
        eps, running_mean, running_var, decay, axis,
        impl_selector=select_impl).apply((x, gamma, beta))[0]
