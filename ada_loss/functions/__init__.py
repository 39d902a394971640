"""Chainer ``FunctionNode``s of the GEMM layers, scale-aware and FP16-emulating.

Drop-in replacements of ``chainer.functions.linear``, ``convolution_2d`` and
``deconvolution_2d``, and :func:`matmul`, the GEMM of two activations
(attention's Q·Kᵀ and P·V, a scale for each input gradient): same arguments, same results in float32, Chainer's
dtype contract for mixed float16/32/64 inputs. On float16 NumPy arrays they
compute with FP32 accumulation (see :mod:`ada_loss.functions.fp16_gemm`),
and their backward honours a layer-wise loss scale β for the input gradient
(Algorithm 3; :meth:`GemmFunction.backward_scaled`).

The element-wise nodes of mixed16 — :func:`relu`, :func:`add`,
:func:`batch_normalization` — give Chainer's float16 results bit for bit,
faster on NumPy (see :mod:`ada_loss.functions.fp16_elementwise`).
"""
from ada_loss.functions.gemm import (  # NOQA
    GemmFunction, GemmGrads, Quantize, gemm_function_types, quantize)
from ada_loss.functions.linear import LinearFunction, linear  # NOQA
from ada_loss.functions.matmul import MatMulFunction, matmul  # NOQA
from ada_loss.functions.gelu import gelu  # NOQA
from ada_loss.functions.convolution_2d import (  # NOQA
    Convolution2DFunction, Deconvolution2DFunction, convolution_2d,
    deconvolution_2d)
from ada_loss.functions.add import add  # NOQA
from ada_loss.functions.batch_normalization import (  # NOQA
    batch_normalization)
from ada_loss.functions.relu import relu  # NOQA
