"""Low-precision accumulation in a stated order, the CPD way (APS §5.1).

CPD emulates an all-reduce in a customized format by gathering every
worker's low-precision values (stored as FP32) and accumulating them *in the
low precision*: every partial sum is rounded to the format after each
addition (§5.1.1, Fig. 12). Which values meet in which order decides the
round-off (§4.2: "when we use a low precision floating point to add a small
number with a large number, the smaller number may be truncated"), so the
order is part of the algorithm and stated here:

``ring`` (§4.1; Patarasuk & Yuan's ring all-reduce)
    The reduced buffer is cut into ``p`` contiguous chunks (chunk ``j`` is
    ``[j·n//p, (j+1)·n//p)``). Chunk ``j``'s sum starts at worker ``j+1`` and
    travels around the ring, each worker adding its own piece:
    ``s = x[j+1]; s = s ⊕ x[j+2]; ...; s = s ⊕ x[j]`` (indices mod p), so the
    last addition adds worker ``j``'s value to the sum of all the others
    (the large-and-small addition of §4.2). The all-gather phase only copies.
    ``p − 1`` additions per element; 2(p − 1) communication steps.

``hierarchical`` with group size ``k`` (§4.2; ``p % k == 0``)
    Groups of ``k`` consecutive ranks, master = the group's first rank.
    (1) intra-group reduce: the master accumulates its members in rank order,
    ``s = x[gk] ⊕ x[gk+1] ⊕ ... ⊕ x[gk+k−1]``; (2) ring all-reduce (as above)
    of the ``p/k`` group sums among the masters; (3) broadcast (a copy).
    4(k − 1) + 2(p/k − 1) communication steps.

``⊕`` is ``fmt.quantize(a + b)``: the FP32 addition of two values of a
format with M ≤ 10 mantissa bits followed by rounding to the format is the
correctly rounded low-precision sum (double rounding is innocuous when the
intermediate precision has ≥ 2(M+1)+2 bits, Figueroa 1995; FP32 has 24). For
wider mantissas (11 ≤ M ≤ 22) a rare double rounding can occur.

Kahan summation (§5.1.1, Kahan 1965), every operation in the format::

    y = Q(x − c); t = Q(s + y); c = Q(Q(t − s) − y); s = t

The compensation ``c`` travels with the partial sum along the ring (CPD
accumulates gathered values on one node, where it is free; a real ring would
send it too, doubling the payload). In the hierarchical order each master
keeps its stage-(1) compensation: only the sums ``s`` enter stage (2).

Every step is one whole-array NumPy operation (plus one ``quantize``) over
all elements (and all groups): the loops run over workers, never elements.

The same code runs on CuPy arrays (dispatched on the array module) and gives
NumPy's bits: the FP32 additions there are :func:`ada_loss.formats.exact.add`
and ``subtract`` (the GPU's float32 arithmetic flushes subnormal operands and
sums to zero; FP32 layers and formats whose subnormals are float32
subnormals have them), the rounding ``quantize``'s integer kernel.
"""
import numpy

from ada_loss.formats import exact, get_format
from ada_loss.formats.quantize import array_module

ORDERS = ('ring', 'hierarchical')


def check_order(order, group_size, n_workers):
    """Validates a reduction order for ``n_workers``; returns the group size
    to use (``None`` for the ring).

    Raises:
        ValueError: unknown order, a group size with the ring, a missing
            group size, or ``n_workers`` not divisible by it.
    """
    if isinstance(n_workers, bool) or not isinstance(
            n_workers, (int, numpy.integer)) or n_workers < 1:
        raise ValueError('the number of workers must be a positive integer, '
                         'got {!r}'.format(n_workers))
    if order not in ORDERS:
        raise ValueError('unknown reduction order {!r}; expected one of {}'
                         .format(order, ', '.join(ORDERS)))
    if order == 'ring':
        if group_size is not None:
            raise ValueError("group_size={!r} is only meaningful with order="
                             "'hierarchical'".format(group_size))
        return None
    if group_size is None:
        raise ValueError("order='hierarchical' needs group_size (k, with "
                         "the number of workers divisible by k)")
    if isinstance(group_size, bool) or not isinstance(
            group_size, (int, numpy.integer)) or group_size < 1:
        raise ValueError('group_size must be a positive integer, got '
                         '{!r}'.format(group_size))
    if n_workers % group_size:
        raise ValueError('{} workers cannot be split into groups of {} '
                         '(hierarchical all-reduce needs the number of '
                         'workers divisible by the group size)'.format(
                             n_workers, group_size))
    return int(group_size)


class Accumulator(object):
    """Running sums ``s`` (any shape) in a format, naive or Kahan: the ⊕ of
    every order, emulated (here) and on the wire
    (:mod:`~ada_loss.communication.wire`, which resumes a partial sum
    received from its neighbour with ``compensation``)."""

    def __init__(self, first, fmt, kahan, compensation=None, copy=True):
        self.fmt = fmt
        self.exact = fmt.is_float32
        self.s = first.copy() if copy else first
        xp = array_module(first)
        # on the device: float32 sums with IEEE subnormals (module
        # docstring); on the host NumPy's own operators, as always
        self._add, self._sub = (
            (numpy.add, numpy.subtract) if xp is numpy else
            (exact.add, exact.subtract))
        if not kahan:
            self.c = None
        elif compensation is None:
            self.c = xp.zeros_like(first)
        else:
            self.c = compensation

    def q(self, x):
        return x if self.exact else self.fmt.quantize(x)

    def add(self, x):
        # Inf − Inf = NaN is the emulated overflow (without APS), not a bug
        with numpy.errstate(invalid='ignore', over='ignore'):
            add, sub = self._add, self._sub
            if self.c is None:
                self.s = self.q(add(self.s, x))
                return
            y = self.q(sub(x, self.c))
            t = self.q(add(self.s, y))
            self.c = self.q(sub(self.q(sub(t, self.s)), y))
            self.s = t


def ring_sum(values, fmt, kahan=False):
    """The sum over workers (axis 0 of ``values``, shape ``(p, n)``) in ring
    order (module docstring), each addition rounded to ``fmt``.

    The chunks are laid out as a ``(p, p, m)`` array (worker, chunk,
    element; m = ⌈n/p⌉, the padding is never read back), so step s of all
    chunks at once is one block gather ``V[(j + s) % p, j]``.

    Returns:
        numpy.ndarray: float32, shape ``(n,)``.
    """
    fmt = get_format(fmt)
    p, n = values.shape
    if p == 1:
        return values[0].copy()
    xp = array_module(values)
    starts = (numpy.arange(p + 1) * n) // p       # chunk j = [starts[j], starts[j+1])
    m = -(-n // p)
    valid = numpy.arange(m)[None, :] < numpy.diff(starts)[:, None]   # (p, m)
    blocks = xp.zeros((p, p, m), numpy.float32)
    chunks = numpy.arange(p)
    if xp is not numpy:
        # the chunks' valid positions, row-major (= the order of the
        # elements), as integers on the device
        where = xp.asarray(numpy.flatnonzero(valid))
        blocks.reshape(p, p * m)[:, where] = values
        chunks = xp.asarray(chunks)
    else:
        blocks[:, valid] = values
    acc = Accumulator(blocks[(chunks + 1) % p, chunks], fmt, kahan)
    for step in range(2, p + 1):
        acc.add(blocks[(chunks + step) % p, chunks])
    if xp is not numpy:
        return acc.s.reshape(p * m)[where]
    return acc.s[valid]


def hierarchical_sum(values, fmt, group_size, kahan=False):
    """The sum over workers of ``values`` ``(p, n)`` in the hierarchical
    order with groups of ``group_size`` (module docstring).

    Returns:
        numpy.ndarray: float32, shape ``(n,)``.
    """
    fmt = get_format(fmt)
    p, n = values.shape
    k = check_order('hierarchical', group_size, p)
    grouped = values.reshape(p // k, k, n)
    acc = Accumulator(grouped[:, 0], fmt, kahan)
    for member in range(1, k):
        acc.add(grouped[:, member])
    return ring_sum(acc.s, fmt, kahan)


def low_precision_sum(values, fmt, order='ring', group_size=None,
                      kahan=False):
    """Sum over axis 0 of ``values`` (``(p, n)`` float32 holding values of
    ``fmt``) accumulated in ``fmt`` in the given order."""
    k = check_order(order, group_size, values.shape[0])
    values = array_module(values).asarray(values, numpy.float32)
    if k is None:
        return ring_sum(values, fmt, kahan)
    return hierarchical_sum(values, fmt, k, kahan)


def ring_steps(p):
    """Communication steps of a ring all-reduce over ``p`` workers (§4.2)."""
    return 2 * (p - 1)


def hierarchical_steps(p, k):
    """Steps of the hierarchical all-reduce with groups of ``k`` (§4.2):
    4(k − 1) + 2(p/k − 1): 90 for p = 256, k = 16 (ring: 510). The paper
    states 74 steps for that case, which its own formula does not give."""
    check_order('hierarchical', k, p)
    return 4 * (k - 1) + 2 * (p // k - 1)
