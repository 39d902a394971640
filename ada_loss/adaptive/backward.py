"""Loss-scaled backpropagation with ⟨α, δ⟩ tuples (paper §3.1, Algorithm 3).

Chainer's own backward (``chainer/_backprop.py``) sums every reused variable's
gradients with ``F.add`` before the producer runs, knowing nothing of scales.
This module walks the same graph in the same order (a heap of function nodes
by decreasing rank) but keeps, for every gradient, the scale α it is carried
at:

* a GEMM node (:class:`ada_loss.functions.GemmFunction`) receives ⟨α, g⟩,
  computes β = GetLossScale(W, g) (Algorithm 4, §3.2.3), produces its input
  gradient from β·g at scale α·β, and its weight/bias gradients from g at
  scale α;
* a GEMM of two activations (:class:`ada_loss.functions.matmul
  .MatMulFunction`, attention's Q·Kᵀ and P·V) gets one β per input
  gradient, Algorithm 4 with the *other* operand in the weight's role
  (:class:`ada_loss.functions.matmul.OperandGradient`, whose key is the
  node's with ``:a`` or ``:b``): gA at α·β_a, gB at α·β_b;
* every other node passes α through unchanged (§3.2.2: element-wise ops,
  batch normalization, pooling, reshapes, the loss ...), except, with
  ``nonlinear_scale``, a softmax's or a GELU's input gradient, which may
  go on at α·σ (σ a power of two decided where the next GEMM stores it);
* with ``split_scales``, the slices of a split along the last axis keep
  their own scales until the GEMM that consumes the concatenation has
  rounded them (not in the paper: docs/modes.md);
* wherever gradients meet — the several consumers of one variable (fan-out),
  or the several outputs of one node — they are rescaled to one scale by
  Algorithm 5 before anything sums them;
* a leaf (a parameter) ends with its gradient at scale α and ``_loss_scale``
  set to α, so Chainer's ``UpdateRule`` unscales it in FP32 (with
  ``use_fp32_update()`` for FP16 parameters) before the optimizer sees it.

The overflow guard (``guard=True``; *not in the paper*) decides the scale
where a gradient is rounded to the narrow format: a gradient entering a GEMM
whose largest magnitude would overflow the format when rounded (batch norm's
backward and residual sums amplify what the previous GEMM produced at α·β,
and no bound of Algorithm 4 looks there) is multiplied by the power of two
2^-k that brings it into range and its α is lowered by the same 2^-k; the
GEMM's input gradient is fitted the same way (``fit_input_grad``), as its
weight gradient always is. Both are exact (powers of two), so the unscaled
gradients are unchanged where nothing overflowed, and scaling alone cannot
make a gradient Inf/NaN. On device arrays the same decisions are made on the
device (:func:`ada_loss.loss_scale.device.fit_ratio`, the same rounding of
the same candidate products), with no host read: what the pass notes (the
first non-finite gradient, the guarded layers) is kept as device scalars and
read with one transfer when asked (after a skipped step). Every pass also
notes the first GEMM (in backward order) whose entering gradient is
non-finite, and which GEMMs produced it
(:attr:`ScaledBackprop.nonfinite`): the skip report and the per-layer
backoff after a skipped step (:class:`ada_loss.AdaLossScaled`) use it.

Summing is done here, never by Chainer, so gradients at different scales
cannot be added together.
"""
import collections
import heapq
import math

import numpy

import chainer
from chainer import backend
import chainer.functions as F
from chainer.functions.connection import convolution_2d as _c_conv
from chainer.functions.connection import deconvolution_2d as _c_deconv
from chainer.functions.connection import linear as _c_linear
from chainer.functions.activation import softmax as _c_softmax
from chainer.functions.array import cast as _c_cast
from chainer.functions.array import reshape as _c_reshape
from chainer.functions.array import split_axis as _c_split_axis
from chainer.functions.array import transpose as _c_transpose
from chainer.functions.array import where as _c_where
from chainer.functions.math import basic_math as _c_basic_math
from chainer.functions.math import matmul as _c_matmul

from ada_loss.formats import get_format
from ada_loss.functions.gelu import GELU
from ada_loss.functions.gemm import GemmFunction
from ada_loss.functions.matmul import MatMulFunction
from ada_loss.functions.scales import (
    device_kernels, is_device_scalar, scaled)
from ada_loss.loss_scale.branch import common_scale
from ada_loss.loss_scale.fit import fit_ratio, overflows  # NOQA (re-exported)
from ada_loss.loss_scale.gemm import max_abs

#: Chainer's own GEMM nodes: they work, but pass the scale through (β = 1).
FOREIGN_GEMMS = (_c_linear.LinearFunction, _c_conv.Convolution2DFunction,
                 _c_deconv.Deconvolution2DFunction, _c_matmul.MatMul)

_FLOAT16 = get_format('float16')


def _function_hooks(func, hooks_base):
    """The function hooks that see ``func``'s backward: the global ones
    (``hooks_base``), joined by the node's own local hooks where it has
    any — as Chainer's ``Variable.backward`` chooses them."""
    if not func._n_local_function_hooks:
        return hooks_base
    local = collections.OrderedDict(chainer.get_function_hooks())
    local.update(func.local_function_hooks)
    return local.values()


class ScaleAwareBackwardError(RuntimeError):
    """A graph construct the ⟨α, δ⟩ backward cannot handle safely."""


def _max_abs(v):
    return max_abs(v.array)


#: The attribute of a gradient Variable whose slices along its last axis
#: are still carried at their own scales (``split_scales``): a 1-d array
#: of powers of two along that axis, each the ratio (common α) / (the
#: slice's α) that brings the slice to the Variable's scale.
_SLICE_RATIO = '_ada_slice_ratio'


def slice_ratio(v):
    """The per-slice ratios ``v`` still owes (see :data:`_SLICE_RATIO`),
    or None: ``v`` is at one scale."""
    return None if v is None else getattr(v, _SLICE_RATIO, None)


def _with_ratio(v, ratio):
    if ratio is not None and v is not None:
        setattr(v, _SLICE_RATIO, ratio)
    return v


def _materialized(v):
    """``v`` with every slice brought to its common scale (a product by
    powers of two: exact in FP32)."""
    ratio = slice_ratio(v)
    if ratio is None:
        return v
    return chainer.Variable(v.array * ratio, requires_grad=False)


#: The attribute of a gradient Variable that left a softmax or a GELU and
#: has not been stored by a GEMM yet (``nonlinear_scale``): its σ is
#: decided where it is stored. Its value: that node's label.
_NONLINEAR_PENDING = '_ada_nonlinear_pending'

#: Nodes that only mask, cast, reshape or multiply a gradient by a constant
#: (attention's causal mask and 1/√d between its softmax and Q·Kᵀ): a
#: softmax's or GELU's gradient passes through them with its σ still to be
#: decided.
_PASSTHROUGH = (_c_where.Where, _c_basic_math.MulConstant, _c_cast.Cast,
                _c_reshape.Reshape, _c_transpose.Transpose)


#: Element-wise nodes whose backward multiplies the gradient by factors
#: that can be far below 1 (§3.2.2's assumption fails): the softmax
#: (probabilities) and GELU (Φ(x) + x·φ(x) → 0 for x ≪ 0).
_SHRINKING = (_c_softmax.Softmax, GELU)


def _concat_ratio(func, present, ratios, xp, dtype):
    """The ratios along the last axis of a split's input gradient: each
    output's section length times its ratio (1 for an output that got no
    gradient: its slice is zeros)."""
    by_output = {i: r for (i, _, _), r in zip(present, ratios)}
    parts = [xp.ones((shape[-1],), dtype) * by_output.get(i, 1.0)
             for i, shape in enumerate(func._shapes)]
    return xp.concatenate(parts).astype(dtype, copy=False)


def gemm_key(func):
    """The name of a GEMM node's layer (its ``scale_key``), or a key made
    from its weight node for a GEMM called outside a converted link."""
    if func.scale_key is not None:
        return func.scale_key
    return ('unnamed', id(func.inputs[1]))


#: One GEMM node met by a pass: its layer, the scale α and origins (the
#: GEMM layers it came from) of the gradient entering it, and the arrays of
#: the weight and bias gradients this use contributed (a shared layer's
#: leaves sum several uses: a non-finite sum is located per use).
GemmUse = collections.namedtuple('GemmUse',
                                 ('layer', 'alpha', 'origins', 'params'))

#: The first non-finite gradient of a pass, in backward order: the GEMM
#: layer it entered, the scale α it was carried at, its largest magnitude
#: (Inf or NaN) and the GEMM layers whose input gradients it came from
#: (empty: from the loss through no GEMM).
NonFinite = collections.namedtuple('NonFinite',
                                   ('layer', 'alpha', 'max_abs', 'origins'))


def _stored_format(func, g):
    """The format a GEMM stores its incoming gradient ``g`` in: its
    backward format (emulated precisions; a scaled recipe's gradient
    element format with ``grad=loss``), FP16 for float16 arrays, or None
    (float32: nothing is rounded)."""
    fmt = func.stored_grad_format
    if fmt is not None and not fmt.is_float32:
        return fmt
    if g.dtype == numpy.float16:
        return _FLOAT16
    return None


def _stored(peak, fmt):
    """``peak`` (a float) as ``fmt`` stores it: what the skip report names
    for a gradient whose rounding overflowed (Inf, NaN or u_max)."""
    return float(fmt.quantize(numpy.array([peak], numpy.float32))[0])


def gemm_nodes(loss):
    """The scale-aware GEMM nodes of the graph behind ``loss`` that take an
    input gradient (those whose β Algorithm 4 computes), in no particular
    order: a walk over the function nodes alone, before the backward."""
    found, seen = [], set()
    stack = [loss.creator_node]
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        if isinstance(f, GemmFunction) and f.inputs[0].requires_grad:
            found.append(f)
        stack.extend(x.creator_node for x in f.inputs)
    return found


def _stored_grad(func, g):
    """The gradient ``g`` entering GEMM ``func`` as the GEMM stores it
    (:meth:`~ada_loss.functions.gemm.GemmSettings.quantize_grad_output`);
    a gradient with slice ratios (``split_scales``) is rounded with each
    slice at its own scale, then brought to its common scale in FP32 (a
    per-slice power of two, as a block-scaled GEMM applies its block
    scales to the products)."""
    ratio = slice_ratio(g)
    q = func.quantize_grad_output(g)
    if ratio is None:
        return q
    v = chainer.Variable(q.array * ratio, requires_grad=False)
    marker = getattr(q, '_ada_quantized', None)
    if marker is not None:
        v._ada_quantized = marker       # stored: not rounded again
        v._ada_source = chainer.Variable(g.array * ratio,
                                         requires_grad=False)
    return v


class HostScales(object):
    """How one backward pass on NumPy arrays holds its scales: Python
    floats. :class:`ScaledBackprop` chooses this or :class:`DeviceScales`
    once per pass, from the loss's array."""

    on_device = False

    @staticmethod
    def initial(value):
        return value

    @staticmethod
    def product(a, b):
        """α·β; β = 1 leaves α as it is."""
        return a if b == 1 else a * b

    @staticmethod
    def rescale(v, ratio):
        """``ratio · v`` for a power-of-two ``ratio``: exact up to
        underflow."""
        if ratio == 1:
            return v
        # (2^-k may itself be below FP16's, or FP32's, range: scaled()
        # rounds the exact product once)
        a = scaled(v.array, ratio)
        # NumPy turns a 0-dim array times a scalar into a scalar (the loss).
        return chainer.Variable(chainer.utils.force_array(a),
                                requires_grad=False)

    @staticmethod
    def common(scales, grads, u_max):
        """Algorithm 5 for gradients ``grads`` (Variables) carried at
        ``scales``: ``(α, [α/α_k])``."""
        alpha = common_scale(scales, lambda k: _max_abs(grads[k]), u_max)
        return alpha, [alpha / a for a in scales]

    @staticmethod
    def fused_sum(arrays, ratios):
        """Σ ratio_k · array_k in one pass per term, or None (then the
        caller rescales and folds with ``F.add``)."""
        return None

    @staticmethod
    def leaf(alpha):
        """The ``_loss_scale`` of a leaf carried at α (None: unscaled)."""
        return None if alpha in (None, 1.0) else alpha


class DeviceScales(object):
    """Scales of a backward pass on device arrays: 0-d float64 device
    arrays, so that the host never waits for the device (the kernels of
    :mod:`ada_loss.loss_scale.device`). A Python 1 (γ of a GEMM with no
    weight gradient, a leaf's unscaled earlier gradient) may still meet
    them."""

    on_device = True

    @staticmethod
    def initial(value):
        # a number, or α_{N+1} already on the device (init_scale='auto')
        return device_kernels().scalar(value)

    @staticmethod
    def product(a, b):
        if not is_device_scalar(b) and b == 1:
            return a
        return a * b

    @staticmethod
    def rescale(v, ratio):
        if not is_device_scalar(ratio) and ratio == 1:
            return v
        return chainer.Variable(device_kernels().rescale(v.array, ratio),
                                requires_grad=False)

    @staticmethod
    def common(scales, grads, u_max):
        device = device_kernels()
        return device.common_scale(
            scales, [device.max_abs(g.array) for g in grads], u_max)

    @staticmethod
    def fused_sum(arrays, ratios):
        # as rescaling then a left fold of F.add would give it, each
        # addition fused with its rescaling (one pass each); one dtype only
        if {a.dtype for a in arrays} not in (
                {numpy.dtype(numpy.float16)}, {numpy.dtype(numpy.float32)}):
            return None
        device = device_kernels()
        total = device.rescale_add(arrays[0], ratios[0], arrays[1],
                                   ratios[1])
        for a, r in zip(arrays[2:], ratios[2:]):
            total = device.rescale_add(total, 1.0, a, r)
        return chainer.Variable(total, requires_grad=False)

    @staticmethod
    def leaf(alpha):
        # UpdateRule divides the gradient by it on the device
        return alpha


class ScaledBackprop(object):
    """One ⟨α, δ⟩ backward pass; see the module docstring.

    Args:
        gemm_scale (callable): ``gemm_scale(func, W, g, alpha)`` → β (a
            power of two) for a GEMM node.
        u_max (float): largest finite value of the gradient format (for
            Algorithm 5's overflow test).
        observe (callable or None): ``observe(func, grads, scales)`` after
            each GEMM's backward with its gradient arrays {input index:
            array} and their scales (the amax rule keeps a history).
        weight_scale (callable or None): ``weight_scale(func, W, x, g,
            alpha)`` → γ ≤ 1 (a power of two): the weight and bias gradients
            are produced at α·γ instead of α (their leaves get that scale).
        loss_gradient (callable or None): ``loss_gradient(func, g, alpha)``
            for each GEMM whose incoming gradient comes from the loss through
            no other GEMM (the loss gradient: e.g. the logits' gradient of a
            classifier, every head of a detector), with that gradient's
            array as carried (before the GEMM rounds it) and its scale.
        guard (bool): the overflow guard (see the module docstring; on
            device arrays decided on the device).
        nonlinear_scale (callable or None): ``nonlinear_scale(g, alpha)`` →
            σ (a power of two ≥ 1) for the input gradient the backward of a
            softmax or a GELU (:data:`_SHRINKING`) produced, as ``g`` (an
            array at scale ``alpha``) where it is stored — entering the
            next GEMM, after masks, casts, reshapes and constant factors
            (attention's 1/√d), or wherever it meets anything else first:
            it goes on at α·σ (docs/modes.md, *A softmax or a GELU between
            two GEMMs*; not in the paper). None: α passes through those
            nodes (§3.2.2).
        split_scales (bool): where the gradients of the outputs of a split
            along the last axis meet (its backward is a concatenation, not
            a sum), each slice keeps its own scale until the next GEMM
            stores it, and is brought to the common α (Algorithm 5's) only
            after that GEMM has rounded it (docs/modes.md, *A split is not a
            sum*; not in the paper). False: rescaled to the common α before
            the concatenation (Algorithm 5 as at a sum). float32 arrays
            only (FP16 ones are rescaled at the split, as before).
    """

    def __init__(self, gemm_scale, u_max, observe=None, weight_scale=None,
                 loss_gradient=None, guard=False, nonlinear_scale=None,
                 split_scales=False):
        self.gemm_scale = gemm_scale
        self.u_max = u_max
        self.observe = observe
        self.weight_scale = weight_scale
        self.loss_gradient = loss_gradient
        self.guard = guard
        self.nonlinear_scale = nonlinear_scale
        self.split_scales = split_scales
        #: (node label, α, σ) of each softmax or GELU
        #: (``nonlinear_scale``), backward order
        self.nonlinear_records = []
        # VariableNode -> whether its gradient reached it through no GEMM
        # (tracked for ``loss_gradient`` only)
        self._direct = {}
        # VariableNode -> the GEMM layers its gradient came from
        self._origin = {}
        #: {GEMM scale_key: (α of its weight gradient, β)}
        self.gemm_records = collections.OrderedDict()
        #: the GEMM layers of the pass (:func:`gemm_key`), backward order
        self.layers = []
        #: labels of Chainer GEMM nodes met that are not scale-aware
        self.foreign_gemms = []
        # :data:`NonFinite` of the first non-finite gradient entering a
        # GEMM (not float16 ones: see ``_check_entering``), or None; the
        # ``nonfinite`` property
        self._nonfinite = None
        #: one :data:`GemmUse` per GEMM node of the pass, backward order (a
        #: layer whose weights are shared appears once per use)
        self.uses = []
        # {(layer, 'in' or 'out'): k} for each GEMM whose entering or
        # produced input gradient the guard lowered by 2^-k; the
        # ``guarded`` property
        self._guarded = collections.OrderedDict()
        # a device pass's checks, in backward order, until read: ('in',
        # layer, α, peak, ratio, origins, stored format) and ('out', layer,
        # β, the fitted β) with device scalars
        self._pending = []
        self._loss_finite = None
        self._loss_array = None

    # -- what the pass noted (read from the device when asked) -----------
    @property
    def nonfinite(self):
        """:data:`NonFinite` of the first non-finite gradient entering a
        GEMM (or overflowing its stored format when rounded, without the
        guard), or None."""
        self._read_pending()
        return self._nonfinite

    @nonfinite.setter
    def nonfinite(self, value):
        self._read_pending()
        self._nonfinite = value

    @property
    def guarded(self):
        """{(layer, 'in' or 'out'): k} for each GEMM whose entering or
        produced input gradient the guard lowered by 2^-k."""
        self._read_pending()
        return self._guarded

    @property
    def loss_finite(self):
        """Whether the loss itself is finite (a bad batch is not a scale's
        fault: the backoff leaves the scales alone); on a device read when
        asked."""
        if self._loss_finite is None and self._loss_array is not None:
            xp = backend.get_array_module(self._loss_array)
            self._loss_finite = bool(xp.isfinite(self._loss_array).all())
        return self._loss_finite

    def _read_pending(self):
        """Resolves a device pass's checks with one transfer, exactly as
        :meth:`_check_entering` and the guard of :meth:`_step` decide them
        on the host."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        values = device_kernels().to_floats(
            [v for p in pending for v in p[2:5]])
        for n, p in enumerate(pending):
            a, peak, ratio = values[3 * n:3 * n + 3]
            if p[0] == 'out':
                # (β, the β the fit left): k of 2^-k
                if ratio != a:
                    self._guarded[(p[1], 'out')] = int(round(math.log2(
                        a / ratio)))
                continue
            layer, origins, fmt, guard = p[1], p[5], p[6], p[7]
            if not math.isfinite(peak):
                if self._nonfinite is None:
                    self._nonfinite = NonFinite(layer, a, peak, origins)
            elif ratio != 1:
                if guard:
                    self._guarded[(layer, 'in')] = -int(math.log2(ratio))
                elif self._nonfinite is None:
                    self._nonfinite = NonFinite(layer, a,
                                                _stored(peak, fmt), origins)

    # -- merging ----------------------------------------------------------
    def _merge(self, entries, where):
        """Sums [(grad, α)] after rescaling them to a common α (Alg. 5)."""
        entries = [e for e in entries if e[0] is not None]
        if not entries:
            return None, None
        if len(entries) == 1:
            return entries[0]
        # gradients that meet are summed: each at one scale first
        entries = [self._settled(_materialized(g), a) for g, a in entries]
        scales = [a for _, a in entries]
        alpha, ratios = self.scales.common(scales, [g for g, _ in entries],
                                           self.u_max)
        total = self.scales.fused_sum([g.array for g, _ in entries], ratios)
        if total is not None:
            return total, alpha
        grads = [self.scales.rescale(g, r)
                 for (g, _), r in zip(entries, ratios)]
        # A left fold in arrival order, like Chainer's eager reduction.
        total = grads[0]
        for g in grads[1:]:
            total = F.add(total, g)
        return total, alpha

    # -- the pass ---------------------------------------------------------
    def run(self, loss, init_scale):
        if loss.creator_node is None:
            raise ScaleAwareBackwardError(
                'the loss variable {!r} was not computed by any function'
                .format(loss.name))
        gy = loss.grad_var
        if gy is None:
            if loss.array.size != 1:
                raise ScaleAwareBackwardError(
                    'the loss must be a scalar (or have .grad set); got shape '
                    '{}'.format(loss.shape))
            xp = backend.get_array_module(loss.array)
            gy = chainer.Variable(xp.ones_like(loss.array), requires_grad=False)
        self._loss_array = loss.array
        if isinstance(loss.array, numpy.ndarray) and not self.loss_finite:
            # a bad batch says nothing of the gradients' magnitudes: nothing
            # is observed (the amax histories are left as they are)
            self.observe = None
        # one representation of the scales for the whole pass
        self.scales = HostScales if isinstance(gy.array, numpy.ndarray) \
            else DeviceScales
        init_scale = self.scales.initial(init_scale)
        gy = self.scales.rescale(gy, init_scale)
        loss.grad_var = None

        grads = {}          # VariableNode -> [(Variable, α)]
        heap, seen = [], set()
        leaves = collections.OrderedDict()   # leaf VariableNodes, in order

        def add_cand(func):
            if func not in seen:
                heapq.heappush(heap, (-func.rank, len(seen), func))
                seen.add(func)

        grads[loss.node] = [(gy, init_scale)]
        if self.loss_gradient is not None:
            self._direct[loss.node] = True
        add_cand(loss.creator_node)

        hooks_base = chainer.get_function_hooks().values()
        with chainer.using_config('enable_backprop', False):
            while heap:
                _, _, func = heapq.heappop(heap)
                self._step(func, grads, add_cand, leaves, hooks_base)

        for node in leaves:
            entries = grads.pop(node, [])
            var = node.get_variable_or_none()
            if var is None:
                continue
            if var.grad_var is not None:
                prev = var._loss_scale
                entries = [(var.grad_var, 1.0 if prev is None else prev)] \
                    + entries
            g, alpha = self._merge(entries, node)
            g, alpha = self._settled(_materialized(g), alpha)
            var._set_grad_var_without_check(g)
            var._loss_scale = self.scales.leaf(alpha)
        return self

    def _step(self, func, grads, add_cand, leaves, hooks_base):
        inputs = func.inputs
        targets = tuple(i for i, x in enumerate(inputs) if x.requires_grad)
        outputs = [y() for y in func.outputs]
        merged = [self._merge(grads.pop(y, []), y)
                  if y is not None and y.creator_node is not None
                  else (None, None) for y in outputs]
        if not targets:
            return
        # Several outputs of one node are rescaled to a common α, too.
        present = [(i, g, a) for i, (g, a) in enumerate(merged)
                   if g is not None]
        if not present:
            return
        direct = self.loss_gradient is not None and all(
            [self._direct.pop(outputs[i], False) for i, _, _ in present])
        origins = frozenset().union(*[self._origin.pop(y, ())
                                      for y in outputs if y is not None])
        out_grad = [None] * len(outputs)
        # slice ratios the gradient carries on (split_scales): set at a
        # split, passed through reshapes, applied by the next GEMM after it
        # has stored the gradient (anywhere else: applied first)
        ratio = None
        pending = False
        if len(present) == 1:
            i, g, alpha = present[0]
            if getattr(g, _NONLINEAR_PENDING, False):
                if isinstance(func, (GemmFunction, MatMulFunction)):
                    # where the gradient is stored: σ decided on the
                    # values this GEMM rounds
                    g, alpha = self._settled(g, alpha)
                elif isinstance(func, _PASSTHROUGH) and \
                        len(targets) == 1:
                    pending = True
                else:
                    g, alpha = self._settled(g, alpha)
            out_grad[i] = g
            ratio = slice_ratio(g)
            if ratio is not None and not (
                    isinstance(func, GemmFunction)
                    or self._keeps_last_axis(func, ratio)):
                out_grad[i] = _materialized(g)
                ratio = None
        else:
            present = [(i,) + self._settled(_materialized(g), a)
                       for i, g, a in present]
            scales = [a for _, _, a in present]
            alpha, ratios = self.scales.common(
                scales, [g for _, g, _ in present], self.u_max)
            if self._defers_split(func, present):
                # a concatenation adds nothing: each slice stays at its
                # own scale until the GEMM that consumes it has rounded it
                g0 = present[0][1].array
                ratio = _concat_ratio(func, present, ratios,
                                      backend.get_array_module(g0),
                                      g0.dtype)
                for i, g, _ in present:
                    out_grad[i] = g
            else:
                for (i, g, _), r in zip(present, ratios):
                    out_grad[i] = self.scales.rescale(g, r)
        out_grad = tuple(out_grad)

        is_gemm = isinstance(func, GemmFunction)
        is_mm = isinstance(func, MatMulFunction)
        host = not self.scales.on_device
        if is_mm:
            self._step_matmul(func, targets, inputs, out_grad, alpha,
                              origins, direct, grads, add_cand, leaves,
                              hooks_base)
            return
        if is_gemm:
            key = gemm_key(func)
            self.layers.append(key)
            check = self._check_entering if host else \
                self._check_entering_on_device
            out_grad, alpha = check(func, key, out_grad, alpha, origins)
            _with_ratio(out_grad[0], ratio)
            entering_alpha = alpha
        in_scales = [alpha] * len(inputs)
        if is_gemm:
            if direct:
                self.loss_gradient(func, _materialized(out_grad[0]).array,
                                   alpha)
            # The gradient as the GEMM stores it (its backward format): the
            # statistics of Algorithm 4 see the stored values.
            out_grad = (_stored_grad(func, out_grad[0]),) + out_grad[1:]
            beta = gamma = 1.0
            if 0 in targets:
                beta = self.gemm_scale(func, func.gemm_weight(),
                                       out_grad[0].array, alpha)
            in_scales[0] = self.scales.product(alpha, beta)
            if self.weight_scale is not None and any(
                    i in targets for i in (1, 2)):
                x = func.get_retained_inputs()[0].array
                gamma = self.weight_scale(func, func.gemm_weight(), x,
                                          out_grad[0].array, alpha)
        elif isinstance(func, FOREIGN_GEMMS):
            self.foreign_gemms.append('{} {}'.format(
                func.label, tuple(x.shape for x in inputs)))

        self._check_backward(func)
        hooks = _function_hooks(func, hooks_base)
        in_data = tuple(x.data for x in inputs)
        out_arrays = tuple(None if g is None else g.array for g in out_grad)
        for hook in hooks:
            if is_gemm and hasattr(hook, 'scaled_backward_preprocess'):
                hook.scaled_backward_preprocess(func, in_data, out_arrays,
                                                beta)
            else:
                hook.backward_preprocess(func, in_data, out_arrays)
        if is_gemm:
            # β scales the input gradient, γ the weight and bias gradients;
            # an overflowing weight gradient is fitted into the format and
            # the scale it got comes back with it (its leaf carries it).
            fit = self.guard
            gxs, input_grad_scale, weight_grad_scale = func.backward_scaled(
                targets, out_grad, input_scale=beta, weight_scale=gamma,
                fit_weight_grad=True, fit_input_grad=fit)
            if fit and not host and input_grad_scale is not beta:
                # decided on the device: noted, read when asked
                self._pending.append(('out', key, beta, input_grad_scale,
                                      input_grad_scale))
                beta = input_grad_scale
                in_scales[0] = self.scales.product(alpha, beta)
            elif fit and host and input_grad_scale != beta:
                # the guard lowered β: the input gradient's α follows
                self._guarded[(key, 'out')] = int(round(math.log2(
                    beta / input_grad_scale)))
                beta = input_grad_scale
                in_scales[0] = self.scales.product(alpha, beta)
            self.gemm_records[func.scale_key] = (alpha, beta)
            for i in range(1, len(inputs)):
                in_scales[i] = self.scales.product(alpha, weight_grad_scale)
            by_input = dict(zip(targets, gxs)) if len(gxs) != len(inputs) \
                else dict(enumerate(gxs))
            self.uses.append(GemmUse(key, entering_alpha, origins, tuple(
                by_input[i].array for i in (1, 2)
                if by_input.get(i) is not None)))
        else:
            gxs = func.backward(targets, out_grad)
            if ratio is not None:
                # a split's concatenation or a reshape that keeps the last
                # axis: the slices are where they were
                _with_ratio(gxs[0], ratio)
            if (pending or self.nonlinear_scale is not None and isinstance(
                    func, _SHRINKING)) and gxs[0] is not None:
                # σ is decided where the gradient is stored (the next
                # GEMM); the mark names the node it came from
                source = getattr(out_grad[0], _NONLINEAR_PENDING) \
                    if pending else func.label
                setattr(gxs[0], _NONLINEAR_PENDING, source)
        for hook in hooks:
            hook.backward_postprocess(func, in_data, out_arrays)
        if is_gemm and self.observe is not None:
            by_input = gxs if len(gxs) == len(inputs) else dict(
                zip(targets, gxs))
            self.observe(func, {i: by_input[i].array for i in targets
                                if by_input[i] is not None},
                         in_scales)

        if len(gxs) == len(inputs) and len(inputs) != len(targets):
            gxs = tuple(gxs[i] for i in targets)
        elif len(gxs) != len(targets):
            raise ScaleAwareBackwardError(
                'function {} returned {} gradients, expected {} or {}'.format(
                    func.label, len(gxs), len(targets), len(inputs)))
        for i, gx in zip(targets, gxs):
            if gx is None or gx.raw_array is None:
                continue
            x = inputs[i]
            grads.setdefault(x, []).append((gx, in_scales[i]))
            if x.creator_node is not None:
                # a GEMM's input gradient comes from that GEMM; any other
                # node's from where its output gradients came from
                here = frozenset((key,)) if is_gemm else origins
                self._origin[x] = self._origin.get(x, frozenset()) | here
            if self.loss_gradient is not None:
                self._direct[x] = self._direct.get(x, True) and direct \
                    and not is_gemm
            if x.creator_node is None:
                leaves[x] = None
            else:
                add_cand(x.creator_node)

    def _defers_split(self, func, present):
        """Whether the gradients of ``func``'s outputs keep their own
        scales through it: a split along the last axis (its backward is a
        concatenation) of float32 gradients at different scales, with
        ``split_scales``."""
        if not self.split_scales or not isinstance(
                func, _c_split_axis.SplitAxis):
            return False
        ndim = len(func._shapes[0])
        return func.axis % ndim == ndim - 1 and all(
            g.array.dtype == numpy.float32 for _, g, _ in present)

    @staticmethod
    def _keeps_last_axis(func, ratio):
        """A reshape whose input and output share the last axis that the
        slice ratios run along: the slices pass through in place."""
        if not isinstance(func, _c_reshape.Reshape):
            return False
        y = func.outputs[0]()
        n = ratio.shape[0]
        return y is not None and func.inputs[0].shape[-1] == n and \
            y.shape[-1] == n

    def _settled(self, g, alpha):
        """``(g, α)``, or for a softmax's or GELU's gradient whose σ is
        still to be decided (``nonlinear_scale``) ``(σ·g, α·σ)``: σ from the values
        where it is stored (the GEMM it enters) or where it meets anything
        but a mask, a cast, a reshape or a constant factor."""
        if g is None or not getattr(g, _NONLINEAR_PENDING, False):
            return g, alpha
        sigma = self.nonlinear_scale(g.array, alpha)
        self.nonlinear_records.append((getattr(g, _NONLINEAR_PENDING),
                                       alpha, sigma))
        if sigma == 1:
            g = chainer.Variable(g.array, requires_grad=False)  # unmarked
            return g, alpha
        return self.scales.rescale(g, sigma), self.scales.product(
            alpha, sigma)

    def _step_matmul(self, func, targets, inputs, out_grad, alpha, origins,
                     direct, grads, add_cand, leaves, hooks_base):
        """:meth:`_step` for a GEMM of two activations: the entering
        gradient checked (and guarded) as a layer GEMM's, then one β per
        input gradient from Algorithm 4 with the other operand as W (each
        :class:`~ada_loss.functions.matmul.OperandGradient` is the GEMM
        the scaling rule sees), each gradient fitted by the guard on its
        own and sent on at α·β_i."""
        key = gemm_key(func)
        host = not self.scales.on_device
        out_grad = (_materialized(out_grad[0]),) + tuple(out_grad[1:])
        views = {i: func.operand_gradient(i) for i in targets}
        self.layers.extend(v.scale_key for v in views.values())
        check = self._check_entering if host else \
            self._check_entering_on_device
        out_grad, alpha = check(func, key, out_grad, alpha, origins)
        if direct:
            self.loss_gradient(func, out_grad[0].array, alpha)
        out_grad = (func.quantize_grad_output(out_grad[0]),)
        g = out_grad[0].array
        betas = {i: self.gemm_scale(v, v.gemm_weight(), g, alpha)
                 for i, v in views.items()}
        self._check_backward(func)
        hooks = _function_hooks(func, hooks_base)
        in_data = tuple(x.data for x in inputs)
        out_arrays = (g,)
        for hook in hooks:
            if hasattr(hook, 'scaled_backward_preprocess'):
                hook.scaled_backward_preprocess(func, in_data, out_arrays,
                                                betas)
            else:
                hook.backward_preprocess(func, in_data, out_arrays)
        fit = self.guard
        gxs, produced = func.backward_scaled(
            targets, out_grad, input_scales=betas, fit_input_grad=fit)
        for hook in hooks:
            hook.backward_postprocess(func, in_data, out_arrays)
        self.uses.append(GemmUse(key, alpha, origins, ()))
        for i, gx in zip(targets, gxs):
            beta, got = betas[i], produced[i]
            view_key = views[i].scale_key
            if fit and not host and got is not beta:
                self._pending.append(('out', view_key, beta, got, got))
                beta = got
            elif fit and host and got != beta:
                self._guarded[(view_key, 'out')] = int(round(math.log2(
                    beta / got)))
                beta = got
            self.gemm_records[view_key] = (alpha, beta)
            scale = self.scales.product(alpha, beta)
            if self.observe is not None:
                self.observe(views[i], {0: gx.array}, [scale])
            if gx is None or gx.raw_array is None:
                continue
            x = inputs[i]
            grads.setdefault(x, []).append((gx, scale))
            if x.creator_node is not None:
                self._origin[x] = self._origin.get(x, frozenset()) | \
                    frozenset((view_key,))
            if self.loss_gradient is not None:
                self._direct[x] = False
            if x.creator_node is None:
                leaves[x] = None
            else:
                add_cand(x.creator_node)

    def _check_entering(self, func, key, out_grad, alpha, origins):
        """The gradient entering a GEMM (host arrays), decided on the value
        the GEMM stores (its rounding to the stored format): notes the
        first one of the pass that is non-finite or overflows when rounded
        (without the guard it is this GEMM's rounding that overflows, so
        this GEMM is named, with the value stored); with the guard, brings
        one that would overflow into range by 2^-k and lowers α by the same
        2^-k. Returns the (possibly rescaled) gradients and α."""
        g = out_grad[0]
        fmt = _stored_format(func, g.array)
        if fmt is _FLOAT16 and g.array.dtype == numpy.float16:
            # FP16 storage: a finite value cannot overflow its own format,
            # so there is nothing to guard; a non-finite one shows in this
            # GEMM's weight gradient, which the caller checks only when the
            # step is skipped (AdaLossScaled.last_nonfinite): no pass here
            return out_grad, alpha
        if self._nonfinite is not None and (fmt is None or
                                            not self.guard):
            return out_grad, alpha     # nothing left to note or to guard
        peak = _max_abs(g)
        if not math.isfinite(peak):
            if self._nonfinite is None:
                self._nonfinite = NonFinite(key, alpha, peak, origins)
            return out_grad, alpha
        if fmt is None:
            return out_grad, alpha
        ratio = fit_ratio(peak, fmt)
        if ratio == 1:
            return out_grad, alpha
        if not self.guard:
            if self._nonfinite is None:
                self._nonfinite = NonFinite(key, alpha, _stored(peak, fmt),
                                            origins)
            return out_grad, alpha
        self._guarded[(key, 'in')] = -int(math.log2(ratio))
        return (HostScales.rescale(g, ratio),) + tuple(out_grad[1:]), \
            alpha * ratio

    def _check_entering_on_device(self, func, key, out_grad, alpha,
                                  origins):
        """:meth:`_check_entering` on device arrays: the peak and the fit
        (1 for a peak that is not finite or does not overflow) are computed
        on the device, the gradient and α multiplied by the fit with the
        guard, and what to note is kept until read (:meth:`_read_pending`):
        no host read."""
        g = out_grad[0]
        fmt = _stored_format(func, g.array)
        if fmt is _FLOAT16 and g.array.dtype == numpy.float16:
            return out_grad, alpha     # as on the host: nothing to guard
        device = device_kernels()
        peak = device.max_abs(g.array)
        ratio = 1.0 if fmt is None else device.fit_ratio(peak, fmt)
        self._pending.append(('in', key, alpha, peak, ratio, origins, fmt,
                              self.guard))
        if fmt is None or not self.guard:
            return out_grad, alpha
        return (DeviceScales.rescale(g, ratio),) + tuple(out_grad[1:]), \
            alpha * ratio

    @staticmethod
    def _check_backward(func):
        own = type(func).backward
        if own is chainer.FunctionNode.backward:
            raise ScaleAwareBackwardError(
                'function {} implements only backward_accumulate, which sums '
                'incoming gradients itself: it cannot be used with '
                'layer-wise loss scaling'.format(func.label))
