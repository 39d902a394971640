"""2-D convolution GEMM (chainer.functions.convolution_2d)."""
from chainer.functions.connection import convolution_2d as _conv

from ada_loss.functions.add import GradAccumulation
from ada_loss.functions.gemm import FP16Emulation, GemmFunction
from ada_loss.loss_scale.gemm import grad_input_gain


class Convolution2DGradW(FP16Emulation, _conv.Convolution2DGradW):
    """gW of a convolution (also of a deconvolution, with x and gy swapped)."""


class Convolution2DFunction(GradAccumulation, GemmFunction, FP16Emulation,
                            _conv.Convolution2DFunction):

    bias_axis = (0, 2, 3)

    def grad_input_gain(self, W):
        # W: (out, in/groups, kh, kw); input channel c' of group k gets
        # gradient from the outputs of group k only.
        out, cin, kh, kw = W.shape
        Wg = W.reshape(self.groups, out // self.groups, cin, kh, kw)
        return grad_input_gain(Wg, (1, 3, 4))

    def grad_input(self, x, W, gy, scale):
        from ada_loss.functions.deconvolution_2d import Deconvolution2DFunction
        f = Deconvolution2DFunction(
            stride=(self.sy, self.sx), pad=(self.ph, self.pw),
            outsize=x.shape[2:], dilate=(self.dy, self.dx),
            groups=self.groups)
        f.output_scale = scale
        f.out_format = self.grad_format
        gx, = f.apply((gy, W))
        return gx

    def grad_weight(self, x, W, gy, scale=1, fit=False):
        f = Convolution2DGradW(self, W.shape, W.dtype, W.layout)
        f.output_scale, f.scaled_input = scale, 1   # inputs (x, gy)
        f.out_format = self.grad_format
        f.fit_output = fit
        gW, = f.apply((x, gy))
        return gW, f


def convolution_2d(x, W, b=None, stride=1, pad=0, cover_all=False,
                   dilate=1, groups=1, scale_key=None, formats=None):
    """Same as :func:`chainer.functions.convolution_2d`."""
    func = Convolution2DFunction(stride, pad, cover_all, dilate=dilate,
                                 groups=groups)
    func.scale_key = scale_key
    if formats is not None:
        func.formats = formats
        func.out_format = formats[0]
    y, = func.apply((x, W) if b is None else (x, W, b))
    return y
