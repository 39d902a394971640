"""MX block scaling (OCP Microscaling Formats v1.0): blocks of consecutive
values sharing one power-of-two (E8M0) scale, elements in a narrow format.

:func:`quantize_mx` returns the *dequantized* values (element × its block's
scale) in float32, which is what an emulated GEMM consumes: the product of
two such operands accumulated in FP32 equals the MX GEMM's up to the order
of the FP32 sums.

The rules, each where a choice had to be made:

* **Blocks**: ``block_size`` consecutive values along ``axis`` (an int, or a
  tuple of axes flattened in their order: the reduction of a GEMM may span
  several tensor axes); a last block shorter than ``block_size`` (the axis
  is not a multiple of it) is a block of its own, as padding it with zeros
  would give it: zeros do not change a block's amax.
* **Scale** ``2^e`` from the block's amax (the largest |x|):

  - ``scale_rounding='up'`` (Transformer Engine's ``MXFP8BlockScaling``):
    the smallest ``e`` with ``amax ≤ elem_max · 2^e``, i.e.
    ``e = ceil(log2(amax / elem_max))`` computed exactly (on the binary
    exponents, no floating-point log), so no element exceeds ``elem_max``;
  - ``'floor'`` (the OCP MX v1.0 conversion): ``e = floor(log2 amax) −
    emax_elem``;
    the top binade of the block then lies above ``elem_max`` and saturates
    to ± ``elem_max`` (arXiv 2506.08027 reports this diverging in long
    runs; it is here to compare).

  E8M0 encodes ``2^-127 … 2^127`` (and NaN), so ``e`` is clamped to
  ``[-127, 127]`` (OCP MX v1.0: E8M0, bias 127, code 0xFF = NaN). The upper limit is never reached from finite float32
  input (amax < 2^128 and elem_max ≥ 6 give e ≤ 126 for 'up'; 'floor'
  gives e ≤ 127 − emax_elem). At the lower limit, blocks whose amax is
  below ``elem_max · 2^-127`` ('up') keep the scale ``2^-127``: their
  elements are ``x · 2^127``, which fits the element format without
  saturation but with fewer significant bits, down to zero (values below
  ``u_min_elem · 2^-128`` become zeros). A
  block of zeros has amax 0, the scale ``2^-127`` and gives zeros (signs
  kept).
* **Elements**: ``x / 2^e`` (exact), clamped to ``± elem_max`` (the OCP
  conversion clamps to the largest normal; with 'up' nothing reaches it,
  with 'floor' the top binade does — also for E4M3/E5M2, whose own
  overflow would be NaN/Inf), rounded to nearest, ties to even
  (:meth:`FloatFormat.quantize`).
* **NaN and ±Inf**: a block holding any NaN or ±Inf becomes all NaN — the
  E8M0 scale's NaN code (0xFF) makes every value of its block NaN in the
  OCP spec, and a non-finite amax has no finite scale. Other blocks are
  unaffected.

NumPy or CuPy, whichever ``x`` belongs to; needs nothing else.
"""
import numpy

from ada_loss.formats import exact
from ada_loss.formats.float_format import get_format
from ada_loss.formats.quantize import array_module

#: E8M0's exponent range (OCP MX v1.0): 2^-127 … 2^127; code 0xFF is NaN
E8M0_MIN_EXP = -127
E8M0_MAX_EXP = 127
SCALE_ROUNDINGS = ('up', 'floor')
_F32 = numpy.float32


def _check_rounding(scale_rounding):
    if scale_rounding not in SCALE_ROUNDINGS:
        raise ValueError("scale_rounding must be 'up' (TE) or 'floor' (OCP), "
                         'got {!r}'.format(scale_rounding))


def mx_scale_exponents(amax, element, scale_rounding='up'):
    """The E8M0 exponents ``e`` (int32) of blocks with the given amaxes.

    Args:
        amax: a float32 array (NumPy or CuPy) of block amaxes, finite and
            ≥ 0 (a non-finite amax gives an unspecified ``e``; the caller
            makes its block NaN).
        element: the element format (a name of :func:`get_format`).
        scale_rounding: ``'up'`` or ``'floor'`` (module docstring).
    """
    _check_rounding(scale_rounding)
    fmt = get_format(element)
    xp = array_module(amax)
    amax = amax.astype(_F32, copy=False)
    # amax = m · 2^k with m in [0.5, 1): floor(log2 amax) = k − 1, exact
    # for float32 subnormals too.
    m, k = xp.frexp(amax)
    k = k.astype(numpy.int32)
    if scale_rounding == 'floor':
        e = k - 1 - fmt.emax
    else:
        # elem_max = mu · 2^ku: amax ≤ elem_max · 2^e  ⟺
        # m · 2^(k − ku − e) ≤ mu, and as m, mu ∈ [0.5, 1) the smallest
        # such e is k − ku, plus one where m > mu.
        mu, ku = numpy.frexp(fmt.u_max)
        e = k - int(ku) + (m > _F32(mu)).astype(numpy.int32)
    e = xp.where(amax > 0, e, E8M0_MIN_EXP)
    return xp.clip(e, E8M0_MIN_EXP, E8M0_MAX_EXP).astype(numpy.int32)


def _as_axes(axis, ndim):
    axes = (axis,) if numpy.ndim(axis) == 0 else tuple(axis)
    axes = tuple(int(a) % ndim if -ndim <= int(a) < ndim else None
                 for a in axes)
    if None in axes or len(set(axes)) != len(axes) or not axes:
        raise ValueError('bad axis {!r} for an array of {} dimensions'
                         .format(axis, ndim))
    return axes


def _block_view(x, axes, block_size):
    """``(view, axis)``: a reshape of x (no copy) in which axis ``axis``
    holds whole blocks, or None where the blocks need a transpose.

    The flattened reduction is blocked in the order of ``axes``; when the
    axes are increasing, blocks never straddle the leading axes if the
    product P of the trailing run of adjacent axes is a multiple of the
    block size (e.g. N·H·W blocks of an NCHW tensor with H·W = 64): then
    the run reshapes to (P / block, block). A reduction of at most one
    block is one block over all its axes (the view is x itself, reduced
    over ``axes``)."""
    if list(axes) != sorted(axes):
        return None
    shape = x.shape
    n = 1
    for a in axes:
        n *= shape[a]
    if n <= block_size:
        return x, axes
    j = len(axes) - 1
    while j > 0 and axes[j - 1] == axes[j] - 1:
        j -= 1
    s, e = axes[j], axes[-1] + 1
    p = 1
    for a in range(s, e):
        p *= shape[a]
    if p % block_size:
        return None
    view = x.reshape(shape[:s] + (p // block_size, block_size) + shape[e:])
    return view, (s + 1,)


def _quantize_blocks(v, block_axes, fmt, scale_rounding, xp):
    """quantize_mx on a view whose ``block_axes`` hold whole blocks."""
    with numpy.errstate(invalid='ignore'):
        amax = xp.abs(v).max(axis=block_axes, keepdims=True)
    bad = ~xp.isfinite(amax)
    any_bad = bool(bad.any())
    e = mx_scale_exponents(xp.where(bad, _F32(0), amax) if any_bad else amax,
                           fmt, scale_rounding)
    with numpy.errstate(over='ignore', invalid='ignore'):  # NaN/Inf blocks
        scaled = exact.ldexp(v, -e)
        xp.clip(scaled, _F32(-fmt.u_max), _F32(fmt.u_max), out=scaled)
        out = exact.ldexp(fmt.quantize(scaled), e)
    if any_bad:
        out = xp.where(bad, _F32(numpy.nan), out)
    return out


def quantize_mx(x, element, axis=-1, block_size=32, scale_rounding='up',
                return_exponents=False):
    """``x`` quantized to MX blocks and dequantized, as float32.

    Args:
        x: a float32 (or float16, widened exactly) NumPy or CuPy array.
        element: the element format, any name :func:`get_format` accepts
            (``'float8_e4m3fn'``, ``'float8_e5m2'``, ``'float6_e3m2fn'``,
            ``'float6_e2m3fn'``, ``'float4_e2m1fn'``, ``'fp8_e4m3'``...).
        axis: the axis (or a tuple of axes, flattened in that order) along
            which blocks of consecutive values run.
        block_size: values per block (32 in OCP MX).
        scale_rounding: ``'up'`` (TE) or ``'floor'`` (OCP); see the module
            docstring, which states every edge rule.
        return_exponents: also return the block exponents (int32, x's shape
            with the block axes replaced by one axis of blocks, last).

    Returns:
        a float32 array of x's shape: each element × its block's scale
        (NaN in blocks that hold NaN or ±Inf); with ``return_exponents``,
        ``(values, exponents)``.
    """
    _check_rounding(scale_rounding)
    if int(block_size) < 1:
        raise ValueError('block_size must be ≥ 1, got {!r}'.format(
            block_size))
    block_size = int(block_size)
    fmt = get_format(element)
    xp = array_module(x)
    if x.dtype == numpy.float16:
        x = x.astype(_F32)
    if x.dtype != _F32:
        raise TypeError('quantize_mx expects a float32 (or float16) array, '
                        'got {}'.format(x.dtype))
    axes = _as_axes(axis, x.ndim)
    if not return_exponents:
        view = _block_view(x, axes, block_size)
        if view is not None:
            return _quantize_blocks(view[0], view[1], fmt, scale_rounding,
                                    xp).reshape(x.shape)
    rest = tuple(a for a in range(x.ndim) if a not in axes)
    moved = xp.transpose(x, rest + axes)
    lead = moved.shape[:len(rest)]
    n = 1
    for a in axes:
        n *= x.shape[a]
    nblocks = -(-n // block_size)
    flat = moved.reshape(lead + (n,))
    pad = nblocks * block_size - n
    if pad:
        # a partial last block: zeros leave its amax, so its scale, as is
        flat = xp.concatenate(
            [flat, xp.zeros(lead + (pad,), _F32)], axis=-1)
    blocks = flat.reshape(lead + (nblocks, block_size))
    with numpy.errstate(invalid='ignore'):
        amax = xp.abs(blocks).max(axis=-1)      # NaN and Inf propagate
    bad = ~xp.isfinite(amax)
    e = mx_scale_exponents(xp.where(bad, _F32(0), amax), fmt,
                           scale_rounding)
    # x / 2^e and q · 2^e by ldexp: exact (the products are multiples of
    # a power of two ≥ 2^-149 except where a quotient underflows far below
    # the element format's smallest value, which rounds to 0 either way),
    # with no subnormal scale operand (2^-127) that a GPU might flush.
    with numpy.errstate(over='ignore', invalid='ignore'):  # NaN/Inf blocks
        scaled = exact.ldexp(blocks, -e[..., None])
        xp.clip(scaled, _F32(-fmt.u_max), _F32(fmt.u_max), out=scaled)
        q = fmt.quantize(scaled)
        # exact.ldexp: a subnormal product is rounded, not flushed, on CuPy
        out = exact.ldexp(q, e[..., None])
    if bool(bad.any()):
        out[bad] = _F32(numpy.nan)
    out = out.reshape(lead + (nblocks * block_size,))[..., :n]
    out = out.reshape(moved.shape)
    inverse = numpy.argsort(rest + axes)
    out = xp.ascontiguousarray(xp.transpose(out, tuple(int(i) for i in
                                                       inverse)))
    if return_exponents:
        return out, e
    return out
