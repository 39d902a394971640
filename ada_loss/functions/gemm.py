"""Shared machinery of the GEMM function nodes.

Two mixins over Chainer's own GEMM kernels (so no convolution is re-implemented
here):

* :class:`FP16Emulation` runs a node's forward in FP32 on widened FP16 inputs
  and rounds the result to FP16 (the tensor-core numerics), and applies an
  ``output_scale`` (a power of two) that a layer-wise loss scale needs.
* :class:`GemmFunction` marks the forward GEMM of a layer: it knows its weight,
  and its backward computes the input gradient scaled by ``grad_input_scale``
  (β of Algorithm 3) while the weight and bias gradients keep the incoming
  scale α.
"""
import numpy

import chainer
from chainer import backend
from chainer import function_node

from ada_loss.formats.widen import widen
from ada_loss.loss_scale.gemm import grad_input_gain
from ada_loss.functions.fp16_gemm import emulates_fp16_gemm, round_to


class FP16Emulation(object):
    """Mixin: FP32-accumulated forward for FP16 NumPy inputs.

    Attributes:
        output_scale: power-of-two factor applied to the result. Emulated, it
            multiplies the FP32 accumulator before rounding; otherwise it
            pre-scales the input ``scaled_input`` (the node must be linear in
            that input: only gradient GEMMs, which have no bias, use it).
    """

    output_scale = 1
    scaled_input = 0

    def forward(self, inputs):
        if emulates_fp16_gemm(inputs):
            wide = tuple(None if a is None else widen(a) for a in inputs)
            ys = super(FP16Emulation, self).forward(wide)
            return tuple(round_to(y, numpy.float16, self.output_scale)
                         for y in ys)
        if self.output_scale != 1:
            i = self.scaled_input
            a = inputs[i]
            if a.dtype == numpy.float16:
                # β may lie outside FP16's range (numpy.float16(2^16) is
                # inf, numpy.float16(2^-25) is 0): multiply in FP32 and round
                # once, which is exact wherever the product is representable.
                a = (a.astype(numpy.float32)
                     * numpy.float32(self.output_scale)).astype(a.dtype)
            else:
                a = a * a.dtype.type(self.output_scale)
            inputs = inputs[:i] + (a,) + inputs[i + 1:]
        return super(FP16Emulation, self).forward(inputs)


class BiasGrad(function_node.FunctionNode):
    """Bias gradient: ``gy`` summed over ``axis``, accumulated in FP32."""

    def __init__(self, axis):
        self.axis = axis

    def forward(self, inputs):
        gy, = inputs
        self._shape = gy.shape
        if gy.dtype == numpy.float16:
            return gy.sum(axis=self.axis, dtype=numpy.float32).astype(
                gy.dtype),
        return gy.sum(axis=self.axis),

    def backward(self, indexes, grad_outputs):
        ggb, = grad_outputs
        shape = [1] * len(self._shape)
        shape[1] = -1   # the channel axis (1 for Linear and convolutions)
        return chainer.functions.broadcast_to(
            ggb.reshape(shape), self._shape),


def bias_grad(gy, axis):
    return BiasGrad(axis).apply((gy,))[0]


class GemmFunction(object):
    """Mixin of the forward node of a GEMM layer (Linear, Conv, Deconv).

    ``scale_key`` names the layer (its path in the model, set by the link) so
    that loss-scale records and the update-interval cache of adaptive loss
    scaling are per layer. ``grad_input_scale`` is β_i of Algorithm 3: the
    adaptive backward sets it just before calling :meth:`backward`; it scales
    the input gradient only (a power of two, hence exact).
    """

    scale_key = None
    grad_input_scale = 1

    #: axes of W the input-gradient GEMM sums over (see grad_input_gain)
    grad_input_axes = None

    def gemm_weight(self):
        """The weight array W used by this GEMM (Algorithm 4)."""
        return self.get_retained_inputs()[1].array

    def grad_input_gain(self, W):
        """max over input units of Σ|W| over the entries that feed it in the
        backward: max|gx| ≤ max|gy| · gain (the ``'output'`` bound)."""
        return grad_input_gain(W, self.grad_input_axes)

    def backward(self, indexes, grad_outputs):
        x, W = self.get_retained_inputs()
        gy, = grad_outputs
        ret = []
        if 0 in indexes:
            ret.append(self.grad_input(x, W, gy, self.grad_input_scale))
        if 1 in indexes:
            ret.append(self.grad_weight(x, W, gy))
        if 2 in indexes:
            ret.append(bias_grad(gy, self.bias_axis))
        return ret


def gemm_function_types():
    """All :class:`GemmFunction` node types."""
    return tuple(GemmFunction.__subclasses__())


def is_cpu_fp16(*arrays):
    return all(isinstance(a, numpy.ndarray) for a in arrays) and any(
        a.dtype == numpy.float16 for a in arrays)


def xp_of(*arrays):
    return backend.get_array_module(*arrays)
