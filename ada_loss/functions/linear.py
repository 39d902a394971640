"""Linear layer GEMM, y = x W^T + b (chainer.functions.linear)."""
from chainer.functions.connection import linear as _linear
from chainer import utils

from ada_loss.functions.add import GradAccumulation
from ada_loss.functions.gemm import FP16Emulation, GemmFunction


class LinearGradData(FP16Emulation, _linear.LinearGradData):
    """gx = gy W; inputs (W, gy): the loss scale multiplies gy."""
    scaled_input = 1

    def __init__(self, output_scale=1, out_format=None):
        self.output_scale = output_scale
        self.out_format = out_format


class LinearGradWeight(FP16Emulation, _linear.LinearGradWeight):
    """gW = gy^T x, rounded to W's dtype."""


class LinearFunction(GradAccumulation, GemmFunction, FP16Emulation,
                     _linear.LinearFunction):

    bias_axis = 0
    grad_input_axes = (0,)     # gx_j = Σ_i gy_i W_ij

    def grad_input(self, x, W, gy, scale):
        gx, = LinearGradData(scale, self.grad_format).apply((W, gy))
        return gx

    def grad_weight(self, x, W, gy, scale=1, fit=False):
        f = LinearGradWeight(W.dtype)
        f.output_scale, f.scaled_input = scale, 1   # inputs (x, gy)
        f.out_format = self.grad_format
        f.fit_output = fit
        gW, = f.apply((x, gy))
        return gW, f


def linear(x, W, b=None, n_batch_axes=1, scale_key=None, formats=None):
    """Same as :func:`chainer.functions.linear`, through :class:`LinearFunction`."""
    if n_batch_axes <= 0:
        raise ValueError('n_batch_axes should be greater than 0.')
    if n_batch_axes > 1:
        batch_shape = x.shape[:n_batch_axes]
        x = x.reshape(utils.size_of_shape(batch_shape), -1)
    elif x.ndim > 2:
        x = x.reshape(len(x), -1)
    func = LinearFunction()
    func.scale_key = scale_key
    if formats is not None:
        func.formats = formats
        func.out_format = formats[0]
    y, = func.apply((x, W) if b is None else (x, W, b))
    if n_batch_axes > 1:
        y = y.reshape(batch_shape + (-1,))
    return y
