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
* ``nvfp4`` (``NVFP4BlockScaling``; arXiv 2509.25149): E2M1 elements, E4M3
  scales per 16 values and an FP32 tensor scale
  (:func:`~ada_loss.formats.nvfp4.quantize_nvfp4`): W in 16×16 tiles
  (``tiles='2d'``; ``'1d'``: 1×16 blocks along the reduction), x and gy
  in 1×16 blocks along each GEMM's reduction; gy stochastically rounded
  (``sr``) from a counter-based stream whose step counter is per-layer
  training state (:meth:`GemmScaling.serialize`); the 16-point random
  Hadamard transform (``rht``) on both operands of the weight-gradient
  GEMM (:meth:`GemmScaling.quantize_wgrad`); layers named in
  ``bf16_layers`` stay in BF16 (applied by the training layer).
* ``blockwise`` (``Float8BlockScaling``, DeepSeek-V3): FP32 scales per
  1×128 tile of x and gy along each GEMM's reduction and per 128×128 block
  of W (:func:`~ada_loss.formats.blockwise.quantize_blockwise`); ``pow2``
  as TE's power-of-two scales.

Per-tensor recipes quantize each tensor once per step (the backward reuses
the forward's x and W copies, as TE's transposed FP8 copies hold the same
values); MX, NVFP4 and blockwise quantize per GEMM (a weight's 2-D tiles
give the same values in the forward and the dgrad GEMM, as its transposed
copy does in hardware).

The gradient's scale (``grad``; not in TE): ``'scaled'`` (the default) casts
gy with the recipe's own scale, as above; ``'loss'`` rounds gy *unscaled*
into the backward element format (``FloatFormat.quantize``: overflow gives
NaN, Inf or saturates as that format does), once for both backward GEMMs,
so that its scale is a loss-scaling mode's (fixed, dynamic, adaptive, ...)
while x and W are still cast as the recipe casts them.
"""
import collections

import numpy

from ada_loss.formats.blockwise import quantize_blockwise
from ada_loss.formats.counter_rng import fmix32_int
from ada_loss.formats.float_format import get_format
from ada_loss.formats.hadamard import pad_to_multiple, random_hadamard
from ada_loss.formats.mx import SCALE_ROUNDINGS, quantize_mx
from ada_loss.formats.nvfp4 import quantize_nvfp4
from ada_loss.formats.per_tensor import (
    DEFAULT_HISTORY, DEFAULT_MARGIN, DelayedScaling, quantize_per_tensor)

RECIPES = ('current', 'delayed', 'mx', 'nvfp4', 'blockwise')
#: recipes that cast per GEMM along its reduction (not once per tensor)
BLOCK_RECIPES = ('mx', 'nvfp4', 'blockwise')
#: the weight tiles of the 2-D recipes (NVFP4: 16×16; blockwise: 128×128)
TILINGS = ('2d', '1d')
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
        'scale_rounding', 'out', 'grad', 'rht', 'sr', 'tiles',
        'bf16_layers', 'seed'),
        defaults=('scaled', False, False, '1d', (), 0))):
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
        rht (bool), sr (bool): NVFP4's Hadamard transform of the wgrad
            operands and stochastic rounding of gradients.
        tiles (str): ``'2d'``: W in 2-D tiles (NVFP4 16×16, blockwise
            128×128); ``'1d'``: 1-D blocks along the reduction.
        bf16_layers (tuple of str): paths of GEMM layers kept in BF16.
        seed (int): the seed of stochastic rounding's streams: the run's
            seed (:meth:`seeded`; not part of the precision's name, which
            leaves it 0).
    """

    __slots__ = ()

    @property
    def per_tensor(self):
        return self.kind not in BLOCK_RECIPES

    @property
    def grad_loss(self):
        """True if gy is rounded unscaled (``grad=loss``)."""
        return self.grad == 'loss'

    @property
    def casts_gy_once(self):
        """True if gy is cast once for both backward GEMMs (per tensor,
        or unscaled), False if per GEMM along its reduction (MX, NVFP4,
        blockwise)."""
        return self.per_tensor or self.grad_loss

    def seeded(self, seed):
        """This recipe with stochastic rounding seeded by ``seed`` (an int
        ≥ 0: a run's seed, so that runs of different seeds draw different
        rounding words)."""
        return self._replace(seed=_integer('seed', seed, 0, None))

    def state(self, stream=0):
        """A fresh :class:`GemmScaling` for one GEMM layer; ``stream``
        (the layer's index) selects its stochastic-rounding stream."""
        return GemmScaling(self, stream)


def make_recipe(kind, fwd, bwd, history=DEFAULT_HISTORY,
                margin=DEFAULT_MARGIN, pow2=False, block_size=32,
                scale_rounding='up', out='float32', grad='scaled', rht=False,
                sr=False, tiles='1d', bf16_layers=(), seed=0):
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
    if tiles not in TILINGS:
        raise ValueError('tiles must be one of {}, got {!r}'.format(
            ', '.join(TILINGS), tiles))
    if (rht or sr) and kind != 'nvfp4':
        raise ValueError('rht and sr are options of the nvfp4 recipe')
    return GemmRecipe(kind, get_format(fwd), get_format(bwd), history,
                      margin, bool(pow2), block_size, scale_rounding, out,
                      grad, bool(rht), bool(sr), tiles, tuple(bf16_layers),
                      _integer('seed', seed, 0, None))


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
    state (the delayed recipe's amax histories, one per role; NVFP4's
    stochastic-rounding step counter)."""

    def __init__(self, recipe, stream=0):
        self.recipe = recipe
        self.delayed = None
        #: NVFP4's stochastic rounding: this layer's seed (the recipe's
        #: mixed with the stream) and the count of its stochastic casts,
        #: the step of the next one's counter-based stream
        self.sr_seed = fmix32_int(fmix32_int(recipe.seed) ^ (int(stream)
                                                            + 1))
        self.sr_step = 0
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

    @property
    def rht(self):
        """True when the weight-gradient GEMM takes Hadamard-transformed
        operands (:meth:`quantize_wgrad`)."""
        return self.recipe.rht

    @property
    def has_state(self):
        """True when the scaling carries training state to serialize."""
        return self.delayed is not None or self.recipe.sr

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
        if r.kind == 'mx':
            return quantize_mx(x, self.format(role), axis=axes,
                               block_size=r.block_size,
                               scale_rounding=r.scale_rounding)
        # a weight's 2-D tiles span its first two axes (out × in
        # channels, at each tap of a convolution), whichever one the GEMM
        # reduces: the tile is symmetric under the transpose
        tile = role == 'w' and r.tiles == '2d'
        if r.kind == 'blockwise':
            return quantize_blockwise(
                x, axis=(0, 1) if tile else axes, block_size=r.block_size,
                tile=(r.block_size,) * 2 if tile else None,
                element=self.format(role), pow2=r.pow2)
        return self._nvfp4(role, x, (0, 1) if tile else axes,
                           (r.block_size,) * 2 if tile else None)

    def _nvfp4(self, role, x, axes, tile=None):
        """NVFP4 cast of x; gradients stochastically rounded under
        ``sr`` (each such cast advances the layer's step counter)."""
        if role == 'gy' and self.recipe.sr:
            step = self.sr_step
            self.sr_step += 1
            return quantize_nvfp4(x, axes, self.recipe.block_size, tile,
                                  'stochastic', self.sr_seed, step)
        return quantize_nvfp4(x, axes, self.recipe.block_size, tile)

    def quantize_wgrad(self, gy, x):
        """The operands of the weight-gradient GEMM under NVFP4 with RHT:
        ``gy`` (O, R) and ``x`` (K, R), matrices whose last axis is the
        GEMM's reduction (so every step below runs on contiguous rows),
        zero-padded to a multiple of 16 along it, each run of 16 values
        transformed by :func:`random_hadamard` and cast in 1×16 blocks
        along it (gy stochastically under ``sr``). ``gq @ xq.T`` is then
        the weight gradient (the transform cancels in exact arithmetic;
        zero padding adds nothing)."""
        gy = random_hadamard(pad_to_multiple(gy, -1), -1)
        x = random_hadamard(pad_to_multiple(x, -1), -1)
        return self._nvfp4('gy', gy, -1), self._nvfp4('x', x, -1)

    def serialize(self, serializer):
        """Chainer's serializer protocol: the delayed recipe's amax
        histories and scales; NVFP4's stochastic-rounding step counter
        (nothing for the other recipes)."""
        if self.recipe.sr:
            step = serializer('sr_step', numpy.array(self.sr_step,
                                                     numpy.int64))
            self.sr_step = int(numpy.asarray(step))
        if self.delayed is None:
            return
        for role, d in self.delayed.items():
            d.serialize(serializer[role])

