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
from chainer.functions.math.basic_math import add as _chainer_add
from chainer.utils import type_check
import numpy

from ada_loss.formats import narrow, widen
from ada_loss.functions.fp16_elementwise import emulates_fp16_elementwise

_U16 = numpy.uint16


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


def _has_nan(a):
    """True if the float16 array ``a`` holds a NaN (one pass on its bits)."""
    return a.size > 0 and int(
        numpy.bitwise_and(a.view(_U16), _U16(0x7FFF)).max()) > 0x7C00


def _sum(a, b):
    """NumPy's ``a + b`` of two float16 NumPy arrays (broadcast), bit for
    bit, as a float16 array (never a NumPy scalar), laid out as NumPy lays
    out ``a + b``.

    ``narrow(widen(b) + widen(a))``: b + a is the same sum (IEEE addition
    commutes), and for NaN + NaN NumPy's float16 loop, whose compiled
    scalar addition returns its second operand's payload, gives what the
    float32 loops of two arrays of one shape give for b + a (the first
    operand's; ``widen`` copies a broadcast view of one shape into an array
    of its own). Where the shapes differ (or are 0-dim) NumPy broadcasts
    with other float32 loops, some of which return the other payload:
    there, if both operands hold a NaN, the elements where both are NaN are
    set to b's NaN, quieted, which is what the float16 loop stores.
    """
    with numpy.errstate(invalid='ignore', over='ignore'):
        s = narrow(widen(b) + widen(a))
    if a.shape == b.shape and a.ndim > 0:
        return s
    if _has_nan(a) and _has_nan(b):
        quiet_b = numpy.bitwise_or(b.view(_U16), _U16(0x0200))
        numpy.copyto(s.view(_U16), numpy.broadcast_to(quiet_b, s.shape),
                     where=numpy.isnan(a) & numpy.isnan(b))
    return s


class Add(GradAccumulation, function_node.FunctionNode):
    """The sum of two or more float16 NumPy arrays, with broadcasting:
    Chainer's ``Add`` (two addends) and ``MultiAdd`` (more), bit for bit.

    Two addends: ``a + b``. More: as ``MultiAdd``, ``y = x0 + x1``, then
    for each further x, ``y += x`` (in y's memory) if x has y's shape, else
    ``y = x + y``; every partial sum rounded to float16, as NumPy rounds it.
    Type checks and errors are Chainer's (``Add``'s for two addends,
    ``MultiAdd``'s for more). The backward is Chainer's: ``sum_to`` of the
    output gradient to each input's shape (the gradient itself where the
    shapes agree), so double backpropagation is Chainer's too.
    """

    is_elementwise = True

    @property
    def label(self):
        return '_ + _'

    def check_type_forward(self, in_types):
        if len(in_types) == 2:     # Chainer's Add
            type_check._argname(in_types, ('lhs', 'rhs'))
            type_check.expect(in_types[0].dtype == in_types[1].dtype)
            type_check.expect_broadcast_shapes(
                in_types[0].shape, in_types[1].shape)
            return
        for i, in_type in enumerate(in_types):     # Chainer's MultiAdd
            type_check._argname((in_type,), ('x{}'.format(i),))
            type_check.expect(in_types[0].dtype == in_type.dtype)

    def forward_cpu(self, inputs):
        y = _sum(inputs[0], inputs[1])
        for x in inputs[2:]:
            if x.shape == y.shape:      # y += x
                s = _sum(y, x)
                if s.strides != y.strides:
                    numpy.copyto(y, s)
                    s = y
                y = s
            else:
                y = _sum(x, y)
        return y,

    def backward(self, indexes, grad_outputs):
        gy, = grad_outputs
        return tuple(chainer.functions.sum_to(gy, self.inputs[i].shape)
                     for i in indexes)


def add(*xs):
    """:func:`chainer.functions.add`: ``lhs + rhs`` or the sum of any number
    of Variables or arrays, broadcast. Two or more float16 NumPy arrays
    (emulated mode) go through :class:`Add`; anything else (a scalar addend,
    one addend, other dtypes, CuPy) to Chainer's own ``add``. Same result
    bit for bit."""
    if len(xs) >= 2 and emulates_fp16_elementwise(*xs):
        return Add().apply(xs)[0]
    return _chainer_add(*xs)
