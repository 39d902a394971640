"""Shared machinery of the GEMM function nodes.

Two mixins over Chainer's own GEMM kernels (so no convolution is re-implemented
here). As in Chainer, a node's settings are its constructor arguments; nothing
is set on a node after it is built.

* :class:`ScaledOutput` runs a node's forward in FP32 on widened FP16 inputs
  and rounds the result once (the tensor-core numerics); on float32 arrays
  with an ``out_format`` (an emulated precision: bfloat16, FP8, any e<E>m<M>)
  it rounds the FP32 result to that format instead; and it multiplies the
  result by the ``output_scale`` (a power of two) that a layer-wise loss
  scale needs (paper §3.1: β·g enters the GEMM, Algorithm 3).
* :class:`GemmFunction` marks the forward GEMM of a layer: it knows its weight,
  and :meth:`GemmFunction.backward_scaled` computes the input gradient at the
  layer-wise scale β (Algorithm 3) and the weight and bias gradients at the
  incoming scale α (times γ ≤ 1 where they would overflow), returning the
  gradients and the scale they were produced at.

Dtypes follow Chainer's contract: a GEMM's output has x's dtype, and each
gradient has the dtype of its own input, whatever the mix of float16,
float32 and float64 inputs.
"""
import collections
import math

import numpy

import chainer
from chainer import function_node

from ada_loss.formats import get_format
from ada_loss.formats.widen import widen
from ada_loss.functions.fp16_gemm import emulates_fp16_gemm, round_to
from ada_loss.functions.scales import (  # NOQA (is_device_scalar re-exported)
    device_kernels, is_device_scalar, scaled)
from ada_loss.loss_scale.fit import fit_ratio
from ada_loss.loss_scale.gemm import grad_input_gain, max_abs

_FLOAT16 = get_format('float16')


def _fit_ratio(y, scale, fmt):
    """The power of two (≤ 1) by which ``scale · y`` must be lowered so
    that rounding it to ``fmt`` does not overflow; 1 for an empty or
    non-finite ``y`` (nothing a power of two could fit). On a device array:
    a 0-d device array, decided on the device (no host read)."""
    if not isinstance(y, numpy.ndarray):
        device = device_kernels()
        return device.fit_ratio(device.max_abs(y), fmt, scale)
    peak = max_abs(y) * float(scale)
    if not math.isfinite(peak):
        return 1.0
    return fit_ratio(peak, fmt)


def _widened(inputs):
    """The inputs with float16 NumPy arrays widened (exactly) to float32, or
    to float64 where another input is float64, so that the GEMM accumulates
    in the precision NumPy itself would promote the mixed inputs to."""
    wide64 = any(a is not None and a.dtype == numpy.float64 for a in inputs)

    def up(a):
        if a is None or a.dtype != numpy.float16:
            return a
        return a.astype(numpy.float64) if wide64 else widen(a)
    return tuple(up(a) for a in inputs)


class ScaledOutput(object):
    """Mixin of a GEMM ``FunctionNode``: scaled, rounded forward.

    Settings (constructor arguments of each node, see :meth:`_init_output`):

    * ``output_scale``: power-of-two factor applied to the result. Emulated
      (FP16 or a format) it multiplies the FP32 accumulator before rounding;
      otherwise it pre-scales the input ``scaled_input`` (the node must be
      linear in that input: only gradient GEMMs, which have no bias, use it).
    * ``out_format``: FloatFormat the FP32 result is rounded to (emulated
      precisions), or None.
    * ``fit_output``: if True, an accumulator that would overflow the output
      format is first scaled down by the power of two that fits it
      (per-tensor "current" scaling of the output, exact). Used for weight
      gradients in the ⟨α, δ⟩ backward, whose leaves carry their own scale.

    Result: ``applied_scale``, set by the forward, is the scale the output
    was produced at (``output_scale`` times the fitting factor).
    """

    output_scale = 1
    scaled_input = 0
    out_format = None
    fit_output = False
    applied_scale = None

    def _init_output(self, output_scale=1, out_format=None, fit_output=False,
                     scaled_input=None):
        self.output_scale = output_scale
        self.out_format = out_format
        self.fit_output = bool(fit_output)
        if scaled_input is not None:
            self.scaled_input = scaled_input

    def result_dtype(self, inputs):
        """The dtype Chainer's node gives its output for ``inputs`` (x's)."""
        return inputs[0].dtype

    def forward_accumulator(self, inputs):
        """Chainer's forward on widened inputs, giving the FP32 (or FP64)
        accumulator. Nodes whose Chainer forward casts the result to a
        stored dtype (the weight gradients: W's) override it so that the
        scale and the one rounding apply to the accumulator itself."""
        return super(ScaledOutput, self).forward(inputs)

    def backward(self, indexes, grad_outputs):
        # The node computes output_scale · f(inputs): Chainer's gradients of
        # f, times the scale (used by double backprop only; the ⟨α, δ⟩
        # backward does not differentiate its gradient GEMMs).
        return _times(super(ScaledOutput, self).backward(
            indexes, grad_outputs), self.output_scale)

    def _fit(self, y, fmt):
        """The scale ``y`` (the FP32 accumulator) is rounded to ``fmt`` at:
        ``output_scale``, lowered with ``fit_output`` by the largest power
        of two that keeps the *rounded* result from overflowing
        (:func:`~ada_loss.loss_scale.fit.fit_ratio`: a result that rounds
        to a finite value is left alone, even at u_max)."""
        scale = self.output_scale
        if self.fit_output:
            scale = scale * _fit_ratio(y, scale, fmt)
        self.applied_scale = scale
        return scale

    def forward(self, inputs):
        if self.out_format is not None and inputs[0].dtype == numpy.float32:
            # Emulated format: FP32 storage, FP32 accumulation (inputs were
            # rounded to the format by the caller), one rounding of the
            # scaled accumulator to the format: what hardware with FP32
            # accumulators stores.
            ys = super(ScaledOutput, self).forward(inputs)
            return tuple(round_to_format(
                y, self.out_format, self._fit(y, self.out_format))
                for y in ys)
        if emulates_fp16_gemm(inputs):
            dtype = self.result_dtype(inputs)
            ys = self.forward_accumulator(_widened(inputs))
            if dtype == numpy.float16:
                return tuple(round_to(y, dtype, self._fit(y, _FLOAT16))
                             for y in ys)
            # Mixed dtypes with a wider result: NumPy would widen the FP16
            # operand exactly, as done here; then Chainer's result dtype.
            self.applied_scale = self.output_scale
            return tuple(scaled(y, self.output_scale).astype(dtype,
                                                             copy=False)
                         for y in ys)
        self.applied_scale = self.output_scale
        if is_device_scalar(self.output_scale) or self.output_scale != 1:
            # On a device: one kernel, FP32 product rounded once, no host
            # synchronization.
            i = self.scaled_input
            inputs = inputs[:i] + (scaled(inputs[i], self.output_scale),) \
                + inputs[i + 1:]
        return super(ScaledOutput, self).forward(inputs)


def _times(grads, scale):
    """Gradient Variables times a power-of-two number ``scale``, the exact
    product rounded once (as :func:`~ada_loss.functions.scales.scaled`)."""
    if is_device_scalar(scale) or scale == 1:
        return grads
    return tuple(None if g is None else _times_one(g, scale) for g in grads)


def _times_one(g, scale):
    with numpy.errstate(over='ignore', under='ignore'):
        held = float(g.dtype.type(scale)) == scale
    if held:
        return g * scale
    # Chainer's g * scale casts the constant to g's dtype first: 2^130 is
    # inf in float32, 2^20 in float16, 2^-150 is 0. In float64 the product
    # of a float32 (or float16) value and any power of two a double holds
    # is exact; cast back, it is rounded once.
    F = chainer.functions
    return F.cast(F.cast(g, numpy.float64) * scale, g.dtype)


def round_to_format(y, fmt, scale=1):
    """``scale · y`` (FP32, a power of two: exact) rounded to ``fmt``."""
    return fmt.quantize(scaled(y, scale))


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
    """Bias gradient: ``scale · Σ gy`` over ``axis``, accumulated in FP32 for
    float16, then rounded to ``out_format`` if one is given (emulated
    precisions). Its dtype is gy's (Chainer requires b's dtype to be x's).

    ``fit_output``: as :class:`ScaledOutput`'s, a sum whose rounding to the
    stored format (``out_format``, FP16 for float16) would overflow is
    produced at ``scale`` lowered by a power of two; ``applied_scale`` is
    the scale it was produced at."""

    def __init__(self, axis, out_format=None, scale=1, fit_output=False):
        self.axis = axis
        self.out_format = out_format
        self.scale = scale
        self.fit_output = bool(fit_output)
        self.applied_scale = scale

    def _fitted(self, acc, fmt):
        if self.fit_output:
            self.applied_scale = self.scale * _fit_ratio(acc, self.scale,
                                                         fmt)
        return self.applied_scale

    def forward(self, inputs):
        gy, = inputs
        self._shape = gy.shape
        if self.out_format is not None and gy.dtype == numpy.float32:
            acc = chainer.utils.force_array(gy.sum(axis=self.axis))
            return round_to_format(acc, self.out_format,
                                   self._fitted(acc, self.out_format)),
        if gy.dtype == numpy.float16:
            acc = gy.sum(axis=self.axis, dtype=numpy.float32)
            return round_to(acc, gy.dtype, self._fitted(acc, _FLOAT16)),
        return scaled(chainer.utils.force_array(gy.sum(axis=self.axis)),
                      self.scale),

    def backward(self, indexes, grad_outputs):
        ggb, = grad_outputs
        shape = [1] * len(self._shape)
        shape[1] = -1   # the channel axis (1 for Linear and convolutions)
        return _times((chainer.functions.broadcast_to(
            ggb.reshape(shape), self._shape),), self.scale)


def bias_grad(gy, axis, out_format=None, scale=1, fit=False):
    """(gb, the scale gb was produced at): see :class:`BiasGrad`."""
    node = BiasGrad(axis, out_format, scale, fit)
    gb, = node.apply((gy,))
    return gb, node.applied_scale


#: What :meth:`GemmFunction.backward_scaled` returns: the gradients (one per
#: requested input, in order) and the scales the input gradient and the
#: weight and bias gradients were produced at, relative to the incoming
#: gradient's.
GemmGrads = collections.namedtuple(
    'GemmGrads', ('grads', 'input_grad_scale', 'weight_grad_scale'))


class GemmSettings(object):
    """What every scale-aware GEMM node shares, a layer's GEMM
    (:class:`GemmFunction`: activation × weight) or an activation ×
    activation GEMM (:class:`ada_loss.functions.matmul.MatMulFunction`):
    its layer name, the formats of an emulated precision, the scaled
    recipe's state, and the rounding or cast of its incoming gradient.

    * ``scale_key`` names the layer (its path in the model, given by the
      link) so that loss-scale records and the update-interval cache of
      adaptive loss scaling are per layer;
    * ``formats``: (forward format, backward format) of an emulated
      precision, or None;
    * ``scaling``: the layer's :class:`ada_loss.formats.recipe.GemmScaling`
      under a scaled recipe, or None.
    """

    scale_key = None
    formats = None
    #: the layer's :class:`ada_loss.formats.recipe.GemmScaling` under a
    #: scaled recipe (per-tensor FP8, MX), or None
    scaling = None

    def _init_gemm(self, scale_key=None, formats=None, scaling=None):
        self.scale_key = scale_key
        self.formats = None if formats is None else tuple(formats)
        self.scaling = scaling

    @property
    def grad_format(self):
        """The format the gradients this node produces are rounded to (and,
        unless a scaled recipe casts it, its incoming gradient), or None."""
        return None if self.formats is None else self.formats[1]

    @property
    def stored_grad_format(self):
        """The format the incoming gradient is stored in, *unscaled*, as
        the loss scale carries it (what overflow checks compare it with):
        the recipe's gradient element format under ``grad=loss``, else
        :attr:`grad_format` (None under a scaled recipe with FP32 outputs:
        there the recipe's own scale fits gy into its format)."""
        if self.scaling is not None and self.scaling.recipe.grad_loss:
            return self.scaling.recipe.bwd
        return self.grad_format

    def quantize_grad_output(self, gy):
        """The incoming gradient as stored in the backward format (a
        Variable; the same one when there is nothing to round)."""
        fmt = self.grad_format
        if fmt is not None and fmt.is_float32:
            fmt = None
        # a per-tensor recipe (or grad=loss's unscaled cast) casts gy once
        # for both backward GEMMs (MX casts it per GEMM, along each one's
        # reduction: backward_scaled)
        scaling = self.scaling if self.scaling is not None and \
            self.scaling.casts_gy_once else None
        marker = scaling if scaling is not None else fmt
        if marker is None or gy is None or getattr(
                gy, '_ada_quantized', None) is marker:
            return gy
        a = gy.array if fmt is None else fmt.quantize(gy.array)
        if scaling is not None:
            a = scaling.quantize('gy', a, record=chainer.config.train)
        q = chainer.Variable(a, requires_grad=False)
        q._ada_quantized = marker   # idempotent: not rounded twice
        q._ada_source = gy          # the high-precision gradient
        return q


class GemmFunction(GemmSettings):
    """Mixin of the forward node of a GEMM layer (Linear, Conv, Deconv).

    Settings (constructor arguments, see :meth:`_init_gemm`):

    * ``scale_key`` names the layer (its path in the model, given by the
      link) so that loss-scale records and the update-interval cache of
      adaptive loss scaling are per layer;
    * ``formats``: (forward format, backward format) of an emulated
      precision, or None. The caller rounds x, W, b to the forward format;
      this node rounds its output to it, and in the backward rounds the
      incoming gradient and every gradient it produces to the backward
      format.
    * ``scaling``: the layer's :class:`ada_loss.formats.recipe.GemmScaling`
      under a scaled recipe (per-tensor FP8, MX), or None. The node casts x
      and W along their forward reductions (:attr:`reduction_axes`) and
      retains the high-precision ones; the backward casts gy (per tensor:
      once, reusing the forward's x and W copies; MX: per GEMM, re-casting
      W and x from high precision along the dgrad and wgrad reductions;
      ``grad=loss``: once, unscaled, into the recipe's gradient element
      format, :attr:`stored_grad_format`; NVFP4 and blockwise FP8 as MX,
      and under NVFP4's RHT the wgrad GEMM runs on transformed operands:
      :meth:`grad_weight_rht` of each node).

    :meth:`backward` is Chainer's (every scale 1); the ⟨α, δ⟩ backward calls
    :meth:`backward_scaled` with the layer-wise scales instead.
    """

    #: axes of W the input-gradient GEMM sums over (see grad_input_gain)
    grad_input_axes = None
    #: the axes each operand is reduced over in the layer's three GEMMs
    #: (MX blocks run along them): forward (x, W), dgrad (gy, W) and
    #: wgrad (gy, x); set by each node type
    reduction_axes = None

    def forward(self, inputs):
        if self.scaling is None:
            return super(GemmFunction, self).forward(inputs)
        # A scaled recipe: the GEMM consumes x and W cast to the recipe's
        # format (dequantized, FP32); the node's inputs, which it retains
        # for the backward, stay the high-precision ones. The bias is not
        # cast (TE adds it in high precision).
        train = chainer.config.train
        fwd_x, fwd_w = self.reduction_axes['fwd']
        xq = self.scaling.quantize('x', inputs[0], fwd_x, record=train)
        wq = self.scaling.quantize('w', inputs[1], fwd_w, record=train)
        if self.scaling.per_tensor:
            # the backward GEMMs use the same copies (TE's transposed FP8
            # copies hold the same values: one scale per tensor)
            self._forward_copies = (xq, wq)
        return super(GemmFunction, self).forward((xq, wq) + inputs[2:])

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
        # A convolution node serving as a deconvolution's input-gradient GEMM
        # (and vice versa) has an output_scale: see ScaledOutput.backward.
        return _times(self.backward_scaled(indexes, grad_outputs).grads,
                      getattr(self, 'output_scale', 1))

    def backward_scaled(self, indexes, grad_outputs, input_scale=1,
                        weight_scale=1, fit_weight_grad=False,
                        fit_input_grad=False):
        """The backward at layer-wise loss scales (Algorithm 3).

        Args:
            indexes, grad_outputs: as for ``FunctionNode.backward``.
            input_scale: β, a power of two (or a 0-d device array): the
                input gradient is the GEMM of β·gy (β multiplies the FP32
                accumulator before rounding, which is exact and cannot
                overflow in between).
            weight_scale: γ ≤ 1, a power of two: the weight and bias
                gradients are produced at γ times gy's scale.
            fit_weight_grad: lower the weight gradient's scale further by the
                power of two that fits it into the gradient format (FP16 or
                the backward format) where it would overflow.
            fit_input_grad: the same for the input gradient (its scale β
                lowered by the power of two that fits it; the overflow guard
                of the adaptive mode, not in the paper).

        Returns:
            GemmGrads: ``grads`` (gx, gW, gb as requested by ``indexes``,
            each in its input's dtype), ``input_grad_scale`` and
            ``weight_grad_scale``, the scales gx and gW, gb were produced at
            (relative to gy's).
        """
        x, W = self.get_retained_inputs()
        gy = self.quantize_grad_output(grad_outputs[0])
        gy_b = gy
        # the operands of the dgrad GEMM (gy, W) and the wgrad GEMM (gy, x)
        gy_d = gy_w = gy
        W_d, x_w = W, x
        if self.scaling is not None:
            if self.scaling.per_tensor:
                x_w, W_d = self._forward_copies
            else:
                # MX: each operand cast along its own reduction in each
                # GEMM; W and x re-quantized from their high-precision
                # copies (not re-scaled from the forward's blocks)
                (d_gy, d_w), (w_gy, w_x) = (self.reduction_axes['dgrad'],
                                            self.reduction_axes['wgrad'])
                q = self.scaling.quantize
                g = gy.array
                # grad=loss: gy was cast once, unscaled (quantize_grad_output)
                once = self.scaling.casts_gy_once
                if 0 in indexes:
                    gy_d = gy if once else q('gy', g, d_gy)
                    W_d = q('w', W.array, d_w)
                if 1 in indexes and not self.scaling.rht:
                    gy_w = gy if once else q('gy', g, w_gy)
                    x_w = q('x', x.array, w_x)
            # TE computes the bias gradient from the high-precision gy
            # (the caller may have passed the cast one: the ⟨α, δ⟩ backward)
            gy_b = getattr(grad_outputs[0], '_ada_source', grad_outputs[0])
        ret = []
        input_grad_scale = input_scale
        if 0 in indexes:
            gx, input_grad_scale = self.grad_input(x, W_d, gy_d, input_scale,
                                                   fit_input_grad)
            ret.append(gx)
        # W and b share one scale (one α per layer): with fitting, the bias
        # sum (cheap) is fitted first and gW produced at most at its scale;
        # the bias is redone in the rare case that gW had to go lower still
        weight_grad_scale = weight_scale
        gb = None
        if 2 in indexes:
            gb, weight_grad_scale = bias_grad(
                gy_b, self.bias_axis, self.grad_format, weight_scale,
                fit_weight_grad)
        if 1 in indexes:
            if self.scaling is not None and self.scaling.rht:
                # NVFP4: the wgrad GEMM on Hadamard-transformed operands
                gW, w_scale = self.grad_weight_rht(
                    x.array, W, gy.array, weight_grad_scale, fit_weight_grad)
            else:
                gW, w_scale = self.grad_weight(x_w, W, gy_w,
                                               weight_grad_scale,
                                               fit_weight_grad)
            ret.append(gW)
            # (a scale decided on the device is redone without reading it:
            # the same sum at the same scale, the same bits)
            if gb is not None and w_scale is not weight_grad_scale and (
                    is_device_scalar(w_scale)
                    or w_scale != weight_grad_scale):
                gb, _ = bias_grad(gy_b, self.bias_axis, self.grad_format,
                                  w_scale)
            weight_grad_scale = w_scale
        if gb is not None:
            ret.append(gb)
        return GemmGrads(tuple(ret), input_grad_scale, weight_grad_scale)


def gemm_function_types():
    """All :class:`GemmFunction` node types."""
    return tuple(GemmFunction.__subclasses__())
