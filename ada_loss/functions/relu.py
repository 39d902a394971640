"""ReLU on float16 bit patterns (mixed16 on CPU).

Chainer's ReLU computes ``numpy.maximum(x, 0)`` and its gradient
``gy * (y > 0)``; on float16 NumPy arrays both run NumPy's scalar float16
loops. Neither rounds anything: the result is an input or a zero. So
they are computed here on the uint16 bit patterns with vectorized integer
operations, reproducing NumPy's float16 semantics exactly (checked on all
65536 patterns):

* ``maximum(x, 0)`` returns x where ``x >= 0`` (−0 included: −0 >= +0) or x
  is NaN, else +0: +0 exactly for the patterns 0x8001..0xFC00 (negative
  numbers and −Inf);
* ``gy * (y > 0)`` is gy where 0 < y (patterns 0x0001..0x7C00), else
  gy · 0 = a zero with gy's sign. A non-finite gy (Inf · 0 is NaN, a NaN is
  quieted by the multiplication) sends the whole array through NumPy's own
  expression: exact, and rare (an overflowing loss-scaled step).

A 0-dim array gives a 0-dim array, as Chainer's (NumPy's integer ufuncs
return a NumPy scalar there, which ``force_array`` makes an array again).
"""
import numpy
from chainer import function_node
from chainer.functions.activation.relu import relu as _chainer_relu
from chainer.utils import force_array

from ada_loss.functions.add import GradAccumulation
from ada_loss.functions.fp16_elementwise import emulates_fp16_elementwise

_U16 = numpy.uint16


def _bits(a):
    return a.view(_U16)


class ReLU(GradAccumulation, function_node.FunctionNode):
    """``max(x, 0)`` of a float16 NumPy array, on its bit patterns."""

    is_elementwise = True

    def forward_cpu(self, inputs):
        x, = inputs
        u = _bits(x)
        keep = (u - _U16(0x8001)) >= _U16(0x7C00)   # not x < 0
        y = force_array(numpy.multiply(u, keep, dtype=_U16))
        self.retain_outputs((0,))
        return y.view(numpy.float16),

    def backward(self, indexes, grad_outputs):
        y = self.get_retained_outputs()[0].raw_array
        return ReLUGrad(y).apply(grad_outputs)


class ReLUGrad(GradAccumulation, function_node.FunctionNode):
    """``gy * (y > 0)`` for float16 NumPy arrays, on the bit patterns.

    Its own gradient is the same function of the same ``y`` (as Chainer's
    ``ReLUGrad2``).
    """

    is_elementwise = True

    def __init__(self, y):
        super(ReLUGrad, self).__init__()
        self.y = y

    def forward_cpu(self, inputs):
        gy, = inputs
        g = _bits(gy)
        mags = numpy.bitwise_and(g, _U16(0x7FFF))
        if mags.size and int(mags.max()) >= 0x7C00:
            # Inf or NaN in gy: NumPy's own float16 expression (exact)
            return force_array(gy * (self.y > 0), dtype=gy.dtype),
        positive = (_bits(self.y) - _U16(1)) < _U16(0x7C00)   # 0 < y
        # 0xFFFF keeps gy, 0x8000 keeps its sign only (gy · 0)
        mask = numpy.multiply(positive, _U16(0x7FFF), dtype=_U16)
        mask |= _U16(0x8000)
        # gy first: the result is laid out as NumPy lays out gy * (y > 0)
        return force_array(numpy.bitwise_and(g, mask)).view(numpy.float16),

    def backward(self, indexes, grad_outputs):
        return ReLUGrad(self.y).apply(grad_outputs)


def relu(x):
    """:func:`chainer.functions.relu`; on float16 NumPy arrays (emulated
    mode) through :class:`ReLU`, with the same result bit for bit; anything
    else through Chainer's own ``relu`` (also where this function has been
    put in ``chainer.functions``' place)."""
    if emulates_fp16_elementwise(x):
        return ReLU().apply((x,))[0]
    return _chainer_relu(x)
