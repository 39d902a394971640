"""FINDMAXEXP and the power-of-two shift of APS (Algorithm 1, §3.3).

For one layer's gradient ``g`` on a worker, Algorithm 1 (line 3) computes
``max_exp = FINDMAXEXP(g · world_size)``: the largest ``⌈log2 |x|⌉`` over the
non-zero elements (Eq. 4 uses it as the exponent of N·|ĝ|, the bound of Eq. 2
on the sum over N workers). The workers agree on the maximum (line 4:
``AllReduce(max_exp, max)``) and every worker shifts its gradient by
``2^factor_exp`` with ``factor_exp = upper_exp − max_exp`` (lines 1, 4–6).
Then ``|Σ g·2^f| ≤ N·|ĝ|·2^f ≤ 2^upper_exp``: the sum over all workers, and
every partial sum on the way, stays at or below ``2^upper_exp`` and cannot
overflow (a value ≤ 2^emax rounds to at most 2^emax, which is finite).

``upper_exp`` is Algorithm 1's ``2^(exp_bits−1) − 1``, the exponent of the
largest binade, which is the format's ``emax`` for IEEE-style formats; for
OCP E4M3 (emax 8, max 448) ``fmt.emax`` is used, the same bound.

The exponents of all layers travel in one message of **one byte per layer**
(§3.3.3: "we only need to communicate 8 bits"), an unsigned byte so that the
MAX all-reduce of the codes is the MAX of the exponents:

* ``ZERO = 0``: the layer's gradient is all zeros on this worker (no
  constraint: the maximum over the workers ignores it);
* ``NONFINITE = 255``: the gradient holds Inf/NaN; the reduced layer becomes
  NaN, so a global finiteness check sees it (as the FP32 sum would);
* otherwise ``1 + max_exp − low``. For finite FP32 gradients
  ``max_exp ≤ high = 128 + ⌈log2 N⌉``, and ``low = high − 253``: the 254
  codes cover every exponent that can occur except the tiniest; a
  ``max_exp`` below ``low`` (N·|ĝ| < 2^−117 at N = 256) is sent as ``low``,
  which only makes the shift smaller than it could be: safe.

``max_exp`` is computed exactly in float64 from ``max |g|`` (⌈log2⌉ is
monotone, so the maximum of ``⌈log2 |x|⌉`` is ``⌈log2 max |x|⌉``) with
``frexp``: one reduction over the gradient, no ``log2`` rounding.

On CuPy arrays ``max |g|`` per layer is taken on the device from the
float32 bits (an integer max: no flush of subnormals to zero, a NaN's bits
above Inf's) and copied to the host, where the codes are computed as
above: the same bytes as the NumPy path.
"""
import numpy

from ada_loss.communication import kernels
from ada_loss.formats.quantize import array_module

ZERO = 0
NONFINITE = 255
CODE_DTYPE = numpy.uint8


def ceil_log2(x):
    """``⌈log2 x⌉`` for a float ``x > 0``, exactly (via ``frexp``)."""
    mant, exp = numpy.frexp(numpy.float64(x))   # x = mant · 2^exp, 0.5 <= mant < 1
    return int(exp) - 1 if mant == 0.5 else int(exp)


def exponent_range(world_size):
    """``(low, high)``: the exponents one byte encodes for N workers."""
    high = 128 + ceil_log2(max(int(world_size), 1)) if world_size > 1 \
        else 128
    return high - 253, high


def max_exp(top, world_size):
    """FINDMAXEXP for a layer whose largest magnitude is ``top > 0``:
    ``⌈log2(top · N)⌉`` (exact: float64 product of a float32 and an int)."""
    return ceil_log2(numpy.float64(top) * world_size)


def code_of_max(top, world_size):
    """The byte that encodes FINDMAXEXP of a layer with ``max |g| = top``."""
    if not numpy.isfinite(top):
        return NONFINITE
    if top == 0:
        return ZERO
    low, high = exponent_range(world_size)
    return 1 + max(max_exp(top, world_size), low) - low


def decode(codes, world_size):
    """``max_exp`` per code (int32; meaningless for ZERO / NONFINITE)."""
    low, _ = exponent_range(world_size)
    return numpy.asarray(codes, numpy.int32) - 1 + low


def find_max_exp(grad, world_size=1):
    """Algorithm 1's FINDMAXEXP(grad · world_size): ``⌈log2 |x|⌉`` maximized
    over the non-zero elements of ``grad · world_size``; ``None`` for an
    all-zero gradient, ``inf`` if it holds Inf/NaN."""
    grad = numpy.asarray(grad)
    top = numpy.abs(grad).max() if grad.size else 0
    if not numpy.isfinite(top):
        return float('inf')
    if top == 0:
        return None
    return max_exp(top, world_size)


def codes_of_max(tops, world_size):
    """:func:`code_of_max` of every element of ``tops`` (vectorized)."""
    tops = numpy.asarray(tops, numpy.float64)
    low, _ = exponent_range(world_size)
    with numpy.errstate(invalid='ignore', over='ignore'):
        mant, exp = numpy.frexp(tops * world_size)
    e = exp.astype(numpy.int64) - (mant == 0.5)
    codes = 1 + numpy.maximum(e, low) - low
    codes[tops == 0] = ZERO
    codes[~numpy.isfinite(tops)] = NONFINITE
    return codes.astype(CODE_DTYPE)


def _segment_tops(buffers, segments):
    """max |x| of each segment of each row: ``(rows, len(segments))``
    float64 (0 for an empty segment, NaN where it holds a NaN); one
    compiled pass over each row
    (:func:`~ada_loss.communication.kernels.segment_tops`)."""
    if array_module(buffers) is not numpy:
        return _segment_tops_device(buffers, segments)
    buffers = numpy.atleast_2d(numpy.asarray(buffers, numpy.float32))
    tops = numpy.zeros((buffers.shape[0], len(segments)), numpy.float64)
    starts = numpy.array([s for s, _ in segments], numpy.int64)
    ends = starts + numpy.array([n for _, n in segments], numpy.int64)
    for row, out in zip(buffers, tops):
        kernels.segment_tops(numpy.ascontiguousarray(row), starts, ends, out)
    return tops


def _segment_tops_device(buffers, segments):
    """:func:`_segment_tops` of CuPy float32 ``buffers``: max of the
    magnitude bits per segment and row on the device (one reduction per
    segment), returned to the host as float64 (exact)."""
    import cupy
    if buffers.dtype != numpy.float32:
        raise TypeError('FINDMAXEXP on CuPy expects float32, got {}'.format(
            buffers.dtype))
    rows = cupy.ascontiguousarray(cupy.atleast_2d(buffers))
    mags = rows.view(numpy.uint32) & numpy.uint32(0x7fffffff)
    tops = cupy.zeros((rows.shape[0], len(segments)), numpy.uint32)
    for i, (a, n) in enumerate(segments):
        if n:
            tops[:, i] = mags[:, a:a + n].max(axis=1)
    return cupy.asnumpy(tops).view(numpy.float32).astype(numpy.float64)


def layer_max_exps(buffer, segments, world_size):
    """The one-byte message of a worker: the code of each segment
    ``(offset, size)`` of the flat ``buffer`` (``uint8`` vector)."""
    return codes_of_max(_segment_tops(buffer, segments)[0], world_size)


def stacked_layer_max_exps(buffers, segments, world_size):
    """``layer_max_exps`` of every row of ``buffers`` (``(p, n)``) at once:
    ``uint8`` array ``(p, layers)``."""
    return codes_of_max(_segment_tops(buffers, segments), world_size)


def upper_exp(fmt):
    """Algorithm 1 line 1: the exponent of the format's largest binade."""
    return int(fmt.emax)


def shift_exponents(global_codes, fmt, world_size):
    """``factor_exp = upper_exp − max_exp`` per layer from the agreed
    (all-reduced, MAX) codes; 0 for an all-zero or non-finite layer.

    Returns:
        numpy.ndarray: ``int32`` shifts, one per layer.
    """
    codes = numpy.asarray(global_codes)
    shifts = upper_exp(fmt) - decode(codes, world_size)
    shifts[(codes == ZERO) | (codes == NONFINITE)] = 0
    return shifts.astype(numpy.int32)
