"""GEMM links: drop-in replacements of ``chainer.links`` GEMM layers.

Same constructor arguments, attributes and parameter names (``W``, ``b``) as
their Chainer parents; only ``forward`` differs: it goes through the
:mod:`ada_loss.functions` nodes, which emulate FP16 GEMMs on CPU and carry the
layer-wise loss scale of adaptive loss scaling.
"""
from ada_loss.links.connection import (  # NOQA
    Convolution2D, Deconvolution2D, DilatedConvolution2D, Linear,
    GEMM_LINK_TYPES, as_gemm_link)
