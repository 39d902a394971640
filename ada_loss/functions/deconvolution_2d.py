"""2-D deconvolution (transposed convolution) GEMM.

The node is defined beside the convolution's in
:mod:`ada_loss.functions.convolution_2d` (each is the other's input-gradient
GEMM); this module is where Chainer users look for it.
"""
from ada_loss.functions.convolution_2d import (  # NOQA
    Deconvolution2DFunction, deconvolution_2d)
