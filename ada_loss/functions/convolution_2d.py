"""2-D convolution and deconvolution GEMMs (chainer.functions.convolution_2d,
deconvolution_2d).

Both node types live here because each is the other's input-gradient GEMM:
the input gradient of a convolution is a deconvolution of gy, and that of a
deconvolution a convolution of gy (as in Chainer).
"""
from chainer.functions.connection import convolution_2d as _conv
import numpy
from chainer.functions.connection import deconvolution_2d as _deconv
from chainer.utils import argument

from ada_loss.functions.add import GradAccumulation
from ada_loss.functions.gemm import GemmFunction, ScaledOutput
from ada_loss.loss_scale.gemm import grad_input_gain

_DETERMINISTIC = ('deterministic argument is not supported anymore. '
                  'Use chainer.using_config(\'cudnn_deterministic\', value) '
                  'context where value is either `True` or `False`.')


class Convolution2DGradW(ScaledOutput, _conv.Convolution2DGradW):
    """gW of a convolution, inputs (x, gy), and of a deconvolution, inputs
    (gy, x); ``scaled_input`` is gy's index. gW has W's dtype."""

    def __init__(self, conv2d, w_shape, w_dtype, w_layout, output_scale=1,
                 out_format=None, fit_output=False, scaled_input=1):
        super(Convolution2DGradW, self).__init__(conv2d, w_shape, w_dtype,
                                                 w_layout)
        self._init_output(output_scale, out_format, fit_output, scaled_input)

    def result_dtype(self, inputs):
        return self.W_dtype

    def forward_accumulator(self, inputs):
        # Chainer's node with a float32 W: the accumulator, not yet rounded
        # to float16 (which could overflow before fit_output scales it)
        wide = _conv.Convolution2DGradW(
            self, self.W_shape, numpy.promote_types(inputs[0].dtype,
                                                    inputs[1].dtype),
            self.w_layout)
        self.retain_inputs((0, 1))    # for double backprop, as Chainer's
        return wide.forward(inputs)


class Convolution2DFunction(GradAccumulation, GemmFunction, ScaledOutput,
                            _conv.Convolution2DFunction):
    """Chainer's ``Convolution2DFunction`` with FP16 emulation, an emulated
    precision's rounding and the scaled backward of :class:`GemmFunction`.

    Besides Chainer's arguments: ``scale_key`` and ``formats`` (see
    :class:`GemmFunction`), and ``output_scale`` / ``out_format`` when the
    node is a deconvolution's input-gradient GEMM (see
    :class:`ScaledOutput`; the scale then multiplies the input gy).
    """

    bias_axis = (0, 2, 3)

    def __init__(self, stride=1, pad=0, cover_all=False, scale_key=None,
                 formats=None, output_scale=1, out_format=None,
                 fit_output=False, **kwargs):
        super(Convolution2DFunction, self).__init__(stride, pad, cover_all,
                                                    **kwargs)
        self._init_gemm(scale_key, formats)
        if out_format is None and formats is not None:
            out_format = formats[0]
        self._init_output(output_scale, out_format, fit_output)

    def grad_input_gain(self, W):
        # W: (out, in/groups, kh, kw); input channel c' of group k gets
        # gradient from the outputs of group k only.
        out, cin, kh, kw = W.shape
        Wg = W.reshape(self.groups, out // self.groups, cin, kh, kw)
        return grad_input_gain(Wg, (1, 3, 4))

    def grad_input(self, x, W, gy, scale=1, fit=False):
        """(gx, the scale gx was produced at)."""
        node = Deconvolution2DFunction(
            stride=(self.sy, self.sx), pad=(self.ph, self.pw),
            outsize=x.shape[2:], dilate=(self.dy, self.dx),
            groups=self.groups, output_scale=scale,
            out_format=self.grad_format, fit_output=fit)
        gx, = node.apply((gy, W))
        return gx, node.applied_scale

    def grad_weight(self, x, W, gy, scale=1, fit=False):
        """(gW, the scale gW was produced at)."""
        node = Convolution2DGradW(self, W.shape, W.dtype, W.layout, scale,
                                  self.grad_format, fit, scaled_input=1)
        gW, = node.apply((x, gy))
        return gW, node.applied_scale


class Deconvolution2DFunction(GradAccumulation, GemmFunction, ScaledOutput,
                              _deconv.Deconvolution2DFunction):
    """Chainer's ``Deconvolution2DFunction`` with FP16 emulation, an
    emulated precision's rounding and the scaled backward of
    :class:`GemmFunction`; arguments as :class:`Convolution2DFunction`'s."""

    bias_axis = (0, 2, 3)
    grad_input_axes = (1, 2, 3)   # W: (in, out/groups, kh, kw)

    def __init__(self, stride=1, pad=0, outsize=None, scale_key=None,
                 formats=None, output_scale=1, out_format=None,
                 fit_output=False, **kwargs):
        super(Deconvolution2DFunction, self).__init__(stride, pad, outsize,
                                                      **kwargs)
        self._init_gemm(scale_key, formats)
        if out_format is None and formats is not None:
            out_format = formats[0]
        self._init_output(output_scale, out_format, fit_output)

    def forward(self, inputs):
        ys = super(Deconvolution2DFunction, self).forward(inputs)
        # cover_all of the convolution this one transposes, from the output
        # size the forward found (Chainer computes it lazily in backward)
        if self.cover_all is None:
            self._set_cover_all(inputs[0].shape, inputs[1].shape)
        return ys

    def grad_input(self, x, W, gy, scale=1, fit=False):
        """(gx, the scale gx was produced at)."""
        node = Convolution2DFunction(
            stride=(self.sy, self.sx), pad=(self.ph, self.pw),
            cover_all=self.cover_all, dilate=(self.dy, self.dx),
            groups=self.groups, output_scale=scale,
            out_format=self.grad_format, fit_output=fit)
        gx, = node.apply((gy, W))
        return gx, node.applied_scale

    def grad_weight(self, x, W, gy, scale=1, fit=False):
        """(gW, the scale gW was produced at)."""
        node = Convolution2DGradW(self, W.shape, W.dtype, W.layout, scale,
                                  self.grad_format, fit, scaled_input=0)
        gW, = node.apply((gy, x))
        return gW, node.applied_scale


def convolution_2d(x, W, b=None, stride=1, pad=0, cover_all=False,
                   **kwargs):
    """Same as :func:`chainer.functions.convolution_2d` (the same keyword
    arguments ``dilate``, ``groups``, ``cudnn_fast``), through
    :class:`Convolution2DFunction`.

    Also ``scale_key`` (names the layer for layer-wise loss scales) and
    ``formats`` (the (forward, backward) format pair of an emulated
    precision).
    """
    dilate, groups, cudnn_fast, scale_key, formats = argument.parse_kwargs(
        kwargs, ('dilate', 1), ('groups', 1), ('cudnn_fast', False),
        ('scale_key', None), ('formats', None),
        deterministic=_DETERMINISTIC)
    func = Convolution2DFunction(stride, pad, cover_all, scale_key=scale_key,
                                 formats=formats, dilate=dilate,
                                 groups=groups, cudnn_fast=cudnn_fast)
    y, = func.apply((x, W) if b is None else (x, W, b))
    return y


def deconvolution_2d(x, W, b=None, stride=1, pad=0, outsize=None, **kwargs):
    """Same as :func:`chainer.functions.deconvolution_2d` (the same keyword
    arguments ``dilate``, ``groups``), through
    :class:`Deconvolution2DFunction`; ``scale_key`` and ``formats`` as for
    :func:`convolution_2d`."""
    dilate, groups, scale_key, formats = argument.parse_kwargs(
        kwargs, ('dilate', 1), ('groups', 1), ('scale_key', None),
        ('formats', None), deterministic=_DETERMINISTIC)
    func = Deconvolution2DFunction(stride, pad, outsize, scale_key=scale_key,
                                   formats=formats, dilate=dilate,
                                   groups=groups)
    y, = func.apply((x, W) if b is None else (x, W, b))
    return y
