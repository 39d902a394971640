"""Which layer overflowed: the record of a skipped step.

A step whose gradients are non-finite (or, in a saturating format, at
± u_max) is skipped by :class:`ada_loss.training.MixedPrecisionUpdater`.
What a user of any loss scaler asks then (PyTorch's GradScaler and
Transformer Engine users alike) is *where*: this module names the first
layer, in backward order, whose gradient went non-finite, with the scale α it
was carried at and the largest magnitude it reached.

* The layer-wise modes (adaptive, amax) see every gradient entering a GEMM
  and name the first non-finite one themselves
  (:meth:`ada_loss.scaling.LossScaling.last_nonfinite`).
* Otherwise (fixed, dynamic, or a non-finite weight gradient) the first
  parameter in backward order whose gradient overflowed is named: the order
  is read from the graph of the step's loss, only when a step is skipped, so
  a clean step costs nothing.
"""
import collections
import heapq

import chainer
from chainer.functions.array.cast import Cast
import numpy

from ada_loss.functions.gemm import Quantize
from ada_loss.loss_scale.gemm import max_abs

#: One skipped step: the iteration it would have been, the layer (a link
#: path; ``''`` where this process saw no non-finite gradient: another rank's
#: under data parallelism), the scale α its gradient was carried at, and the
#: largest magnitude it reached (Inf or NaN for a non-finite gradient).
SkipRecord = collections.namedtuple(
    'SkipRecord', ('iteration', 'layer', 'alpha', 'max_abs'))


def _is_cast(func):
    """A node whose backward hands the gradient on unchanged (up to dtype):
    the rounding of W and b to an emulated format, a dtype cast. A
    parameter behind one is reached where the node's consumer runs, not
    where the cast (rank 0) would be popped."""
    return isinstance(func, (Quantize, Cast))


def _behind_casts(node):
    """The leaf variable node ``node`` is a cast of (through any chain of
    casts), or None."""
    while node.creator_node is not None:
        func = node.creator_node
        if not _is_cast(func) or len(func.inputs) != 1:
            return None
        node = func.inputs[0]
    return node


def backward_order(loss):
    """The leaf variable nodes of ``loss``'s graph in the order Chainer's
    backward reaches them (function nodes by decreasing rank), a leaf
    behind casts where the cast's consumer runs."""
    if loss.creator_node is None:
        return []
    heap, seen, leaves, met = [], set(), [], set()

    def push(func):
        if id(func) not in seen:
            seen.add(id(func))
            heapq.heappush(heap, (-func.rank, len(seen), func))

    push(loss.creator_node)
    while heap:
        _, _, func = heapq.heappop(heap)
        for x in func.inputs:
            leaf = x if x.creator_node is None else _behind_casts(x)
            if leaf is not None:
                if id(leaf) not in met:
                    met.add(id(leaf))
                    leaves.append(leaf)
            elif x.creator_node is not None:
                push(x.creator_node)
    return leaves


def _layer_of(param_name):
    """'/res2/0/conv1/W' → 'res2/0/conv1'."""
    return param_name.strip('/').rpartition('/')[0]


def trace_nonfinite(loss, params, overflowed, scale):
    """The first parameter-gradient *contribution*, in backward order, that
    ``overflowed``: the backward of ``loss``'s graph is run again (function
    nodes by decreasing rank, as Chainer's; no parameter's gradient is
    touched) from the loss gradient at ``scale``, and each gradient a node
    hands to a parameter (directly or through casts) is tested as it is
    produced. A layer whose weights are shared is so named for its own use
    only, not for an overflow that reached a later use from another layer.

    Args:
        loss: the step's loss Variable (its graph, still alive).
        params: {id(parameter VariableNode): (name, parameter)}.
        overflowed (callable): ``overflowed(param, array)`` → bool.
        scale (float): the loss scale the backward started from.

    Returns:
        (name, parameter, max|g|) of that contribution, or None (nothing overflowed,
        or a graph this walk cannot run: a non-scalar loss).
    """
    if loss.creator_node is None or loss.array.size != 1:
        return None
    xp = chainer.backend.get_array_module(loss.array)
    grads = {loss.node: [xp.full_like(loss.array, scale)]}
    heap, seen = [], set()

    def push(func):
        if id(func) not in seen:
            seen.add(id(func))
            heapq.heappush(heap, (-func.rank, len(seen), func))

    push(loss.creator_node)
    with chainer.using_config('enable_backprop', False), \
            numpy.errstate(over='ignore', invalid='ignore'):
        while heap:
            _, _, func = heapq.heappop(heap)
            outs = [y() for y in func.outputs]
            gys = []
            for y in outs:
                arrays = grads.pop(y, None) if y is not None else None
                if not arrays:
                    gys.append(None)
                    continue
                total = arrays[0]
                for a in arrays[1:]:
                    total = total + a
                gys.append(chainer.Variable(total, requires_grad=False))
            targets = tuple(i for i, x in enumerate(func.inputs)
                            if x.requires_grad)
            if not targets or all(g is None for g in gys):
                continue
            gxs = func.backward(targets, tuple(gys))
            if len(gxs) == len(func.inputs) and len(gxs) != len(targets):
                gxs = tuple(gxs[i] for i in targets)
            for i, gx in zip(targets, gxs):
                if gx is None:
                    continue
                x = func.inputs[i]
                leaf = x if x.creator_node is None else _behind_casts(x)
                if leaf is not None:
                    named = params.get(id(leaf))
                    if named is not None and overflowed(named[1], gx.array):
                        return named[0], named[1], max_abs(gx.array)
                    continue
                grads.setdefault(x, []).append(gx.array)
                push(x.creator_node)
    return None


def locate_nonfinite(model, loss, overflowed, scale):
    """(layer, α, max|g|) of the first parameter gradient, in backward
    order, that ``overflowed``; ``('', scale, nan)`` if none did.

    The step's backward is traced again (:func:`trace_nonfinite`, only on
    a skipped step): the first contribution to a parameter's gradient that
    overflowed names its layer; where the trace finds none (a loss it
    cannot run), the summed gradients are read in backward order.

    Args:
        model: the model (its named parameters).
        loss: the step's loss Variable (its graph is walked).
        overflowed (callable): ``overflowed(param, array)`` → bool, for a
            gradient array of ``param``.
        scale (float): the global loss scale (a parameter's own α, where
            set, is preferred).
    """
    named = list(model.namedparams())
    by_node = {id(p.node): (name, p) for name, p in named}
    found = trace_nonfinite(loss, by_node, overflowed, scale)
    if found is not None:
        name, p, peak = found
        alpha = getattr(p, '_loss_scale', None)
        return (_layer_of(name), float(scale if alpha is None else alpha),
                peak)
    ordered = [by_node[id(n)] for n in backward_order(loss)
               if id(n) in by_node]
    seen = {name for name, _ in ordered}
    # parameters the walk did not reach (e.g. a graph freed early) last
    ordered += [(n, p) for n, p in named if n not in seen]
    for name, p in ordered:
        if p.grad is not None and overflowed(p, p.grad):
            alpha = getattr(p, '_loss_scale', None)
            return (_layer_of(name), float(scale if alpha is None
                                           else alpha),
                    max_abs(p.grad))
    return '', float(scale), float('nan')
