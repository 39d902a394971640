"""2-D convolution and deconvolution GEMMs (chainer.functions.convolution_2d,
deconvolution_2d).

Both node types live here because each is the other's input-gradient GEMM:
the input gradient of a convolution is a deconvolution of gy, and that of a
deconvolution a convolution of gy (as in Chainer).

MX blocks (scaled recipes, :mod:`ada_loss.formats.recipe`) run along tensor
axes, not along a convolution's im2col rows. The forward GEMM reduces over
C·kh·kw. In the channels-last im2col of tensor-core convolutions (NHWC, the
(kh, kw, C) order) blocks of 32 consecutive values of that reduction are 32
channels at one tap, i.e. blocks along C of the tensor itself, when C is a
multiple of 32 — and then each element of x has one quantized value,
whichever patches it is in, so Chainer's own convolution kernels run on the
dequantized tensors. Where C is not a multiple of 32 (the narrow nets here:
3, 4, 8, 16 channels) the last block along C is partial (C values at each
tap): a finer scale than hardware's blocks, which would span taps. dgrad
reduces over O·kh·kw: blocks along O. wgrad reduces over N·H'·W': gy in
blocks along its flattened (N, H', W'), as its im2col rows are; x in blocks
along its own (N, H, W), where the rows of its im2col (one per tap) are
shifted windows of it — the same blocks up to that shift and the padding.

NVFP4's random Hadamard transform on the wgrad operands needs the GEMM's
real reduction (the transform of x's own N·H·W would not cancel against
gy's through the shifted windows): :func:`_grad_weight_rht` materializes
the im2col matrix, as Chainer's own wgrad does, and runs the wgrad as a
matrix product of the transformed, cast matrices.
"""
import chainer
from chainer.functions.connection import convolution_2d as _conv
from chainer.utils import conv as _conv_utils
import numpy
from chainer.functions.connection import deconvolution_2d as _deconv
from chainer.utils import argument

from ada_loss.functions.add import GradAccumulation
from ada_loss.functions.gemm import GemmFunction, ScaledOutput
from ada_loss.functions.linear import LinearGradWeight
from ada_loss.loss_scale.gemm import grad_input_gain

_DETERMINISTIC = ('deterministic argument is not supported anymore. '
                  'Use chainer.using_config(\'cudnn_deterministic\', value) '
                  'context where value is either `True` or `False`.')


def _check_groups(node):
    scaling = node.scaling
    if scaling is not None and not scaling.per_tensor and node.groups != 1:
        raise ValueError(
            'MX, NVFP4 and blockwise precisions need groups=1 (got {}): a '
            'block along the '
            'channels would span several groups\' reductions'.format(
                node.groups))


def _im2col_rows_cpu(img, kh, kw, sy, sx, ph, pw, cover_all, dy, dx):
    """Chainer's ``im2col_cpu`` written straight into the layout the RHT
    wgrad needs, ``(C, kh, kw, N, H', W')`` (its ``(N, C, kh, kw, H', W')``
    with N moved behind the taps): the same values (copies of x and zero
    padding), one pass instead of im2col and a transposing copy of its
    kh·kw-times-x result."""
    n, c, h, w = img.shape
    out_h = _conv_utils.get_conv_outsize(h, kh, sy, ph, cover_all, dy)
    out_w = _conv_utils.get_conv_outsize(w, kw, sx, pw, cover_all, dx)
    img = numpy.pad(img, ((0, 0), (0, 0), (ph, ph + sy - 1),
                          (pw, pw + sx - 1)), mode='constant')
    img = img.transpose(1, 0, 2, 3)
    col = numpy.empty((c, kh, kw, n, out_h, out_w), img.dtype)
    for j in range(kh):
        jdy = j * dy
        for i in range(kw):
            idx = i * dx
            col[:, j, i] = img[:, :, jdy:jdy + sy * out_h:sy,
                               idx:idx + sx * out_w:sx]
    return col


def _grad_weight_rht(node, a, b, W, grad_is_a, scale, fit):
    """The weight gradient of a convolution-shaped wgrad under NVFP4's RHT:
    ``gW = b_matᵀ · im2col(a)_mat`` (Chainer's Convolution2DGradW with
    inputs (a, b): a convolution's (x, gy), a deconvolution's (gy, x)),
    both matrices rows = N·H'·W' (the reduction), cast by the recipe's
    :meth:`~ada_loss.formats.recipe.GemmScaling.quantize_wgrad` (the
    gradient stochastically: ``grad_is_a`` says which one it is).
    Returns (gW of W's shape, the scale it was produced at)."""
    xp = chainer.backend.get_array_module(a)
    kh, kw = W.shape[2:]
    n, c = a.shape[:2]
    if xp is numpy:
        col = _im2col_rows_cpu(a, kh, kw, node.sy, node.sx, node.ph,
                               node.pw, node.cover_all, node.dy, node.dx)
    else:
        col = _conv_utils.im2col_gpu(
            a, kh, kw, node.sy, node.sx, node.ph, node.pw,
            cover_all=node.cover_all, dy=node.dy,
            dx=node.dx).transpose(1, 2, 3, 0, 4, 5)
    ho, wo = col.shape[4:]
    # both matrices with the reduction N·H'·W' last: (C·kh·kw, R), (O, R)
    a_t = xp.ascontiguousarray(col).reshape(c * kh * kw, n * ho * wo)
    b_t = xp.ascontiguousarray(b.transpose(1, 0, 2, 3)).reshape(
        b.shape[1], n * ho * wo)
    if grad_is_a:
        a_q, b_q = node.scaling.quantize_wgrad(a_t, b_t)
    else:
        b_q, a_q = node.scaling.quantize_wgrad(b_t, a_t)
    gw_node = LinearGradWeight(W.dtype, scale, node.grad_format, fit)
    gW, = gw_node.apply((a_q.T, b_q.T))        # b_q · a_qᵀ
    return chainer.functions.reshape(gW, W.shape), gw_node.applied_scale


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
    # x (N, C, H, W), W (O, C, kh, kw), gy (N, O, H', W'). MX blocks run
    # along C (the forward), O (dgrad) and N·H·W (wgrad) of each tensor:
    # see the module docstring.
    reduction_axes = {'fwd': ((1,), (1,)), 'dgrad': ((1,), (0,)),
                      'wgrad': ((0, 2, 3), (0, 2, 3))}

    def __init__(self, stride=1, pad=0, cover_all=False, scale_key=None,
                 formats=None, output_scale=1, out_format=None,
                 fit_output=False, scaling=None, **kwargs):
        super(Convolution2DFunction, self).__init__(stride, pad, cover_all,
                                                    **kwargs)
        self._init_gemm(scale_key, formats, scaling)
        _check_groups(self)
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

    def grad_weight_rht(self, x, W, gy, scale=1, fit=False):
        """(gW, its scale) on the Hadamard-transformed im2col matrices
        (NVFP4; arrays in)."""
        return _grad_weight_rht(self, x, gy, W, False, scale, fit)


class Deconvolution2DFunction(GradAccumulation, GemmFunction, ScaledOutput,
                              _deconv.Deconvolution2DFunction):
    """Chainer's ``Deconvolution2DFunction`` with FP16 emulation, an
    emulated precision's rounding and the scaled backward of
    :class:`GemmFunction`; arguments as :class:`Convolution2DFunction`'s."""

    bias_axis = (0, 2, 3)
    grad_input_axes = (1, 2, 3)   # W: (in, out/groups, kh, kw)
    # x (N, C, H, W), W (C, O, kh, kw), gy (N, O, H', W'): the forward sums
    # C, dgrad (a convolution of gy) O, wgrad N·H·W
    reduction_axes = {'fwd': ((1,), (0,)), 'dgrad': ((1,), (1,)),
                      'wgrad': ((0, 2, 3), (0, 2, 3))}

    def __init__(self, stride=1, pad=0, outsize=None, scale_key=None,
                 formats=None, output_scale=1, out_format=None,
                 fit_output=False, scaling=None, **kwargs):
        super(Deconvolution2DFunction, self).__init__(stride, pad, outsize,
                                                      **kwargs)
        self._init_gemm(scale_key, formats, scaling)
        _check_groups(self)
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

    def grad_weight_rht(self, x, W, gy, scale=1, fit=False):
        """(gW, its scale) on the Hadamard-transformed im2col matrices
        (NVFP4; arrays in)."""
        return _grad_weight_rht(self, gy, x, W, True, scale, fit)


def convolution_2d(x, W, b=None, stride=1, pad=0, cover_all=False,
                   **kwargs):
    """Same as :func:`chainer.functions.convolution_2d` (the same keyword
    arguments ``dilate``, ``groups``, ``cudnn_fast``), through
    :class:`Convolution2DFunction`.

    Also ``scale_key`` (names the layer for layer-wise loss scales),
    ``formats`` (the (forward, backward) format pair of an emulated
    precision) and ``scaling`` (the layer's
    :class:`ada_loss.formats.recipe.GemmScaling` under a scaled recipe).
    """
    dilate, groups, cudnn_fast, scale_key, formats, scaling = \
        argument.parse_kwargs(
            kwargs, ('dilate', 1), ('groups', 1), ('cudnn_fast', False),
            ('scale_key', None), ('formats', None), ('scaling', None),
            deterministic=_DETERMINISTIC)
    func = Convolution2DFunction(stride, pad, cover_all, scale_key=scale_key,
                                 formats=formats, dilate=dilate,
                                 groups=groups, cudnn_fast=cudnn_fast,
                                 scaling=scaling)
    y, = func.apply((x, W) if b is None else (x, W, b))
    return y


def deconvolution_2d(x, W, b=None, stride=1, pad=0, outsize=None, **kwargs):
    """Same as :func:`chainer.functions.deconvolution_2d` (the same keyword
    arguments ``dilate``, ``groups``), through
    :class:`Deconvolution2DFunction`; ``scale_key``, ``formats`` and
    ``scaling`` as for
    :func:`convolution_2d`."""
    dilate, groups, scale_key, formats, scaling = argument.parse_kwargs(
        kwargs, ('dilate', 1), ('groups', 1), ('scale_key', None),
        ('formats', None), ('scaling', None), deterministic=_DETERMINISTIC)
    func = Deconvolution2DFunction(stride, pad, outsize, scale_key=scale_key,
                                   formats=formats, dilate=dilate,
                                   groups=groups, scaling=scaling)
    y, = func.apply((x, W) if b is None else (x, W, b))
    return y
