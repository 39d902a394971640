"""Scaled low-precision GEMM recipes: how each operand of a GEMM is scaled
and cast, and the state that needs (NumPy only; the GEMM nodes of
:mod:`ada_loss.functions` call it).

A :class:`GemmRecipe` is pure data (what a precision string such as
``fp8:recipe=delayed`` or ``mxfp8`` names); :meth:`GemmRecipe.state` makes
the per-layer :class:`GemmScaling` that quantizes the three operand roles
of one GEMM layer:

* ``'x'`` and ``'w'``: the forward input and weight, in the recipe's
  forward element format;
* ``'gy'``: the gradient entering the layer's backward GEMMs (dgrad and
  wgrad), in its backward element format.

Recipes (Transformer Engine, ``transformer_engine/common/recipe``):

* ``current`` (``Float8CurrentScaling``): one FP32 scale per tensor from
  its own amax (:func:`~ada_loss.formats.per_tensor.current_scale`);
* ``delayed`` (``DelayedScaling``): one scale per tensor role from the
  amax history of that role (:class:`~ada_loss.formats.per_tensor.
  DelayedScaling`); the histories are training state (:meth:`serialize`);
* ``mx`` (``MXFP8BlockScaling``, OCP MX v1.0): E8M0 scales per block of 32
  along the GEMM's reduction dimension (:func:`~ada_loss.formats.mx.
  quantize_mx`); the caller gives the axes, and re-quantizes an operand
  used transposed in the backward from its high-precision copy along its
  own reduction there.

Per-tensor recipes quantize each tensor once per step (the backward reuses
the forward's x and W copies, as TE's transposed FP8 copies hold the same
values); MX quantizes per GEMM.

The gradient's scale (``grad``; not in TE): ``'scaled'`` (the default) casts
gy with the recipe's own scale, as above; ``'loss'`` rounds gy *unscaled*
into the backward element format (``FloatFormat.quantize``: overflow gives
NaN, Inf or saturates as that format does), once for both backward GEMMs,
so that its scale is a loss-scaling mode's (fixed, dynamic, adaptive, ...)
while x and W are still cast as the recipe casts them.
"""
import collections


from ada_loss.formats.float_format import get_format
from ada_loss.formats.mx import SCALE_ROUNDINGS, quantize_mx
from ada_loss.formats.per_tensor import (
    DEFAULT_HISTORY, DEFAULT_MARGIN, DelayedScaling, quantize_per_tensor)

RECIPES = ('current', 'delayed', 'mx')
ROLES = ('x', 'w', 'gy')
#: where the incoming gradient's scale comes from: the recipe, or loss
#: scaling (gy rounded unscaled into the backward element format)
GRAD_SCALES = ('scaled', 'loss')
#: the longest delayed amax history (one float32 per step, role and layer;
#: TE's default is 1024): a longer one is a typo that would fill memory
MAX_HISTORY = 2 ** 20
#: margins whose 2^margin is a normal float32 (the scale is divided by it)
MARGIN_RANGE = (-126, 127)
#: formats a GEMM's outputs may be rounded to (TE: BF16 or FP32 outputs)
OUTPUT_FORMATS = ('float32', 'bfloat16')


class GemmRecipe(collections.namedtuple('GemmRecipe', (
        'kind', 'fwd', 'bwd', 'history', 'margin', 'pow2', 'block_size',
        'scale_rounding', 'out', 'grad'), defaults=('scaled',))):
    """A scaled GEMM recipe (see the module docstring).

    Attributes:
        kind (str): ``'current'``, ``'delayed'`` or ``'mx'``.
        fwd, bwd (FloatFormat): element formats of x, W and of gy.
        history (int), margin (int), pow2 (bool): per-tensor options
            (TE's defaults 1024, 0, False).
        block_size (int), scale_rounding (str): MX options (32, ``'up'``).
        out (FloatFormat): the format GEMM outputs (activations and
            gradients) are rounded to: float32 (none) or bfloat16.
        grad (str): ``'scaled'`` (gy cast with the recipe's scale) or
            ``'loss'`` (gy rounded unscaled into ``bwd``: its scale is loss
            scaling's).
    """

    __slots__ = ()

    @property
    def per_tensor(self):
        return self.kind != 'mx'

    @property
    def grad_loss(self):
        """True if gy is rounded unscaled (``grad=loss``)."""
        return self.grad == 'loss'

    @property
    def casts_gy_once(self):
        """True if gy is cast once for both backward GEMMs (per tensor,
        or unscaled), False if per GEMM along its reduction (MX)."""
        return self.per_tensor or self.grad_loss

    def state(self):
        """A fresh :class:`GemmScaling` for one GEMM layer."""
        return GemmScaling(self)


def make_recipe(kind, fwd, bwd, history=DEFAULT_HISTORY,
                margin=DEFAULT_MARGIN, pow2=False, block_size=32,
                scale_rounding='up', out='float32', grad='scaled'):
    """A validated :class:`GemmRecipe`.

    Raises:
        ValueError: naming what is accepted.
    """
    if kind not in RECIPES:
        raise ValueError('recipe must be one of {}, got {!r}'.format(
            ', '.join(RECIPES), kind))
    history = _integer('history', history, 1, MAX_HISTORY)
    margin = _integer('margin', margin, *MARGIN_RANGE)
    block_size = _integer('block', block_size, 1, None)
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError('scale must be one of {}, got {!r}'.format(
            ', '.join(SCALE_ROUNDINGS), scale_rounding))
    if grad not in GRAD_SCALES:
        raise ValueError('grad must be one of {}, got {!r}'.format(
            ', '.join(GRAD_SCALES), grad))
    out = get_format(out)
    if out.canonical_name not in OUTPUT_FORMATS:
        raise ValueError('out must be one of {}, got {!r}'.format(
            ', '.join(OUTPUT_FORMATS), str(out)))
    return GemmRecipe(kind, get_format(fwd), get_format(bwd), history,
                      margin, bool(pow2), block_size, scale_rounding, out,
                      grad)


def _integer(name, value, low, high):
    """``value`` as an int in [low, high] (``high`` None: unbounded), else a
    ValueError naming the option and the range."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) \
        and (isinstance(value, int) or value.is_integer()) \
        and value >= low and (high is None or value <= high)
    if not ok:
        raise ValueError('{} must be an integer {}, got {!r}'.format(
            name, '≥ {}'.format(low) if high is None else
            'in {}..{}'.format(low, high), value))
    return int(value)


class GemmScaling(object):
    """The scaling of one GEMM layer's operands under a recipe, with its
    state (the delayed recipe's amax histories, one per role)."""

    def __init__(self, recipe):
        self.recipe = recipe
        self.delayed = None
        if recipe.kind == 'delayed':
            # grad=loss: gy has no recipe scale, hence no history
            self.delayed = collections.OrderedDict(
                (role, DelayedScaling(self.format(role), recipe.history,
                                      recipe.margin, recipe.pow2))
                for role in ROLES
                if not (role == 'gy' and recipe.grad_loss))

    @property
    def per_tensor(self):
        return self.recipe.per_tensor

    @property
    def casts_gy_once(self):
        return self.recipe.casts_gy_once

    def format(self, role):
        """The element format of an operand role."""
        return self.recipe.bwd if role == 'gy' else self.recipe.fwd

    def quantize(self, role, x, axes=None, record=True):
        """Operand ``x`` of role ``role`` cast and dequantized (float32).

        Args:
            role: ``'x'``, ``'w'`` or ``'gy'``.
            x: a float32 NumPy or CuPy array.
            axes: the axes of ``x`` the GEMM reduces over (MX blocks run
                along them, flattened in order); ignored per tensor and for
                gy under ``grad=loss``.
            record: the delayed recipe records x's amax into the role's
                history (False: evaluation, which leaves the state as is).
        """
        r = self.recipe
        if role == 'gy' and r.grad_loss:
            # unscaled: the scale is the loss-scaling mode's; the format's
            # own overflow (NaN / Inf / saturation) so that loss scaling's
            # overflow checks see it as they do in the unscaled precisions
            return r.bwd.quantize(x)
        if r.kind == 'current':
            return quantize_per_tensor(x, self.format(role), pow2=r.pow2)[0]
        if r.kind == 'delayed':
            return self.delayed[role].quantize(x, record)
        return quantize_mx(x, self.format(role), axis=axes,
                           block_size=r.block_size,
                           scale_rounding=r.scale_rounding)

    def serialize(self, serializer):
        """Chainer's serializer protocol: the delayed recipe's amax
        histories and scales (nothing for the other recipes)."""
        if self.delayed is None:
            return
        for role, d in self.delayed.items():
            d.serialize(serializer[role])

