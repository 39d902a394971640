"""Shared machinery of the GEMM function nodes.

Two mixins over Chainer's own GEMM kernels (so no convolution is re-implemented
here):

* :class:`FP16Emulation` runs a node's forward in FP32 on widened FP16 inputs
  and rounds the result to FP16 (the tensor-core numerics); on float32 arrays
  with an ``out_format`` (an emulated precision: bfloat16, FP8, any e<E>m<M>)
  it rounds the FP32 result to that format instead; and it applies an
  ``output_scale`` (a power of two) that a layer-wise loss scale needs.
* :class:`GemmFunction` marks the forward GEMM of a layer: it knows its weight,
  and its backward computes the input gradient scaled by ``grad_input_scale``
  (β of Algorithm 3) while the weight and bias gradients keep the incoming
  scale α.
"""
import numpy

import chainer
from chainer import backend
from chainer.backends import cuda
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
    #: FloatFormat the FP32 result is rounded to (emulated precisions), or None
    out_format = None
    #: if True, an accumulator that would overflow the output format is
    #: first scaled down by the power of two that fits it (per-tensor
    #: "current" scaling of the output, exact); ``applied_scale`` is then
    #: output_scale times that factor. Used for weight gradients in the
    #: ⟨α, δ⟩ backward, whose leaves carry their own scale.
    fit_output = False
    applied_scale = None

    def _fit(self, y, u_max):
        scale = self.output_scale
        if self.fit_output:
            peak = float(abs(y).max()) if y.size else 0.0
            while peak * scale >= u_max and numpy.isfinite(peak) and \
                    scale > 2.0 ** -126:
                scale /= 2.0
        self.applied_scale = scale
        return scale

    def forward(self, inputs):
        if self.out_format is not None and inputs[0].dtype == numpy.float32:
            # Emulated format: FP32 storage, FP32 accumulation (inputs were
            # rounded to the format by the caller), one rounding of the
            # scaled accumulator to the format: what hardware with FP32
            # accumulators stores.
            ys = super(FP16Emulation, self).forward(inputs)
            return tuple(round_to_format(
                y, self.out_format, self._fit(y, self.out_format.u_max))
                for y in ys)
        if emulates_fp16_gemm(inputs):
            wide = tuple(None if a is None else widen(a) for a in inputs)
            ys = super(FP16Emulation, self).forward(wide)
            return tuple(round_to(y, numpy.float16, self._fit(y, 65504.0))
                         for y in ys)
        self.applied_scale = self.output_scale
        if is_device_scalar(self.output_scale):
            # A scale kept on the device (the ⟨α, δ⟩ backward on CuPy): one
            # kernel, FP32 product rounded once, no host synchronization.
            from ada_loss.loss_scale import device
            i = self.scaled_input
            inputs = inputs[:i] + (device.rescale(inputs[i],
                                                  self.output_scale),) \
                + inputs[i + 1:]
        elif self.output_scale != 1:
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


def is_device_scalar(scale):
    """Whether a loss scale is a 0-d device array (not a Python number)."""
    return isinstance(scale, cuda.ndarray)


def round_to_format(y, fmt, scale=1):
    """``scale · y`` (FP32, a power of two: exact) rounded to ``fmt``."""
    if is_device_scalar(scale):
        from ada_loss.loss_scale import device
        y = device.rescale(y, scale)
    elif scale != 1:
        y = y * numpy.float32(scale)
    return fmt.quantize(y)


class Quantize(function_node.FunctionNode):
    """Rounds a float32 array to a format (FP32 storage); the backward passes
    the gradient through unchanged, as a cast does: the gradient with respect
    to a stored low-precision copy is the gradient of its FP32 source."""

    def __init__(self, fmt):
        self.fmt = fmt

    def forward(self, inputs):
        x, = inputs
        return self.fmt.quantize(x),

    def backward(self, indexes, grad_outputs):
        return grad_outputs


def quantize(x, fmt):
    """``x`` rounded to ``fmt`` (a no-op for None or a float32 format)."""
    if fmt is None or fmt.is_float32 or x is None:
        return x
    return Quantize(fmt).apply((x,))[0]


class BiasGrad(function_node.FunctionNode):
    """Bias gradient: ``gy`` summed over ``axis``, accumulated in FP32, then
    rounded to ``out_format`` if one is given (emulated precisions)."""

    def __init__(self, axis, out_format=None, scale=1):
        self.axis = axis
        self.out_format = out_format
        self.scale = scale

    def forward(self, inputs):
        gy, = inputs
        self._shape = gy.shape
        if self.out_format is not None and gy.dtype == numpy.float32:
            return round_to_format(chainer.utils.force_array(
                gy.sum(axis=self.axis)), self.out_format, self.scale),
        if gy.dtype == numpy.float16:
            return round_to(gy.sum(axis=self.axis, dtype=numpy.float32),
                            gy.dtype, self.scale),
        s = gy.sum(axis=self.axis)
        if is_device_scalar(self.scale):
            from ada_loss.loss_scale import device
            return device.rescale(s, self.scale),
        return s if self.scale == 1 else s * s.dtype.type(self.scale),

    def backward(self, indexes, grad_outputs):
        ggb, = grad_outputs
        shape = [1] * len(self._shape)
        shape[1] = -1   # the channel axis (1 for Linear and convolutions)
        return chainer.functions.broadcast_to(
            ggb.reshape(shape), self._shape),


def bias_grad(gy, axis, out_format=None, scale=1):
    return BiasGrad(axis, out_format, scale).apply((gy,))[0]


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
    #: γ ≤ 1 of the weight and bias gradients (a power of two; the amax
    #: rule lowers it where they would overflow), set like grad_input_scale
    grad_weight_scale = 1
    #: set by the ⟨α, δ⟩ backward: fit the weight gradient into the format
    #: (FP16Emulation.fit_output); ``weight_grad_scale`` is then the scale
    #: the weight gradient was produced at (relative to the incoming α)
    fit_weight_grad = False
    weight_grad_scale = 1
    #: (forward format, backward format) of an emulated precision, or None.
    #: The caller rounds x, W, b to the forward format; this node rounds its
    #: output to it, and in the backward rounds the incoming gradient and
    #: every gradient it produces to the backward format.
    formats = None

    @property
    def grad_format(self):
        return None if self.formats is None else self.formats[1]

    def quantize_grad_output(self, gy):
        """The incoming gradient as stored in the backward format (a
        Variable; the same one when there is nothing to round)."""
        fmt = self.grad_format
        if fmt is None or fmt.is_float32 or gy is None or getattr(
                gy, '_ada_quantized', None) is fmt:
            return gy
        q = chainer.Variable(fmt.quantize(gy.array), requires_grad=False)
        q._ada_quantized = fmt   # idempotent: not rounded twice
        return q

    #: axes of W the input-gradient GEMM sums over (see grad_input_gain)
    grad_input_axes = None

    def gemm_weight(self):
        """The weight array W used by this GEMM (Algorithm 4)."""
        return self.get_retained_inputs()[1].array

    def grad_input_gain(self, W):
        """max over input units of Σ|W| over the entries that feed it in the
        backward: max|gx| ≤ max|gy| · gain (the ``'output'`` bound)."""
        return grad_input_gain(W, self.grad_input_axes)

    def grad_weight_gain(self, x, gy):
        """A factor with max|gW|, max|gb| ≤ max|gy| · gain: the largest
        Σ|x| over the axes the weight-gradient GEMM sums (batch and space),
        or the number of terms of the bias sum."""
        axes = (0,) if x.ndim == 2 else (0, 2, 3)
        return max(grad_input_gain(x, axes), gy.size // gy.shape[1])

    def backward(self, indexes, grad_outputs):
        x, W = self.get_retained_inputs()
        gy = self.quantize_grad_output(grad_outputs[0])
        ret = []
        if 0 in indexes:
            ret.append(self.grad_input(x, W, gy, self.grad_input_scale))
        self.weight_grad_scale = self.grad_weight_scale
        if 1 in indexes:
            gW, node = self.grad_weight(x, W, gy, self.grad_weight_scale,
                                        self.fit_weight_grad)
            ret.append(gW)
            if node.applied_scale is not None:
                self.weight_grad_scale = node.applied_scale
        if 2 in indexes:
            # the bias gradient shares the weight gradient's scale
            ret.append(bias_grad(gy, self.bias_axis, self.grad_format,
                                 self.weight_grad_scale))
        return ret


def gemm_function_types():
    """All :class:`GemmFunction` node types."""
    return tuple(GemmFunction.__subclasses__())


def is_cpu_fp16(*arrays):
    return all(isinstance(a, numpy.ndarray) for a in arrays) and any(
        a.dtype == numpy.float16 for a in arrays)


def xp_of(*arrays):
    return backend.get_array_module(*arrays)
