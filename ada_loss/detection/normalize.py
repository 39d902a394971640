"""FP16-safe L2 normalization for SSD's ``conv4_3`` branch (paper §4.3).

SSD rescales the ``conv4_3`` features with ChainerCV's
:class:`~chainercv.links.model.ssd.Normalize` (ParseNet's learnable L2
normalization): ``y = scale * x / (||x||_2 + eps)`` over the 512 channels.
With FP16 input ``chainer.functions.normalize`` computes everything in FP16:

* forward: ``sum(x**2)`` over 512 channels overflows 65504 as soon as the
  ReLU features reach |x| ~ 11 on average (or one of them 256): ``||x||`` is
  Inf and the branch outputs zeros; features below 2^-12 square to zero;
* ``eps = 1e-5`` is a subnormal in FP16 (stored as 1.0014e-5);
* backward divides by ``norm ** 2``, which overflows for ``||x|| > 256``:
  the branch's gradient becomes 0 or NaN.

MPT computes such reductions in FP32 (Micikevicius et al. 2018); Chainer's
mixed16 keeps them in FP16. :class:`FP32Normalize` casts the input up,
normalizes and scales in FP32 and casts the result back; its backward runs
through the same casts, i.e. in FP32 as well.

One more FP16 hazard is in the backward: at an all-zero feature vector
(``||x|| = 0``, e.g. the mean-filled border of an expanded image with
zero-initialized biases) the input gradient is ``scale * gy / eps``, ~1e5-1e6
times the upstream gradient, which overflows when cast back to FP16; SSD's
ReLU backward then computes ``Inf * 0 = NaN`` at exactly those entries
(ReLU's output is 0 there). So, for FP16 input only, the gradient at entries
where ``x == 0`` is set to 0 in FP32 before the cast: SSD feeds Normalize a
ReLU output, whose backward zeroes those entries anyway, so the result is
unchanged except that no NaN appears. In float32 nothing differs from
ChainerCV.

It is installed by changing the class of the model's existing ``Normalize``
links (:func:`make_normalize_fp32`): parameters, names and values are
untouched and ChainerCV is not edited.
"""
import chainer
import chainer.functions as F
import numpy
from chainer import backend
from chainercv.links.model.ssd import Normalize


class ZeroGradAtZeros(chainer.FunctionNode):
    """Identity whose backward zeroes the gradient where the input is 0."""

    def forward(self, inputs):
        x, = inputs
        self._mask = x != 0
        return x,

    def backward(self, indexes, grad_outputs):
        gy, = grad_outputs
        xp = backend.get_array_module(gy.array)
        return chainer.Variable(
            xp.where(self._mask, gy.array, gy.array.dtype.type(0)),
            requires_grad=False),


class FP32Normalize(Normalize):
    """:class:`chainercv.links.model.ssd.Normalize` computed in FP32."""

    def forward(self, x):
        dtype = x.dtype
        if dtype == numpy.float32:
            return super(FP32Normalize, self).forward(x)
        x = F.cast(x, numpy.float32)
        x, = ZeroGradAtZeros().apply((x,))
        y = F.normalize(x, eps=self.eps, axis=1)
        scale = F.cast(self.scale, numpy.float32)
        y = y * F.broadcast_to(scale[:, None, None], y.shape)
        return F.cast(y, dtype)


def make_normalize_fp32(model):
    """Makes every ``Normalize`` link of ``model`` an :class:`FP32Normalize`
    in place; returns their paths."""
    paths = []
    for path, link in model.namedlinks():
        if type(link) is Normalize:
            link.__class__ = FP32Normalize
        if isinstance(link, FP32Normalize):
            paths.append(path.lstrip('/'))
    return paths
