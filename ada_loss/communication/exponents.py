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

The exponents of all layers travel in one message of one signed byte per
layer (§3.3.3: "we only need to communicate 8 bits"), encoded as:

* ``ZERO = −128``: the layer's gradient is all zeros on this worker (no
  constraint; the maximum over workers ignores it);
* ``NONFINITE = 127``: the gradient holds Inf/NaN, or N·|ĝ| ≥ 2^127, which a
  byte cannot encode safely; the reduced layer becomes NaN, so a global
  finiteness check sees it (as the FP32 sum of such values would);
* otherwise ``max_exp`` clipped below at −127 (gradients under 2^−127 / N:
  the shift is then smaller than it could be, which is safe).

``max_exp`` is computed exactly in float64 from ``max |g|`` (monotone, so the
maximum of ``⌈log2 |x|⌉`` is ``⌈log2 max |x|⌉``) with ``frexp``: one
reduction over the gradient, no ``log2`` rounding.
"""
import numpy

ZERO = -128
NONFINITE = 127
_LOW = -127
_HIGH = 126


def ceil_log2(x):
    """``⌈log2 x⌉`` for a float ``x > 0``, exactly (via ``frexp``)."""
    mant, exp = numpy.frexp(numpy.float64(x))   # x = mant · 2^exp, mant in [0.5, 1)
    return int(exp) - 1 if mant == 0.5 else int(exp)


def find_max_exp(grad, world_size=1):
    """Algorithm 1's FINDMAXEXP(grad · world_size), encoded in one byte
    (module docstring): an ``int`` in [−128, 127]."""
    grad = numpy.asarray(grad)
    if grad.size == 0:
        return ZERO
    return code_of_max(numpy.abs(grad).max(), world_size)


def code_of_max(top, world_size):
    """The one-byte code of a layer whose largest magnitude is ``top``."""
    if not numpy.isfinite(top):
        return NONFINITE
    if top == 0:
        return ZERO
    e = ceil_log2(numpy.float64(top) * world_size)
    if e > _HIGH:
        return NONFINITE
    return max(e, _LOW)


def layer_max_exps(buffer, segments, world_size):
    """The one-byte message of a worker: ``find_max_exp`` of each segment
    ``(offset, size)`` of the flat ``buffer``, as an ``int8`` vector."""
    out = numpy.empty(len(segments), numpy.int8)
    for i, (offset, size) in enumerate(segments):
        out[i] = find_max_exp(buffer[offset:offset + size], world_size)
    return out


def stacked_layer_max_exps(buffers, segments, world_size):
    """``layer_max_exps`` of every row of ``buffers`` (``(p, n)``) at once:
    ``int8`` array ``(p, layers)``."""
    out = numpy.empty((buffers.shape[0], len(segments)), numpy.int8)
    for i, (offset, size) in enumerate(segments):
        if size == 0:
            out[:, i] = ZERO
            continue
        tops = numpy.abs(buffers[:, offset:offset + size]).max(axis=1)
        out[:, i] = [code_of_max(t, world_size) for t in tops]
    return out


def upper_exp(fmt):
    """Algorithm 1 line 1: the exponent of the format's largest binade."""
    return int(fmt.emax)


def shift_exponents(global_max_exps, fmt):
    """``factor_exp = upper_exp − max_exp`` per layer from the agreed
    (all-reduced, MAX) codes; 0 for an all-zero or non-finite layer.

    Returns:
        numpy.ndarray: ``int32`` shifts, one per layer.
    """
    codes = numpy.asarray(global_max_exps, numpy.int32)
    shifts = upper_exp(fmt) - codes
    shifts[(codes == ZERO) | (codes == NONFINITE)] = 0
    return shifts
