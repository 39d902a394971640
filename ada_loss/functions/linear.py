"""Linear layer GEMM, y = x W^T + b (chainer.functions.linear)."""
import chainer
from chainer.functions.connection import linear as _linear
from chainer import utils
import numpy

from ada_loss.functions.add import GradAccumulation
from ada_loss.functions.gemm import GemmFunction, ScaledOutput


class LinearGradData(ScaledOutput, _linear.LinearGradData):
    """gx = (output_scale · gy) W; inputs (W, gy); gx has gy's dtype."""

    scaled_input = 1

    def __init__(self, output_scale=1, out_format=None, fit_output=False):
        self._init_output(output_scale, out_format, fit_output)

    def result_dtype(self, inputs):
        return inputs[1].dtype


class LinearGradWeight(ScaledOutput, _linear.LinearGradWeight):
    """gW = (output_scale · gy)^T x; inputs (x, gy); gW has W's dtype."""

    scaled_input = 1

    def __init__(self, w_dtype, output_scale=1, out_format=None,
                 fit_output=False):
        super(LinearGradWeight, self).__init__(w_dtype)
        self._init_output(output_scale, out_format, fit_output)

    def result_dtype(self, inputs):
        return self._w_dtype

    def forward_accumulator(self, inputs):
        # Chainer's node with a float32 W: the accumulator, not yet rounded
        # to float16 (which could overflow before fit_output scales it)
        wide = _linear.LinearGradWeight(numpy.promote_types(
            inputs[0].dtype, inputs[1].dtype))
        self.retain_inputs((0, 1))    # for double backprop, as Chainer's
        return wide.forward(inputs)


class LinearFunction(GradAccumulation, GemmFunction, ScaledOutput,
                     _linear.LinearFunction):
    """Chainer's ``LinearFunction`` with FP16 emulation, an emulated
    precision's rounding (``formats``) and the scaled backward of
    :class:`GemmFunction` (Algorithm 3)."""

    bias_axis = 0
    grad_input_axes = (0,)     # gx_j = Σ_i gy_i W_ij
    # x (N, K), W (M, K), gy (N, M): y = x W^T sums K, gx = gy W sums M,
    # gW = gy^T x sums N
    reduction_axes = {'fwd': ((1,), (1,)), 'dgrad': ((1,), (0,)),
                      'wgrad': ((0,), (0,))}

    def __init__(self, scale_key=None, formats=None, scaling=None):
        self._init_gemm(scale_key, formats, scaling)
        self._init_output(out_format=None if formats is None else formats[0])

    def grad_input(self, x, W, gy, scale=1, fit=False):
        """(gx, the scale gx was produced at)."""
        node = LinearGradData(scale, self.grad_format, fit)
        gx, = node.apply((W, gy))
        return gx, node.applied_scale

    def grad_weight(self, x, W, gy, scale=1, fit=False):
        """(gW, the scale gW was produced at)."""
        node = LinearGradWeight(W.dtype, scale, self.grad_format, fit)
        gW, = node.apply((x, gy))
        return gW, node.applied_scale

    def grad_weight_rht(self, x, W, gy, scale=1, fit=False):
        """(gW, its scale) from the recipe's Hadamard-transformed casts of
        x (N, K) and gy (N, M) along N (NVFP4; arrays in)."""
        xp = chainer.backend.get_array_module(x)
        gq, xq = self.scaling.quantize_wgrad(xp.ascontiguousarray(gy.T),
                                             xp.ascontiguousarray(x.T))
        return self.grad_weight(xq.T, W, gq.T, scale, fit)


def linear(x, W, b=None, n_batch_axes=1, scale_key=None, formats=None,
           scaling=None):
    """Same as :func:`chainer.functions.linear`, through
    :class:`LinearFunction`.

    ``scale_key`` names the layer (for layer-wise loss scales); ``formats``
    is the (forward, backward) format pair of an emulated precision;
    ``scaling`` the layer's :class:`ada_loss.formats.recipe.GemmScaling`
    under a scaled recipe (per-tensor FP8 or MX).
    """
    if n_batch_axes <= 0:
        raise ValueError('n_batch_axes should be greater than 0.')
    if n_batch_axes > 1:
        batch_shape = x.shape[:n_batch_axes]
        x = x.reshape(utils.size_of_shape(batch_shape), -1)
    elif x.ndim > 2:
        x = x.reshape(len(x), -1)
    func = LinearFunction(scale_key=scale_key, formats=formats,
                          scaling=scaling)
    y, = func.apply((x, W) if b is None else (x, W, b))
    if n_batch_axes > 1:
        y = y.reshape(batch_shape + (-1,))
    return y
