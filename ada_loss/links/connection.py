"""Linear, Convolution2D, Deconvolution2D (and Chainer's DilatedConvolution2D).

Each is its ``chainer.links`` parent with only ``forward`` changed: the same
computation (the same arguments, Chainer 7.8.1's keyword arguments included,
and Chainer's dtype contract) through the :mod:`ada_loss.functions` nodes.

Two ways to get one:

* build it (``ada_loss.links.Convolution2D(3, 16, 3)``), or
* convert an existing Chainer link with :func:`as_gemm_link` — what
  :class:`ada_loss.AdaLossScaled` and
  :func:`ada_loss.training.apply_precision` do to every GEMM link of a model.

Conversion is in place, by design: the link keeps its identity, so every
reference to it (its parent Chain or ChainList, Python lists a model keeps
of its layers, an optimizer already set up, hooks, serializers) stays
valid, and nothing is copied. What changes is exactly the class, from a
Chainer GEMM link type to its subclass here, which adds no state and no
parameter: parameter objects, values and names stay, and the float32
forward result is bit-identical. :func:`as_chainer_link` converts back.
Only the exact Chainer types are converted (a user subclass may override
``forward``, which the conversion would silently bypass).
"""
import chainer
import chainer.links as L
from chainer import memory_layouts
from chainer import utils

from ada_loss import functions


class _GemmLink(object):
    #: Path of the layer in its model (e.g. ``'res2/0/conv1'``); names the
    #: layer's loss scale. Set by :class:`ada_loss.AdaLossScaled`.
    scale_key = None
    #: (forward format, backward format) of an emulated precision, or None
    #: (float32, mixed16). Set by
    #: :func:`ada_loss.training.precision_setup.apply_precision`.
    gemm_formats = None
    #: the layer's :class:`ada_loss.formats.recipe.GemmScaling` under a
    #: scaled recipe (per-tensor FP8, MX, NVFP4, blockwise), or None. Set by
    #: :func:`ada_loss.training.precision.apply_precision`; its state (the
    #: delayed recipe's amax histories, NVFP4's stochastic-rounding step)
    #: is serialized with the link.
    gemm_scaling = None

    def serialize(self, serializer):
        super(_GemmLink, self).serialize(serializer)
        if self.gemm_scaling is not None and self.gemm_scaling.has_state:
            self.gemm_scaling.serialize(serializer['gemm_scaling'])

    def _gemm_inputs(self, x):
        """x, W, b as the GEMM stores them: rounded to the forward format
        (the FP32 parameters are the master copies; the rounding passes
        gradients through unchanged)."""
        fmt = None if self.gemm_formats is None else self.gemm_formats[0]
        b = getattr(self, 'b', None)
        return (functions.quantize(x, fmt), functions.quantize(self.W, fmt),
                functions.quantize(b, fmt))


class Linear(_GemmLink, L.Linear):
    """:class:`chainer.links.Linear` on :func:`ada_loss.functions.linear`."""

    def forward(self, x, n_batch_axes=1):
        if self.W.array is None:
            self._initialize_params(
                utils.size_of_shape(x.shape[n_batch_axes:]))
        x, W, b = self._gemm_inputs(x)
        return functions.linear(x, W, b, n_batch_axes=n_batch_axes,
                                scale_key=self.scale_key,
                                formats=self.gemm_formats,
                                scaling=self.gemm_scaling)


class Convolution2D(_GemmLink, L.Convolution2D):
    """:class:`chainer.links.Convolution2D` on
    :func:`ada_loss.functions.convolution_2d`."""

    def forward(self, x):
        x = chainer.as_variable(x)
        assert x.layout == self.x_layout
        if self.W.raw_array is None:
            _, c, _, _ = memory_layouts.get_semantic_shape(
                x, assumed_layout=self.x_layout)
            self._initialize_params(c)
        x, W, b = self._gemm_inputs(x)
        return functions.convolution_2d(
            x, W, b, self.stride, self.pad, dilate=self.dilate,
            groups=self.groups, cudnn_fast=self.cudnn_fast,
            scale_key=self.scale_key, formats=self.gemm_formats,
            scaling=self.gemm_scaling)


class DilatedConvolution2D(_GemmLink, L.DilatedConvolution2D):
    """:class:`chainer.links.DilatedConvolution2D` (used by ChainerCV's VGG16)
    on :func:`ada_loss.functions.convolution_2d`."""

    def forward(self, x):
        if self.W.array is None:
            self._initialize_params(x.shape[1])
        x, W, b = self._gemm_inputs(x)
        return functions.convolution_2d(
            x, W, b, self.stride, self.pad, dilate=self.dilate,
            scale_key=self.scale_key, formats=self.gemm_formats,
            scaling=self.gemm_scaling)


class Deconvolution2D(_GemmLink, L.Deconvolution2D):
    """:class:`chainer.links.Deconvolution2D` on
    :func:`ada_loss.functions.deconvolution_2d`."""

    def forward(self, x):
        if self.W.array is None:
            self._initialize_params(x.shape[1])
        x, W, b = self._gemm_inputs(x)
        return functions.deconvolution_2d(
            x, W, b, self.stride, self.pad, self.outsize,
            dilate=self.dilate, groups=self.groups, scale_key=self.scale_key,
            formats=self.gemm_formats, scaling=self.gemm_scaling)


class MatMul(_GemmLink, chainer.Link):
    """A GEMM of two activations, ``a @ b`` over the last two axes
    (attention's Q·Kᵀ and P·V), as a link with no parameter: it gives the
    GEMM a name (``scale_key``, its path) and takes a precision's formats
    and recipe state like the layer links, through
    :func:`ada_loss.functions.matmul.matmul`.

    Args:
        stat_axis: None (Algorithm 4's statistics over the whole tensors)
            or the axis of the heads (every head meets T_uf; docs/modes.md).
        keep_format: None, or a format name (``'bfloat16'``, ``'float32'``)
            this GEMM keeps whatever the precision
            (:func:`ada_loss.training.apply_precision`): attention in
            higher precision, as Transformer Engine's NVFP4 recipe has it.
    """

    def __init__(self, stat_axis=None, keep_format=None):
        super(MatMul, self).__init__()
        self.stat_axis = stat_axis
        self.keep_format = keep_format

    def forward(self, a, b):
        fmt = None if self.gemm_formats is None else self.gemm_formats[0]
        return functions.matmul(
            functions.quantize(a, fmt), functions.quantize(b, fmt),
            scale_key=self.scale_key, formats=self.gemm_formats,
            scaling=self.gemm_scaling, stat_axis=self.stat_axis)


class TiedLinear(_GemmLink, chainer.Link):
    """A Linear layer without bias on another link's weight: ``x · Wᵀ``
    with W the ``W`` of ``owner`` (weight tying: a GPT's readout on its
    token embedding, W of shape (vocab, width)). A GEMM link with no
    parameter of its own, so W is serialized and optimized once, as the
    owner's; in the ⟨α, δ⟩ backward W's gradient sums the owner's use and
    this one's, rescaled to one α by Algorithm 5 where they meet at the
    leaf. The owner is held outside Chainer's link tree (not a child)."""

    def __init__(self, owner):
        super(TiedLinear, self).__init__()
        if getattr(owner, 'W', None) is None:
            raise ValueError('TiedLinear needs a link with a weight W, got '
                             '{}'.format(type(owner).__name__))
        self._owner = [owner]     # a list: not registered as a child

    @property
    def W(self):
        return self._owner[0].W

    def forward(self, x, n_batch_axes=1):
        fmt = None if self.gemm_formats is None else self.gemm_formats[0]
        return functions.linear(
            functions.quantize(x, fmt), functions.quantize(self.W, fmt),
            n_batch_axes=n_batch_axes, scale_key=self.scale_key,
            formats=self.gemm_formats, scaling=self.gemm_scaling)


#: Chainer GEMM link type -> its ada_loss counterpart.
GEMM_LINK_TYPES = {
    L.Linear: Linear,
    L.Convolution2D: Convolution2D,
    L.DilatedConvolution2D: DilatedConvolution2D,
    L.Deconvolution2D: Deconvolution2D,
}


def is_gemm_link(link):
    """Whether ``link`` is an ada_loss GEMM link (a layer's GEMM, the tied
    readout, attention's activation GEMMs): what is named by its path."""
    return isinstance(link, _GemmLink)


def as_gemm_link(link):
    """Converts ``link`` in place to its :mod:`ada_loss.links` type.

    Returns True if ``link`` is an ada_loss GEMM link now (it was one, or it
    was exactly one of the Chainer types of :data:`GEMM_LINK_TYPES`), False
    for any other link (left unchanged). See the module docstring for what
    the conversion keeps.
    """
    if isinstance(link, _GemmLink):
        return True
    target = GEMM_LINK_TYPES.get(type(link))
    if target is None:
        return False
    link.__class__ = target
    return True


def as_chainer_link(link):
    """Undoes :func:`as_gemm_link`: an ada_loss GEMM link becomes its Chainer
    parent type again, with its layer name and formats forgotten. Returns
    True if ``link`` is a Chainer GEMM link now."""
    for chainer_type, ours in GEMM_LINK_TYPES.items():
        if type(link) is ours:
            for name in ('scale_key', 'gemm_formats', 'gemm_scaling'):
                link.__dict__.pop(name, None)
            link.__class__ = chainer_type
            return True
    return type(link) in GEMM_LINK_TYPES
