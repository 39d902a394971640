"""The precision of training: which format stores what (one setting).

=====================  =======================================================
``float32``            everything FP32, no mixed precision
``mixed16``            Chainer's own mixed16 (Micikevicius et al.): GEMM
                       weights, activations and activation gradients stored in
                       FP16 (NumPy float16), batch norm with FP32 statistics
                       and γ/β, FP32 master weights (``use_fp32_update``)
``bf16``               bfloat16 forward and backward (emulated)
``fp8``                hybrid FP8: E4M3 forward, E5M2 gradients (emulated)
``fp8_e4m3``           E4M3 for both (emulated)
``fp8_e5m2``           E5M2 for both (emulated)
``fwd=<f>,bwd=<g>``    any two names of :func:`ada_loss.formats.get_format`,
                       e.g. ``fwd=float16,bwd=fp8_e4m3`` (emulated)
``fp8:recipe=current`` scaled FP8 (Transformer Engine's recipes): one FP32
``fp8:recipe=delayed`` scale per tensor for x and W (E4M3) and the incoming
                       gradient (E5M2); also on ``fp8_e4m3`` (E4M3
                       gradients) and ``fp8_e5m2``; options ``history=N``,
                       ``margin=M`` (delayed), ``pow2=true|false``
``mxfp8``, ``mxfp6``,  MX block scaling (OCP MX v1.0): E8M0 scales per 32
``mxfp4``              values along each GEMM's reduction; elements E4M3
                       both passes (TE's default) / E2M3 forward and E3M2
                       gradients / E2M1; options ``block=N``,
                       ``scale=up|floor``
``nvfp4``              NVFP4 (arXiv 2509.25149, TE's NVFP4BlockScaling):
                       E2M1 with E4M3 scales per 16 values and an FP32
                       tensor scale; W in 16×16 tiles, x and gradients in
                       1×16 blocks along each GEMM's reduction, a 16-point
                       random Hadamard transform on the wgrad operands,
                       stochastic rounding of gradients; options
                       ``rht=false``, ``sr=false``, ``tiles=1d``,
                       ``bf16=<layer>+<layer>`` (GEMM layers kept in BF16,
                       e.g. ``bf16=conv1+fc``)
``fp8:recipe=``        block-scaled FP8 (TE's Float8BlockScaling,
``blockwise``          DeepSeek-V3): E4M3, FP32 scales per 1×128 tile of x
                       and gradients and per 128×128 block of W; option
                       ``pow2=true`` (TE's default power-of-two scales)
``…,grad=loss``        a per-tensor or MX precision with its incoming gradients
                       rounded *unscaled* into its gradient element format
                       (x and W still cast by the recipe): the gradient's
                       scale is the loss-scaling mode's, which must be
                       named (no default mode)
=====================  =======================================================

Scaled precisions (:mod:`ada_loss.formats.recipe`) keep GEMM outputs
(activations, input and weight gradients) in FP32, or in bfloat16 with the
option ``out=bf16`` (e.g. ``mxfp8:out=bf16``,
``fp8:recipe=delayed,history=16,out=bf16``), as TE does.

*Emulated* precisions store everything in float32 (so the parameters are the
FP32 master weights, and batch norm, the optimizer and the loss are FP32) and
round values to the format where hardware would store them in it: each GEMM's
inputs x, W, b and its output in the forward (the forward format), and the
gradient entering each GEMM in the backward and every gradient it produces
(input, weight and bias gradients) to the backward format. The GEMM itself
accumulates in FP32. Loss scaling then targets the backward format's range.

This module parses a precision into a :class:`Precision` (a name, two
formats, a storage) and gives the Chainer dtype config it builds models in
(:func:`dtype_config`, hence its import of Chainer); it sits below both the
loss-scaling methods (:mod:`ada_loss.scaling` targets the gradient format)
and training (:mod:`ada_loss.training.precision_setup` applies a precision
to a model and its optimizer).
"""
import collections
import contextlib

import chainer
import numpy

from ada_loss.formats import (
    DEFAULT_HISTORY, DEFAULT_MARGIN, canonical_format, get_format,
    make_recipe)

PRECISIONS = ('float32', 'mixed16', 'bf16', 'fp8', 'fp8_e4m3', 'fp8_e5m2')
#: the scaled precisions' base names (their options: module docstring)
SCALED_PRECISIONS = ('fp8:recipe=current', 'fp8:recipe=delayed', 'mxfp8',
                     'mxfp6', 'mxfp4', 'nvfp4', 'fp8:recipe=blockwise')

#: MX precision -> (forward element, gradient element). MXFP8: E4M3 both
#: passes, TE's MXFP8BlockScaling default (the per-block scale gives the
#: range E5M2 would). MXFP6: E2M3 for x and W (precision), E3M2 for
#: gradients (range: a gradient block spans more binades than an
#: activation block), the split of hybrid FP8. MXFP4: E2M1, the only one.
_MX = {
    'mxfp8': ('fp8_e4m3', 'fp8_e4m3'),
    'mxfp6': ('fp6_e2m3', 'fp6_e3m2'),
    'mxfp4': ('fp4_e2m1', 'fp4_e2m1'),
}
_PER_TENSOR_OPTIONS = ('recipe', 'history', 'margin', 'pow2', 'grad', 'out')
_MX_OPTIONS = ('block', 'scale', 'grad', 'out')
_NVFP4_OPTIONS = ('rht', 'sr', 'tiles', 'bf16', 'out')
_BLOCKWISE_OPTIONS = ('recipe', 'pow2', 'out')

_NAMED = {
    'bf16': ('bfloat16', 'bfloat16'),
    'fp8': ('fp8_e4m3', 'fp8_e5m2'),
    'fp8_e4m3': ('fp8_e4m3', 'fp8_e4m3'),
    'fp8_e5m2': ('fp8_e5m2', 'fp8_e5m2'),
}

PRECISION_HELP = ('float32, mixed16, bf16, fp8 (E4M3 forward, E5M2 '
                  'gradients), fp8_e4m3, fp8_e5m2, or fwd=<format>,'
                  'bwd=<format> with format names as in '
                  'ada_loss.formats.get_format (e.g. fwd=float16,'
                  'bwd=fp8_e4m3); or scaled: fp8:recipe=current|delayed '
                  '(also fp8_e4m3:..., options history=N, margin=M, '
                  'pow2=true|false, out=bf16), mxfp8, mxfp6, mxfp4 '
                  '(options block=N, scale=up|floor, out=bf16), nvfp4 '
                  '(options rht=false, sr=false, tiles=1d, '
                  'bf16=<layer>+<layer>, out=bf16), fp8:recipe=blockwise '
                  '(options pow2=true, out=bf16); grad=loss on the '
                  'per-tensor and MX ones: gradients unscaled, scaled by '
                  'the loss-scaling mode')


class Precision(collections.namedtuple(
        'Precision', ('name', 'fwd', 'bwd', 'storage', 'recipe'),
        defaults=(None,))):
    """A parsed precision.

    Attributes:
        name (str): canonical name (``'fp8'``, ``'fwd=float16,bwd=e4m3'``,
            ``'fp8:recipe=delayed,history=16'``): one per precision, so
            ``fwd=float8_e4m3fn,bwd=fp8_e4m3`` is ``fp8_e4m3`` and
            ``fwd=float16,bwd=float8_e5m2`` is ``fwd=float16,bwd=fp8_e5m2``
            (a format by :func:`~ada_loss.formats.canonical_format`'s
            name).
        fwd, bwd (FloatFormat): formats of the forward GEMMs and of the
            gradients (a scaled precision: its element formats).
        storage (str): ``'float32'``, or ``'mixed16'`` for Chainer's mixed16
            (NumPy float16 arrays).
        recipe (GemmRecipe): the scaled recipe, or None.
    """

    __slots__ = ()

    def __str__(self):
        return self.name

    @property
    def emulated(self):
        """True if values are rounded to formats in float32 storage."""
        return self.storage == 'float32' and (self.recipe is not None or not (
            self.fwd.is_float32 and self.bwd.is_float32))

    @property
    def gemm_formats(self):
        """(fwd, bwd) the GEMM links round their inputs and outputs to (None
        for a float32 format), or None when nothing is rounded so. A scaled
        precision: its output format (bfloat16 with ``out=bf16``), or
        None."""
        if not self.emulated:
            return None
        if self.recipe is not None:
            out = self.recipe.out
            return None if out.is_float32 else (out, out)
        return tuple(None if f.is_float32 else f for f in (self.fwd, self.bwd))

    @property
    def default_mode(self):
        """The loss-scaling mode a scaled precision runs with when none is
        given: ``'none'`` (its per-tensor or per-block scales do what loss
        scaling does; TE trains FP8 without a loss scale); None for the
        other precisions, which need a mode named — ``grad=loss`` included:
        its gradients are rounded unscaled, as in ``fp8_e4m3``, and
        underflow without loss scaling, while choosing a method for the
        user would choose among the methods this toolkit compares."""
        if self.recipe is None or self.recipe.grad_loss:
            return None
        return 'none'

    @property
    def grad_format(self):
        """The format scaled gradients are stored in (loss scaling targets
        its range)."""
        return self.bwd

    @property
    def chainer_dtype(self):
        return chainer.mixed16 if self.storage == 'mixed16' else numpy.float32

    @property
    def compute_dtype(self):
        """NumPy dtype of activations: float16 for mixed16, else float32."""
        return numpy.dtype(numpy.float16 if self.storage == 'mixed16'
                           else numpy.float32)


def parse_precision(text):
    """The :class:`Precision` named ``text`` (a Precision is returned as is).

    Raises:
        ValueError: naming what is accepted.
    """
    if isinstance(text, Precision):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError('precision must be a string: {}; got {!r}'.format(
            PRECISION_HELP, text))
    key = text.strip().lower().replace(' ', '')
    f32 = get_format('float32')
    if key == 'float32':
        return Precision('float32', f32, f32, 'float32')
    if key == 'mixed16':
        f16 = get_format('float16')
        return Precision('mixed16', f16, f16, 'mixed16')
    if key in _NAMED:
        fwd, bwd = _NAMED[key]
        return Precision(key, get_format(fwd), get_format(bwd), 'float32')
    base, colon, arg = key.partition(':')
    if base in _MX or base == 'nvfp4' or (colon and base in _NAMED and
                                          base != 'bf16'):
        if base == 'nvfp4':
            # its layer names keep their case (Chainer's link names are
            # case-sensitive): the options as written, not the key
            arg = text.strip().partition(':')[2]
        try:
            return _scaled(base, arg)
        except ValueError as e:
            raise ValueError('bad precision {!r}: {}; expected {}'.format(
                text, e, PRECISION_HELP))
    parts = dict(p.partition('=')[::2] for p in key.split(','))
    if set(parts) == {'fwd', 'bwd'} and all(parts.values()):
        try:
            # one object per format's numbers, so one name: float8_e4m3fn
            # is fp8_e4m3, e5m2 is fp8_e5m2
            fwd, bwd = (canonical_format(parts[k]) for k in ('fwd', 'bwd'))
        except ValueError as e:
            raise ValueError('bad precision {!r}: {}'.format(text, e))
        for name in ('float32',) + tuple(_NAMED):
            # a pair a named precision holds is that precision (same
            # formats, same float32 storage): fwd=bfloat16,bwd=bfloat16 is
            # bf16, and its one name is the short one
            named = parse_precision(name)
            if (named.fwd, named.bwd) == (fwd, bwd):
                return named
        return Precision('fwd={},bwd={}'.format(fwd, bwd), fwd, bwd,
                         'float32')
    raise ValueError('unknown precision {!r}; expected {}'.format(
        text, PRECISION_HELP))


def _options(arg, allowed):
    options = {}
    for item in filter(None, arg.split(',')):
        k, eq, v = item.partition('=')
        if not eq or k not in allowed or k in options:
            raise ValueError('option {!r}: expected key=value with key one '
                             'of {}'.format(item, ', '.join(allowed)))
        options[k] = v
    return options


def _flag(v, key):
    if v not in ('true', 'false'):
        raise ValueError('{} must be true or false, got {!r}'.format(key, v))
    return v == 'true'


def _integer(v, key):
    try:
        return int(v)
    except ValueError:
        raise ValueError('{} must be an integer, got {!r}'.format(key, v))


def _out(options):
    v = options.get('out', 'float32')
    return {'bf16': 'bfloat16', 'fp32': 'float32'}.get(v, v)


def _scaled(base, arg):
    """A scaled precision: ``base`` (fp8, fp8_e4m3, fp8_e5m2 with a recipe
    option; mxfp8/6/4) and its options, validated; the canonical name lists
    the options that differ from the defaults, in a fixed order."""
    if base == 'nvfp4':
        return _nvfp4(arg)
    if base == 'fp8' and 'recipe=blockwise' in arg.split(','):
        return _blockwise(arg)
    if base in _MX:
        o = _options(arg, _MX_OPTIONS)
        fwd, bwd = _MX[base]
        recipe = make_recipe(
            'mx', fwd, bwd, block_size=_integer(o.get('block', '32'),
                                                'block'),
            scale_rounding=o.get('scale', 'up'), out=_out(o),
            grad=o.get('grad', 'scaled'))
        parts = []
        if recipe.block_size != 32:
            parts.append('block={}'.format(recipe.block_size))
        if recipe.scale_rounding != 'up':
            parts.append('scale=' + recipe.scale_rounding)
    else:
        o = _options(arg, _PER_TENSOR_OPTIONS)
        kind = o.get('recipe')
        if kind not in ('current', 'delayed'):
            raise ValueError('recipe=current or recipe=delayed is required, '
                             'got {!r} (recipe=blockwise is '
                             'fp8:recipe=blockwise)'.format(kind))
        if kind == 'current' and ('history' in o or 'margin' in o):
            raise ValueError('history and margin are options of '
                             'recipe=delayed')
        fwd, bwd = _NAMED[base]
        recipe = make_recipe(
            kind, fwd, bwd,
            history=_integer(o.get('history', str(DEFAULT_HISTORY)),
                             'history'),
            margin=_integer(o.get('margin', str(DEFAULT_MARGIN)), 'margin'),
            pow2=_flag(o.get('pow2', 'false'), 'pow2'),
            out=_out(o), grad=o.get('grad', 'scaled'))
        parts = ['recipe=' + kind]
        if recipe.history != DEFAULT_HISTORY:
            parts.append('history={}'.format(recipe.history))
        if recipe.margin != DEFAULT_MARGIN:
            parts.append('margin={}'.format(recipe.margin))
        if recipe.pow2:
            parts.append('pow2=true')
    if recipe.grad_loss:
        parts.append('grad=loss')
    if not recipe.out.is_float32:
        parts.append('out=bf16')
    name = base + (':' + ','.join(parts) if parts else '')
    return Precision(name, recipe.fwd, recipe.bwd, 'float32', recipe)


def _nvfp4(arg):
    """``nvfp4`` and its options (module docstring); the canonical name
    lists the parts switched off, then the BF16 layers, then ``out``."""
    items = []
    for item in arg.split(','):
        k, eq, v = item.partition('=')
        if eq and k.strip().lower() == 'bf16':
            # link names as written, each stripped: 'conv1+fc None' is
            # refused, not the layer 'fcnone'
            names = [n.strip() for n in v.split('+')]
            for n in names:
                if any(c.isspace() for c in n):
                    raise ValueError('bf16 layer {!r}: a layer path has no '
                                     'spaces (e.g. bf16=conv1+fc)'.format(n))
            items.append('bf16=' + '+'.join(names))
        else:
            # other option names and values: case and spaces ignored
            items.append(item.lower().replace(' ', ''))
    o = _options(','.join(items), _NVFP4_OPTIONS)
    # a set of layers: sorted, so that one recipe has one canonical name
    layers = tuple(sorted(set(filter(None, o.get('bf16', '').split('+')))))
    recipe = make_recipe(
        'nvfp4', 'fp4_e2m1', 'fp4_e2m1', block_size=16,
        rht=_flag(o.get('rht', 'true'), 'rht'),
        sr=_flag(o.get('sr', 'true'), 'sr'), tiles=o.get('tiles', '2d'),
        bf16_layers=layers, out=_out(o))
    parts = [k + '=false' for k in ('rht', 'sr')
             if not getattr(recipe, k)]
    if recipe.tiles != '2d':
        parts.append('tiles=' + recipe.tiles)
    if layers:
        parts.append('bf16=' + '+'.join(layers))
    if not recipe.out.is_float32:
        parts.append('out=bf16')
    name = 'nvfp4' + (':' + ','.join(parts) if parts else '')
    return Precision(name, recipe.fwd, recipe.bwd, 'float32', recipe)


def _blockwise(arg):
    """``fp8:recipe=blockwise``: E4M3 in both passes (TE's
    ``Float8BlockScaling`` default format), 1×128 / 128×128 blocks."""
    o = _options(arg, _BLOCKWISE_OPTIONS)
    recipe = make_recipe('blockwise', 'fp8_e4m3', 'fp8_e4m3',
                         block_size=128,
                         pow2=_flag(o.get('pow2', 'false'), 'pow2'),
                         tiles='2d', out=_out(o))
    parts = ['recipe=blockwise']
    if recipe.pow2:
        parts.append('pow2=true')
    if not recipe.out.is_float32:
        parts.append('out=bf16')
    return Precision('fp8:' + ','.join(parts), recipe.fwd, recipe.bwd,
                     'float32', recipe)


def check_precision(precision):
    """Validates a precision name; returns it (as given)."""
    parse_precision(precision)
    return precision


def chainer_dtype(precision):
    return parse_precision(precision).chainer_dtype


@contextlib.contextmanager
def dtype_config(precision):
    """Context in which models are built and run in ``precision``."""
    with chainer.using_config('dtype', chainer_dtype(precision)):
        yield


def compute_dtype(precision):
    """NumPy dtype of activations: float16 for mixed16, else float32."""
    return parse_precision(precision).compute_dtype
