"""Block-scaled FP8 (DeepSeek-V3's fine-grained scaling; Transformer
Engine's ``Float8BlockScaling``): one FP32 scale per 1×128 tile of
activations and gradients and per 128×128 block of weights, E4M3
elements.

The arithmetic of TE's reference quantizer
(``tests/pytorch/references/blockwise_quantizer_reference.py`` and
``quantize_scale_calc.py``), re-derived: per block, amax ``a`` (in FP32);
scale ``448 / a`` in FP32, FP32's largest value where that overflows, with
``pow2`` rounded down to a power of two (its exponent bits), 1 where
``a = 0``; elements ``x · scale`` clamped to ±448 and rounded to E4M3
(nearest even); value ``q · (1 / scale)`` in FP32 (TE applies the FP32
``scale_inv`` in the GEMM's accumulation: the same up to FP32 rounding,
exactly with ``pow2``). A block holding NaN or ±Inf becomes all NaN (as
:func:`quantize_mx`), so loss scaling's overflow checks still see it.

TE's recipe defaults to power-of-two scales (unless
``NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1``); here ``pow2=False`` (FP32
scales) is the default, as the issue names it, and ``pow2=True`` is TE's
default. NumPy or CuPy.
"""
import numpy

from ada_loss.formats import exact
from ada_loss.formats.blocks import finish_blocks, finite_blocks
from ada_loss.formats.float_format import get_format
from ada_loss.formats.quantize import array_module

_F32 = numpy.float32
_F32_MAX = _F32(numpy.finfo(_F32).max)
_U32 = numpy.uint32


def block_scales(amax, element='float8_e4m3fn', pow2=False):
    """TE's scale of each block from its amax (float32 array, finite,
    ≥ 0): ``fmt_max / amax``, FP32 max on overflow, pow2: exponent bits
    only; 1 where amax is 0."""
    xp = array_module(amax)
    fmt_max = _F32(get_format(element).u_max)
    with numpy.errstate(divide='ignore', over='ignore'):
        s = exact.divide(fmt_max, amax)     # a subnormal amax is not 0
    s = xp.where(xp.isinf(s), _F32_MAX, s)
    if pow2:
        s = (s.view(_U32) & _U32(0xFF800000)).view(_F32)
    return xp.where(exact.is_zero(amax), _F32(1), s).astype(_F32,
                                                           copy=False)


def quantize_blockwise(x, axis=-1, block_size=128, tile=None,
                       element='float8_e4m3fn', pow2=False,
                       return_scales=False):
    """``x`` cast to blockwise-scaled FP8 and dequantized, as float32.

    Args:
        x: a float32 (or float16) NumPy or CuPy array.
        axis: the axis (or tuple of axes, flattened in order) of 1×128
            tiles; with ``tile``, the two axes of a 2-D block (default the
            last two).
        block_size: values per 1-D tile (128).
        tile: None, or ``(128, 128)`` for weights.
        element: the element format (E4M3; TE also allows E5M2 gradients).
        pow2: power-of-two scales.
        return_scales: also return the block scales.
    """
    xp, layout, blocks, amax, bad = finite_blocks(
        x, axis, block_size, tile, 'quantize_blockwise')
    fmt = get_format(element)
    s = block_scales(amax, fmt, pow2)
    with numpy.errstate(over='ignore', invalid='ignore'):
        y = exact.multiply(blocks, s)
    xp.clip(y, _F32(-fmt.u_max), _F32(fmt.u_max), out=y)
    q = fmt.quantize(y)
    # q · (1/s) as TE computes it; subnormals kept on CuPy too
    q = exact.multiply(q, exact.divide(_F32(1), s))
    out = finish_blocks(q, bad, layout, xp)
    if return_scales:
        return out, layout.scales(s)
    return out
