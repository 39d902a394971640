"""2-D deconvolution (transposed convolution) GEMM."""
from chainer.functions.connection import deconvolution_2d as _deconv

from ada_loss.functions.convolution_2d import (
    Convolution2DFunction, Convolution2DGradW)
from ada_loss.functions.add import GradAccumulation
from ada_loss.functions.gemm import FP16Emulation, GemmFunction


class Deconvolution2DFunction(GradAccumulation, GemmFunction, FP16Emulation,
                              _deconv.Deconvolution2DFunction):

    bias_axis = (0, 2, 3)
    grad_input_axes = (1, 2, 3)   # W: (in, out/groups, kh, kw)

    def grad_input(self, x, W, gy, scale):
        if self.cover_all is None:
            self._set_cover_all(x.shape, W.shape)
        f = Convolution2DFunction(
            stride=(self.sy, self.sx), pad=(self.ph, self.pw),
            cover_all=self.cover_all, dilate=(self.dy, self.dx),
            groups=self.groups)
        f.output_scale = scale
        f.out_format = self.grad_format
        gx, = f.apply((gy, W))
        return gx

    def grad_weight(self, x, W, gy, scale=1, fit=False):
        if self.cover_all is None:
            self._set_cover_all(x.shape, W.shape)
        f = Convolution2DGradW(self, W.shape, W.dtype, W.layout)
        f.output_scale, f.scaled_input = scale, 0   # inputs (gy, x)
        f.out_format = self.grad_format
        f.fit_output = fit
        gW, = f.apply((gy, x))
        return gW, f


def deconvolution_2d(x, W, b=None, stride=1, pad=0, outsize=None, dilate=1,
                     groups=1, scale_key=None, formats=None):
    """Same as :func:`chainer.functions.deconvolution_2d`."""
    func = Deconvolution2DFunction(stride, pad, outsize, dilate=dilate,
                                   groups=groups)
    func.scale_key = scale_key
    if formats is not None:
        func.formats = formats
        func.out_format = formats[0]
    y, = func.apply((x, W) if b is None else (x, W, b))
    return y
