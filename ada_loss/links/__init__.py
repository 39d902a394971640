"""GEMM links: drop-in replacements of ``chainer.links`` GEMM layers.

Same constructor arguments, attributes and parameter names (``W``, ``b``) as
their Chainer parents (and two GEMM links of transformers: :class:`MatMul`,
a GEMM of two activations, and :class:`TiedLinear`, a readout on another
link's weight); only ``forward`` differs: it goes through the
:mod:`ada_loss.functions` nodes, which emulate FP16 GEMMs on CPU and carry the
layer-wise loss scale of adaptive loss scaling.

:class:`BatchNormalization` (``chainer.links.BatchNormalization`` on
:func:`ada_loss.functions.batch_normalization`) computes mixed16's batch
normalization faster on CPU, with Chainer's results.
"""
from ada_loss.links.connection import (  # NOQA
    Convolution2D, Deconvolution2D, DilatedConvolution2D, Linear, MatMul,
    TiedLinear, GEMM_LINK_TYPES, as_chainer_link, as_gemm_link, is_gemm_link)
from ada_loss.links.normalization import (  # NOQA
    BatchNormalization, as_batch_normalization_link)
