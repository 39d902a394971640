"""NVFP4: E2M1 elements, one E4M3 scale per 16 values (1×16 blocks, or
16×16 tiles for weights) and one FP32 scale per tensor (NVIDIA,
"Pretraining Large Language Models with NVFP4", arXiv 2509.25149;
Transformer Engine's ``NVFP4BlockScaling``).

:func:`quantize_nvfp4` returns the values NVFP4 represents (dequantized,
float32), computed in FP32 with the arithmetic of TE's reference quantizer
(``transformer_engine/pytorch/custom_recipes/reference_nvfp4.py``,
``_quantize_blockwise_reference``), re-derived here:

* global amax ``A`` of the tensor; global encode scale
  ``S = (448 · 6) / A``, capped at FP32's largest value (so ``A = 0`` gives
  FP32 max), and 1 where the quotient is 0; global decode ``1 / S``;
* per block, its amax ``a`` times ``S · (1/6)`` (TE folds the FP4
  reciprocal into one multiplier), capped at FP32 max, clamped to ±448 and
  rounded to E4M3 (nearest even): the block's decode scale ``s``; its
  encode scale ``min(1 / (s · (1/S)), FP32 max)``;
* elements ``x · encode`` clamped to ±6 and rounded to E2M1, to nearest
  even or stochastically (below);
* the value ``(q · s) · (1/S)``.

Where this module chooses (TE's reference is silent or differs):

* A block holding NaN or ±Inf becomes all NaN (as :func:`quantize_mx`); the
  global amax is taken over the other blocks, so they are cast as if the
  bad block were not there (TE's reference would let an Inf global amax
  reset the global scale to 1).
* Stochastic rounding (the recipe's for gradients) draws its random words
  from :mod:`ada_loss.formats.counter_rng`, keyed by ``(seed, step)`` and
  the element's C-order index in x: reproducible from the seed and the
  step. Hardware uses its own generator (``cvt.rs`` with Philox bits): the
  distribution is the same (round up with probability equal to the
  distance from the lower neighbour, to 2^-22), the draws are not.

NumPy or CuPy. On NumPy arrays the cast runs the compiled kernels of
:mod:`ada_loss.formats.nvfp4_kernels` (two passes instead of about fifteen
array-wide operations), bit for bit the array path, which CuPy runs.
"""
import numpy

from ada_loss.formats import exact, nvfp4_kernels
from ada_loss.formats.blocks import BlockLayout, finish_blocks, finite_blocks
from ada_loss.formats.counter_rng import random_words, stream_key
from ada_loss.formats.float_format import get_format
from ada_loss.formats.quantize import array_module

_F32 = numpy.float32
_F32_MAX = _F32(numpy.finfo(_F32).max)
E2M1_MAX = _F32(6)
E4M3_MAX = _F32(448)
ROUNDINGS = ('nearest', 'stochastic')
#: the kernel's words argument when it hashes its own (or rounds to nearest)
_NO_WORDS = numpy.zeros((0, 0, 0), numpy.uint32)


def global_scales(amax):
    """(encode, decode) global scales (float32) of a tensor amax."""
    amax = _F32(amax)
    with numpy.errstate(divide='ignore', over='ignore'):
        enc = (E4M3_MAX * E2M1_MAX) / amax
    enc = min(enc, _F32_MAX)
    if enc == 0:
        enc = _F32(1)
    return _F32(enc), _F32(1) / _F32(enc)


def quantize_nvfp4(x, axis=-1, block_size=16, tile=None, rounding='nearest',
                   seed=0, step=0, return_scales=False):
    """``x`` quantized to NVFP4 and dequantized, as float32.

    Args:
        x: a float32 (or float16, widened exactly) NumPy or CuPy array.
        axis: the axis (or a tuple of axes, flattened in order) along which
            1-D blocks run; with ``tile``, the pair of axes a tile spans
            (default: the last two).
        block_size: values per 1-D block (16).
        tile: None, or ``(t0, t1)`` (NVFP4's weights: ``(16, 16)``).
        rounding: ``'nearest'`` (ties to even) or ``'stochastic'``.
        seed, step: the counter-based stream of stochastic rounding.
        return_scales: also return the blocks' E4M3 decode scales and the
            global decode scale.

    Returns:
        a float32 array of x's shape (NaN in blocks holding NaN or ±Inf);
        with ``return_scales``, ``(values, block_scales, global_decode)``.
    """
    if rounding not in ROUNDINGS:
        raise ValueError("rounding must be 'nearest' or 'stochastic', got "
                         "{!r}".format(rounding))
    if array_module(x) is numpy and x.size:
        return _quantize_compiled(x, axis, block_size, tile, rounding, seed,
                                  step, return_scales)
    return _quantize_arrays(x, axis, block_size, tile, rounding, seed, step,
                            return_scales)


def block_scales(vmax, enc, dec, xp):
    """The blocks' E4M3 decode scales ``s`` and FP32 encode scales
    ``min(1 / (s · dec), FP32 max)`` from their amaxes ``vmax`` and the
    global encode and decode scales (module docstring)."""
    with numpy.errstate(over='ignore'):
        s = vmax * (enc * (_F32(1) / E2M1_MAX))
    xp.minimum(s, _F32_MAX, out=s)
    xp.clip(s, -E4M3_MAX, E4M3_MAX, out=s)
    s = get_format('float8_e4m3fn').quantize(s)
    with numpy.errstate(divide='ignore', over='ignore'):
        block_enc = _F32(1) / (s * dec)
    xp.minimum(block_enc, _F32_MAX, out=block_enc)
    return s, block_enc


def _quantize_arrays(x, axis, block_size, tile, rounding, seed, step,
                     return_scales):
    """:func:`quantize_nvfp4` in array-wide operations (NumPy or CuPy):
    the definition, which :func:`_quantize_compiled` computes bit for bit
    on NumPy arrays."""
    xp, layout, blocks, vmax, bad = finite_blocks(
        x, axis, block_size, tile, 'quantize_nvfp4')
    # the tensor's amax is its largest block amax (the NaN/Inf blocks
    # left out): no second pass over x
    # (a Python float: exact, and a CuPy 0-d array converts only so)
    enc, dec = global_scales(float(vmax.max()) if vmax.size else 0.0)
    s, block_enc = block_scales(vmax, enc, dec, xp)
    with numpy.errstate(over='ignore', invalid='ignore'):
        y = blocks * block_enc
    xp.clip(y, -E2M1_MAX, E2M1_MAX, out=y)
    e2m1 = get_format('float4_e2m1fn')
    if rounding == 'stochastic':
        words = layout.to_blocks(random_words(x.shape, seed, step, xp), xp)
        q = e2m1_stochastic(y, words)
    else:
        q = e2m1.quantize(y)
    # (q · s) · d, each product rounded as IEEE float32 (subnormals kept on
    # CuPy too: exact.multiply)
    q = exact.multiply(exact.multiply(q, s), dec)
    out = finish_blocks(q, bad, layout, xp)
    if return_scales:
        return out, layout.scales(s), dec
    return out


def _quantize_compiled(x, axis, block_size, tile, rounding, seed, step,
                       return_scales):
    """:func:`quantize_nvfp4` of a non-empty NumPy array by the fused
    kernels of :mod:`ada_loss.formats.nvfp4_kernels` (two passes over the
    blocks; the same float32 operations as :func:`_quantize_arrays`).
    The blocks are viewed as ``(A, B, I)`` (block (a, i) = ``[a, :, i]``):
    a reshape of x itself where the layout needs no copy, and then the
    stochastic words are hashed from the flat index in the kernel (it is
    x's C-order index); otherwise they are computed and laid out as the
    blocks, as :func:`_quantize_arrays` does."""
    if x.dtype == numpy.float16:
        x = x.astype(_F32)
    if x.dtype != _F32:
        raise TypeError('quantize_nvfp4 expects a float32 (or float16) '
                        'array, got {}'.format(x.dtype))
    x = numpy.ascontiguousarray(x)
    layout = BlockLayout(x.shape, axis, block_size, tile)
    blocks = layout.to_blocks(x, numpy)
    shape = blocks.shape
    va = layout.value_axis % len(shape)
    three = (int(numpy.prod(shape[:va])), shape[va],
             int(numpy.prod(shape[va + 1:])))
    b3 = numpy.ascontiguousarray(blocks).reshape(three)
    amax = numpy.empty((three[0], three[2]), _F32)
    bad = numpy.empty((three[0], three[2]), numpy.bool_)
    top = nvfp4_kernels.block_amax(b3.view(numpy.uint32),
                                   amax.view(numpy.uint32), bad)
    enc, dec = global_scales(numpy.uint32(top).view(_F32))
    s, block_enc = block_scales(amax, enc, dec, numpy)
    mode, key, words = 0, 0, _NO_WORDS
    if rounding == 'stochastic':
        if x.size >= 1 << 32:
            raise ValueError('a cast of 2^32 or more values needs a wider '
                             'counter')
        if layout._view is not None:
            mode, key = 1, stream_key(seed, step)
        else:
            mode = 2
            words = numpy.ascontiguousarray(layout.to_blocks(
                random_words(x.shape, seed, step), numpy)).reshape(three)
    out = numpy.empty(three, _F32)
    nvfp4_kernels.cast_blocks(b3, s, block_enc, bad, dec, out, mode, key,
                              words)
    out = layout.from_blocks(out.reshape(shape), numpy)
    if return_scales:
        keep = shape[:va] + (1,) + shape[va + 1:]
        return out, layout.scales(s.reshape(keep)), dec
    return out


def e2m1_stochastic(y, words):
    """``y`` (float32 in [-6, 6]) stochastically rounded to E2M1 with the
    top 22 bits ``n`` of ``words``: up in magnitude iff
    ``n + floor(frac · 2^22) ≥ 2^22``, ``frac`` the distance from the lower
    neighbour in units of the spacing. That is
    :meth:`FloatFormat.quantize`'s rule (``'stochastic'`` with these
    words), computed here in float32 and uint32 arithmetic, every step
    exact (divisions by the spacing are powers of two; ``v/q − floor(v/q)``
    is exact), about 4× faster than its general bit-level path, whose
    E2M1 subnormals (|y| < 1, most of a gradient) go through float64."""
    xp = array_module(y)
    v = xp.abs(y)
    # the spacing: 0.5 below 2, 1 below 4, 2 up to 6
    q = (_F32(0.5) * (_F32(1) + (v >= _F32(2)))) * \
        (_F32(1) + (v >= _F32(4)))
    t = v / q                               # exact: q a power of two
    k = xp.floor(t)
    with numpy.errstate(invalid='ignore'):     # NaN blocks (made NaN later)
        frac22 = xp.floor((t - k) * _F32(1 << 22)).astype(numpy.uint32)
    up = (words >> numpy.uint32(10)) + frac22 >= numpy.uint32(1 << 22)
    out = (k + up.astype(_F32)) * q
    return xp.copysign(out, y)
