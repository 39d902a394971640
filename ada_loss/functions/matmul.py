"""GEMMs of two activations, ``y = a @ b`` (attention's Q·Kᵀ and P·V).

A layer's GEMM (:class:`ada_loss.functions.gemm.GemmFunction`) multiplies
an activation by a weight, a leaf: one input gradient gets a layer-wise
scale β, the weight gradient ends at a parameter. Attention multiplies two
activations, and *both* input gradients flow on to other GEMMs:

    Y = A·B   (over the last two axes; the leading axes, batch and heads,
               index independent products)
    gA = gY·Bᵀ   (B plays the weight's role: Algorithm 4 on (B, gY))
    gB = Aᵀ·gY   (A plays the weight's role: Algorithm 4 on (A, gY))

so :class:`MatMulFunction` gives each input gradient its own β (derivation
and the per-head option: docs/modes.md, "Attention's activation × activation
GEMMs"). The ⟨α, δ⟩ backward (:mod:`ada_loss.adaptive.backward`) sees each
input gradient through an :class:`OperandGradient`, which has the interface
of a layer's GEMM that Algorithm 4 and its bounds read (``gemm_weight``,
``grad_input_gain``, ``scale_key``).

Numerics as the layer GEMMs (:class:`ada_loss.functions.gemm.ScaledOutput`):
float16 NumPy inputs are widened, accumulated in FP32 and rounded once;
float32 inputs with an ``out_format`` (an emulated precision) are rounded to
it; a power-of-two ``output_scale`` multiplies the FP32 accumulator before
the rounding (exact), lowered by the power of two that fits the result into
the format with ``fit_output``.
"""
import chainer
from chainer import function_node
import numpy

from ada_loss.formats import get_format
from ada_loss.functions.fp16_gemm import emulates_fp16_gemm, round_to
from ada_loss.functions.gemm import (
    GemmSettings, _fit_ratio, round_to_format)
from ada_loss.functions.scales import scaled
from ada_loss.loss_scale.gemm import grad_input_gain

_FLOAT16 = get_format('float16')


def _swap_last(x):
    """``x`` (a Variable or an array) with its last two axes swapped."""
    axes = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    if isinstance(x, chainer.Variable):
        return chainer.functions.transpose(x, axes)
    return x.transpose(axes)


def _check_operands(a, b):
    if a.dtype != b.dtype:
        raise TypeError('matmul needs two operands of one dtype, got {} and '
                        '{}'.format(a.dtype, b.dtype))
    if a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or \
            a.shape[-1] != b.shape[-2]:
        raise ValueError('matmul needs a (..., M, K) and b (..., K, N) with '
                         'the same leading axes, got {} and {}'.format(
                             a.shape, b.shape))


class ScaledMatMul(function_node.FunctionNode):
    """``output_scale · (a @ b)`` over the last two axes, rounded once
    (module docstring); ``applied_scale`` is the scale the result was
    produced at (``output_scale``, lowered with ``fit_output``)."""

    def __init__(self, output_scale=1, out_format=None, fit_output=False):
        self.output_scale = output_scale
        self.out_format = out_format
        self.fit_output = bool(fit_output)
        self.applied_scale = output_scale

    def _fit(self, y, fmt):
        scale = self.output_scale
        if self.fit_output:
            scale = scale * _fit_ratio(y, scale, fmt)
        self.applied_scale = scale
        return scale

    def forward(self, inputs):
        a, b = inputs
        _check_operands(a, b)
        self.retain_inputs((0, 1))
        xp = chainer.backend.get_array_module(a)
        fmt = self.out_format
        if fmt is not None and not fmt.is_float32 and \
                a.dtype == numpy.float32:
            y = xp.matmul(a, b)
            return round_to_format(y, fmt, self._fit(y, fmt)),
        if emulates_fp16_gemm((a, b)):
            y = numpy.matmul(a.astype(numpy.float32),
                             b.astype(numpy.float32))
            return round_to(y, numpy.float16, self._fit(y, _FLOAT16)),
        self.applied_scale = self.output_scale
        return chainer.utils.force_array(
            scaled(xp.matmul(a, b), self.output_scale)),

    def backward(self, indexes, grad_outputs):
        # Chainer's gradients of output_scale · (a @ b) (double backprop;
        # the ⟨α, δ⟩ backward does not differentiate gradient GEMMs)
        a, b = self.get_retained_inputs()
        gy, = grad_outputs
        ret = []
        if 0 in indexes:
            ret.append(ScaledMatMul(self.output_scale).apply(
                (gy, _swap_last(b)))[0])
        if 1 in indexes:
            ret.append(ScaledMatMul(self.output_scale).apply(
                (_swap_last(a), gy))[0])
        return tuple(ret)


class OperandGradient(object):
    """One input gradient of a :class:`MatMulFunction`, as Algorithm 4 sees
    a GEMM: the operand that plays the weight's role (``gemm_weight``: B
    for gA = gY·Bᵀ, A for gB = Aᵀ·gY), the axes of it that the gradient GEMM
    sums (``grad_input_axes``: B's last axis, A's second to last), and its
    own layer key (``scale_key``: the node's, with ``:a`` or ``:b``), under
    which β is cached, recorded and backed off."""

    def __init__(self, func, index):
        self.func = func
        self.index = index
        base = func.scale_key if func.scale_key is not None else \
            'matmul@{:x}'.format(id(func))
        self.scale_key = '{}:{}'.format(base, 'ab'[index])
        # the other operand: the weight's role
        self.inputs = (func.inputs[index], func.inputs[1 - index])
        self.stat_axis = func.stat_axis

    def gemm_weight(self):
        return self.func.get_retained_inputs()[1 - self.index].array

    @property
    def grad_input_axes(self):
        ndim = len(self.inputs[1].shape)
        return (ndim - 1,) if self.index == 0 else (ndim - 2,)

    def grad_input_gain(self, W):
        """max over the gradient's entries of Σ|operand| over what its GEMM
        sums: max|g_in| ≤ max|gY| · gain (the ``'output'`` bound)."""
        return grad_input_gain(W, self.grad_input_axes)


class MatMulFunction(GemmSettings, ScaledMatMul):
    """The forward node of an activation × activation GEMM (``y = a @ b``)
    with an emulated precision's rounding (``formats``: the caller rounds a
    and b to the forward format, the node its output; the backward rounds
    the incoming gradient and both input gradients to the backward format),
    a scaled recipe's casts (``scaling``: a as the recipe's ``x``; b as its
    ``w`` per tensor, with its own scale and delayed history, and as ``x``
    under block recipes, whose 2-D weight tiles would run across batch and
    heads; every operand cast along the GEMM's reduction, TE's
    transposed copies reused per tensor; no Hadamard transform: TE's
    NVFP4 recipe leaves attention in BF16) and the scaled backward
    :meth:`backward_scaled` with one scale per input gradient.

    ``stat_axis``: None (Algorithm 4's statistics over the whole tensor) or
    the axis of the heads (``'head'``: each head must meet T_uf; docs/
    modes.md).
    """

    def __init__(self, scale_key=None, formats=None, scaling=None,
                 stat_axis=None):
        self._init_gemm(scale_key, formats, scaling)
        ScaledMatMul.__init__(
            self, out_format=None if formats is None else formats[0])
        self.stat_axis = stat_axis

    @property
    def _role_b(self):
        return 'w' if self.scaling.per_tensor else 'x'

    def forward(self, inputs):
        if self.scaling is None:
            return super(MatMulFunction, self).forward(inputs)
        a, b = inputs
        _check_operands(a, b)
        train = chainer.config.train
        aq = self.scaling.quantize('x', a, (a.ndim - 1,), record=train)
        bq = self.scaling.quantize(self._role_b, b, (b.ndim - 2,),
                                   record=train)
        if self.scaling.per_tensor:
            self._forward_copies = (aq, bq)
        ys = super(MatMulFunction, self).forward((aq, bq))
        self.retain_inputs((0, 1))     # the high-precision operands
        return ys

    def operand_gradient(self, index):
        """The :class:`OperandGradient` of input ``index`` (0: a, 1: b)."""
        return OperandGradient(self, index)

    def backward(self, indexes, grad_outputs):
        return self.backward_scaled(indexes, grad_outputs)[0]

    def backward_scaled(self, indexes, grad_outputs, input_scales=None,
                        fit_input_grad=False):
        """The backward with a scale per input gradient (Algorithm 3 for
        each operand).

        Args:
            indexes, grad_outputs: as for ``FunctionNode.backward``.
            input_scales: {input index: β} (powers of two or 0-d device
                arrays; 1 where missing): gA is the GEMM of β_a·gY, gB of
                β_b·gY, each β multiplying the FP32 accumulator.
            fit_input_grad: lower each β by the power of two that fits its
                gradient into the backward format (the overflow guard).

        Returns:
            (grads, scales): the gradients requested by ``indexes`` and
            {input index: the scale it was produced at}.
        """
        input_scales = input_scales or {}
        a, b = self.get_retained_inputs()
        gy = self.quantize_grad_output(grad_outputs[0])
        # the operands of the two gradient GEMMs: gA = gY·Bᵀ, gB = Aᵀ·gY
        gy_a = gy_b = gy
        a_g, b_g = a, b
        if self.scaling is not None:
            nd = a.ndim
            if self.scaling.per_tensor:
                a_g, b_g = self._forward_copies
            else:
                q = self.scaling.quantize
                once = self.scaling.casts_gy_once
                if 0 in indexes:     # gY·Bᵀ sums N: gY's and B's last axis
                    gy_a = gy if once else q('gy', gy.array, (nd - 1,))
                    b_g = q(self._role_b, b.array, (nd - 1,))
                if 1 in indexes:     # Aᵀ·gY sums M: A's and gY's axis -2
                    gy_b = gy if once else q('gy', gy.array, (nd - 2,))
                    a_g = q('x', a.array, (nd - 2,))
        fmt = self.grad_format
        ret, scales = [], {}
        for i in indexes:
            node = ScaledMatMul(input_scales.get(i, 1), fmt, fit_input_grad)
            if i == 0:
                g, = node.apply((gy_a, _swap_last(b_g)))
            else:
                g, = node.apply((_swap_last(a_g), gy_b))
            ret.append(g)
            scales[i] = node.applied_scale
        return tuple(ret), scales


def matmul(a, b, scale_key=None, formats=None, scaling=None,
           stat_axis=None):
    """``a @ b`` over the last two axes (leading axes equal) through
    :class:`MatMulFunction`: a scale-aware GEMM of two activations.
    ``scale_key``, ``formats``, ``scaling`` as for
    :func:`ada_loss.functions.linear`; ``stat_axis`` see
    :class:`MatMulFunction`."""
    y, = MatMulFunction(scale_key, formats, scaling, stat_axis).apply((a, b))
    return y
