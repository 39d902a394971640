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

from ada_loss.loss_scale.gemm import max_abs

#: One skipped step: the iteration it would have been, the layer (a link
#: path; ``''`` where this process saw no non-finite gradient: another rank's
#: under data parallelism), the scale α its gradient was carried at, and the
#: largest magnitude it reached (Inf or NaN for a non-finite gradient).
SkipRecord = collections.namedtuple(
    'SkipRecord', ('iteration', 'layer', 'alpha', 'max_abs'))


def backward_order(loss):
    """The leaf variable nodes of ``loss``'s graph in the order Chainer's
    backward reaches them (function nodes by decreasing rank)."""
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
            if x.creator_node is not None:
                push(x.creator_node)
            elif id(x) not in met:
                met.add(id(x))
                leaves.append(x)
    return leaves


def _layer_of(param_name):
    """'/res2/0/conv1/W' → 'res2/0/conv1'."""
    return param_name.strip('/').rpartition('/')[0]


def locate_nonfinite(model, loss, overflowed, scale):
    """(layer, α, max|g|) of the first parameter, in backward order, whose
    gradient ``overflowed(param)``; ``('', scale, nan)`` if none did.

    Args:
        model: the model (its named parameters).
        loss: the step's loss Variable (its graph is walked).
        overflowed (callable): ``overflowed(param)`` → bool.
        scale (float): the global loss scale (a parameter's own α, where
            set, is preferred).
    """
    by_node = {id(p.node): (name, p) for name, p in model.namedparams()}
    ordered = [by_node[id(n)] for n in backward_order(loss)
               if id(n) in by_node]
    named = {name for name, _ in ordered}
    # parameters the walk did not reach (e.g. a graph freed early) last
    ordered += [(n, p) for n, p in model.namedparams() if n not in named]
    for name, p in ordered:
        if overflowed(p):
            alpha = getattr(p, '_loss_scale', None)
            return (_layer_of(name), float(scale if alpha is None
                                           else alpha),
                    max_abs(p.grad))
    return '', float(scale), float('nan')
