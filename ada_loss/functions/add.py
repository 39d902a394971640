"""Addition of float16 arrays (mixed16 on CPU): the shortcut sums of ResNets
and the sums of gradients where a variable has several consumers.

NumPy's float16 ``a + b`` converts both operands to float32, adds, and
rounds the sum to float16, one element at a time. :class:`Add` does the
same with vectorized loops: exact widening, float32 addition, one
round-to-nearest-even (:func:`ada_loss.formats.narrow`), so the result is
bit for bit NumPy's (and laid out as NumPy lays out ``a + b``: widening and
narrowing keep each array's memory order).

Chainer's backward sums the gradients of a variable used several times
(the input of a residual block: its first convolution and the shortcut)
with ``F.add`` as soon as a second one arrives. :class:`GradAccumulation`
gives a node Chainer's own hook for that, ``backward_accumulate``, so the
sum goes through :func:`add` with the same operands in the same order.
"""
import chainer
from chainer import function_node
import numpy

from ada_loss.formats import narrow, widen
from ada_loss.functions.fp16_elementwise import emulates_fp16_elementwise


class GradAccumulation(object):
    """Mixin of a ``FunctionNode``: ``backward_accumulate`` that adds the
    node's input gradients to those already accumulated through
    :func:`add` (float16 NumPy arrays: :class:`Add`).

    Chainer (``lazy_grad_sum`` off, its default) sums the gradients of an
    input as they arrive: after each node's backward, ``F.add(existing,
    new)``. A node that overrides ``backward_accumulate`` receives
    ``existing`` instead and returns the sum; ``add(existing, new)`` is the
    same sum bit for bit. (With ``lazy_grad_sum`` on, Chainer sums three or
    more gradients of one array in one ``F.add`` call, left to right; this
    node then adds its own to the last one first.) The ⟨α, δ⟩ backward of
    :mod:`ada_loss.adaptive` calls ``backward`` and sums itself.
    """

    def backward_accumulate(self, target_input_indexes, grad_outputs,
                            grad_inputs):
        gxs = self._backward_target_inputs(target_input_indexes,
                                           grad_outputs)
        return tuple(gx if g_in is None else g_in if gx is None
                     else add(g_in, gx)
                     for gx, g_in in zip(gxs, grad_inputs))


class Add(GradAccumulation, function_node.FunctionNode):
    """``a + b`` of two float16 NumPy arrays of one shape."""

    is_elementwise = True

    @property
    def label(self):
        return '_ + _'

    def forward_cpu(self, inputs):
        a, b = inputs
        # b + a: the same sum (IEEE addition commutes), and for NaN + NaN the
        # same NaN as NumPy's float16 loop, whose compiled scalar addition
        # returns its second operand's payload (SIMD float32 addition
        # returns the first one's)
        with numpy.errstate(invalid='ignore', over='ignore'):
            return narrow(widen(b) + widen(a)),

    def backward(self, indexes, grad_outputs):
        # as Chainer's Add (sum_to of a same-shape gradient is the gradient)
        return tuple(grad_outputs[0] for _ in indexes)


def add(a, b):
    """``a + b`` of Variables or arrays: through :class:`Add` for float16
    NumPy arrays of one shape (emulated mode), else Chainer's own addition
    (broadcasting, scalars, other dtypes). Same result bit for bit."""
    if emulates_fp16_elementwise(a, b) and a.shape == b.shape:
        return Add().apply((a, b))[0]
    return chainer.functions.add(a, b)
