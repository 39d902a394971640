"""APS on the wire: the low-precision sum of one step as real MPI messages
of format codes (Han et al., Algorithm 1 line 8, §4.1–4.2), bit-identical to
the emulation of :mod:`~ada_loss.communication.summation`.

The emulation gathers FP32 payloads and accumulates them in the format in a
stated order; here each rank only ever sends codes
(:mod:`~ada_loss.communication.codes`: 1 byte per value for formats of
5–8 bits, half a byte for ≤ 4 bits) and every addition happens on the rank
where the emulation's order puts it:

``ring`` — reduce-scatter of ``p − 1`` ``Sendrecv`` steps, then all-gather.
    The elements are cut into p chunks exactly as the emulation's ring
    (chunk j = ``[j·n//p, (j+1)·n//p)``). At step s (0 ≤ s ≤ p − 2) rank r
    sends chunk ``(r − 1 − s) mod p`` to rank r + 1 and receives chunk
    ``(r − 2 − s) mod p`` from rank r − 1, decodes it, adds its own value
    with the emulation's ⊕ (:class:`~.summation.Accumulator`: FP32 add,
    round to the format; Kahan's four rounded operations) and re-encodes
    it. So chunk j starts at rank j + 1 and ends at rank j, which adds the
    last value — the emulation's ring order, unchanged. Then p − 1
    ``Sendrecv`` steps pass the finished chunks' codes around the ring
    (copies: no arithmetic).

``hierarchical`` (groups of k, ``comm.Split``) — each member ``Send``s its
    codes to its group's leader (the group's first rank), which receives
    and adds them in rank order; the leaders run the ring above on the
    group sums; each leader ``Bcast``s the finished codes to its group.

Layers the policy keeps in FP32 (Table 7, the hybrid FP32-first epochs of
Table 6) travel as float32 in the same messages and are added in FP32 in
the same order, chunked separately as the emulation chunks them.

Bytes per element a rank sends (ring, p ranks, b bytes per code: 1, or ½
packed; exact per chunk, ragged chunks included):

* sum: ``(p − 1)/p · b`` in the reduce-scatter + ``(p − 1)/p · b`` in the
  all-gather = ``2(p − 1)/p · b``: 0.25× FP32's ``2(p − 1)/p · 4`` for an
  8-bit format, 0.125× for a 4-bit one;
* Kahan: the compensation c travels with the partial sum in every
  reduce-scatter step but the first (where c = 0): ``+(p − 2)/p · b``;
* APS: the one-byte-per-layer exponent message (``Allreduce(MAX)``);
* formats with no NaN code (FP6/FP4, ``e<E>m0``) without APS: one more
  one-byte ``Allreduce(MAX)`` says whether a NaN occurred anywhere (an
  overflow Inf − Inf, or NaN gradients); only if one did, a one-byte-per-
  element ``Allreduce(MAX)`` of the NaN positions follows (NaN absorbs
  every later ⊕, so its positions are all the emulation's result needs).

The mean is then :meth:`StepReduction.finish` (× 1/p, unshift, non-finite
layers → NaN), as in the emulation.
"""
import numpy

from ada_loss.communication.codes import codec_for
from ada_loss.communication.summation import Accumulator
from ada_loss.formats import get_format

_F32 = numpy.float32
_U8 = numpy.uint8


def _starts(n, g):
    """Chunk boundaries of the emulation's ring: chunk j = [s[j], s[j+1])."""
    return (numpy.arange(g + 1, dtype=numpy.int64) * n) // g


class _Part(object):
    """One group of elements reduced together: the low-precision layers
    (the format, maybe Kahan) or the FP32 layers (exact sums)."""

    def __init__(self, values, fmt, kahan, track_nan):
        self.values = values
        self.n = values.size
        self.fmt = get_format(fmt)
        self.codec = codec_for(self.fmt)
        self.kahan = kahan
        # a format without a NaN code sends NaN as a number: note where,
        # to send the positions once at the end (module docstring)
        self.nan = numpy.zeros(self.n, bool) \
            if track_nan and not self.codec.has_nan else None

    def encode(self, values, start):
        if self.nan is not None:
            self.nan[start:start + values.size] |= numpy.isnan(values)
        return self.codec.encode(values)

    def accumulator(self, s, c):
        return Accumulator(s, self.fmt, self.kahan, c, copy=False)


def _split_message(data, sizes):
    out, at = [], 0
    for size in sizes:
        out.append(data[at:at + size])
        at += size
    return out


def _ring(comm, parts):
    """Ring reduce-scatter + all-gather of every part's ``values`` over
    ``comm``; returns, per part, the list of the p chunks' codes."""
    g, r = comm.Get_size(), comm.Get_rank()
    starts = [_starts(part.n, g) for part in parts]

    def length(i, j):
        return int(starts[i][j + 1] - starts[i][j])

    def chunk(i, j):
        return slice(int(starts[i][j]), int(starts[i][j + 1]))

    right, left = (r + 1) % g, (r - 1) % g
    sums = [None] * len(parts)     # the partial sums this rank holds
    comps = [None] * len(parts)
    for step in range(g - 1):
        out_j, in_j = (r - 1 - step) % g, (r - 2 - step) % g
        pieces, in_sizes = [], []
        for i, part in enumerate(parts):
            s = part.values[chunk(i, out_j)] if step == 0 else sums[i]
            pieces.append(part.encode(s, int(starts[i][out_j])))
            in_sizes.append(part.codec.nbytes(length(i, in_j)))
            if part.kahan and step:
                # c = 0 at the first step: not sent
                pieces.append(part.encode(comps[i], int(starts[i][out_j])))
                in_sizes.append(in_sizes[-1])
        # one message per step (a copy only when it has several fields)
        send = pieces[0] if len(pieces) == 1 else numpy.concatenate(pieces)
        recv = numpy.empty(sum(in_sizes), _U8)
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
        fields = _split_message(recv, in_sizes)
        at = 0
        for i, part in enumerate(parts):
            n_in = length(i, in_j)
            s = part.codec.decode(fields[at], n_in)
            at += 1
            c = None
            if part.kahan and step:
                c = part.codec.decode(fields[at], n_in)
                at += 1
            elif part.kahan:
                c = numpy.zeros(n_in, _F32)
            acc = part.accumulator(s, c)
            acc.add(part.values[chunk(i, in_j)])
            sums[i], comps[i] = acc.s, acc.c
    # rank r now holds chunk r's sum; all-gather the codes
    codes = []
    for i, part in enumerate(parts):
        mine = part.values[chunk(i, r)] if g == 1 else sums[i]
        codes.append([None] * g)
        codes[i][r] = part.encode(mine, int(starts[i][r]))
    for step in range(g - 1):
        out_j, in_j = (r - step) % g, (r - 1 - step) % g
        send = codes[0][out_j] if len(parts) == 1 else numpy.concatenate(
            [codes[i][out_j] for i in range(len(parts))])
        sizes = [part.codec.nbytes(length(i, in_j))
                 for i, part in enumerate(parts)]
        recv = numpy.empty(sum(sizes), _U8)
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
        for i, data in enumerate(_split_message(recv, sizes)):
            codes[i][in_j] = data
    return codes


def _decode_chunks(part, chunk_codes):
    g = len(chunk_codes)
    starts = _starts(part.n, g)
    out = numpy.empty(part.n, _F32)
    for j in range(g):
        part.codec.decode(chunk_codes[j], int(starts[j + 1] - starts[j]),
                          out[starts[j]:starts[j + 1]])
    return out


def _hierarchical(groups, parts, n_workers):
    """Reduce to the group leader in rank order, ring among the leaders,
    broadcast; returns, per part, its summed values."""
    group, leaders = groups
    k, member = group.Get_size(), group.Get_rank()
    if member:
        group.Send(numpy.concatenate([part.encode(part.values, 0)
                                      for part in parts]), dest=0)
    else:
        accs = [part.accumulator(part.values.copy(), None) for part in parts]
        sizes = [part.codec.nbytes(part.n) for part in parts]
        recv = numpy.empty(sum(sizes), _U8)
        for src in range(1, k):
            group.Recv(recv, source=src)
            for part, acc, data in zip(parts, accs,
                                       _split_message(recv, sizes)):
                acc.add(part.codec.decode(data, part.n))
        sums = [_Part(acc.s, part.fmt, part.kahan, part.nan is not None)
                for part, acc in zip(parts, accs)]
        codes = _ring(leaders, sums)
        for part, total in zip(parts, sums):
            if total.nan is not None:
                part.nan |= total.nan
    n_leaders = n_workers // k
    layout = [[part.codec.nbytes(int(b - a)) for a, b in zip(
        _starts(part.n, n_leaders)[:-1], _starts(part.n, n_leaders)[1:])]
        for part in parts]
    total_bytes = sum(sum(sizes) for sizes in layout)
    if member:
        data = numpy.empty(total_bytes, _U8)
    else:
        data = numpy.concatenate([c for per in codes for c in per]) \
            if total_bytes else numpy.empty(0, _U8)
    group.Bcast(data, root=0)
    out, at = [], 0
    for part, sizes in zip(parts, layout):
        chunk_codes = []
        for size in sizes:
            chunk_codes.append(data[at:at + size])
            at += size
        out.append(_decode_chunks(part, chunk_codes))
    return out



def split_groups(comm, group_size):
    """The communicators of the hierarchical order (``comm.Split``, a
    collective: call once and keep): ``(group, leaders)`` — this rank's
    group of ``group_size`` consecutive ranks, and the communicator of the
    groups' first ranks (``MPI.COMM_NULL`` on the other ranks)."""
    from mpi4py import MPI
    rank = comm.Get_rank()
    group = comm.Split(rank // group_size, rank)
    leaders = comm.Split(0 if rank % group_size == 0 else MPI.UNDEFINED,
                         rank)
    return group, leaders


def wire_mean(comm, plan, buffer, groups=None):
    """The mean over the ranks of ``comm`` of this rank's packed gradients
    ``buffer`` (float32, the plan's layout), reduced as
    :class:`~ada_loss.communication.allreduce.StepReduction` ``plan``
    emulates it, with codes on the wire (module docstring).

    Args:
        comm: an mpi4py communicator (or any object with its buffer
            methods: ``Allreduce``, ``Sendrecv``, ``Send``, ``Recv``,
            ``Bcast``, ``Get_rank``, ``Get_size``).
        plan (StepReduction): for ``comm``'s size.
        buffer (numpy.ndarray): float32, ``plan.size`` elements.
        groups: ``split_groups(comm, k)`` for the hierarchical order.

    Returns:
        ``(mean, agreed)``: the float32 mean (the same on every rank, bit
        for bit the emulation's) and the agreed exponent codes.
    """
    from mpi4py import MPI
    p = comm.Get_size()
    if p != plan.n_workers:
        raise ValueError('the plan is for {} workers, the communicator has '
                         '{} ranks'.format(plan.n_workers, p))
    buffer = numpy.ascontiguousarray(buffer, _F32)
    local = plan.local_max_exps(buffer)
    agreed = numpy.empty_like(local)
    if plan.uses_exponents:
        comm.Allreduce(local, agreed, op=MPI.MAX)
    shift, bad = plan.shifts(agreed)
    payload = plan.encode(buffer, shift)
    pol = plan.policy
    lp = plan.lp_elements
    parts, masks = [], []
    for mask, fmt, kahan in ((lp, pol.format, pol.kahan),
                             (~lp, get_format('float32'), False)):
        if mask.any():
            values = payload if mask.all() else payload[mask]
            parts.append(_Part(values, fmt, kahan,
                               track_nan=not plan.uses_exponents))
            masks.append(mask)
    if p == 1 or not parts:
        sums = [part.values for part in parts]
    elif pol.order == 'ring':
        sums = [_decode_chunks(part, codes)
                for part, codes in zip(parts, _ring(comm, parts))]
    else:
        if groups is None:
            raise ValueError("order='hierarchical' needs groups="
                             "split_groups(comm, group_size)")
        sums = _hierarchical(groups, parts, p)
    total = numpy.empty(plan.size, _F32)
    for mask, values in zip(masks, sums):
        if mask.all():
            total = values
        else:
            total[mask] = values
    tracked = [(part, mask) for part, mask in zip(parts, masks)
               if part.nan is not None]
    if tracked and p > 1:
        _send_nan_positions(comm, total, tracked)
    return plan.finish(total, shift, bad), agreed


def _send_nan_positions(comm, total, tracked):
    """NaN where any rank saw one in a format without a NaN code: one byte
    for all, and the positions only if there are any."""
    from mpi4py import MPI
    mine = numpy.array([any(bool(part.nan.any()) for part, _ in tracked)],
                       _U8)
    anywhere = numpy.empty_like(mine)
    comm.Allreduce(mine, anywhere, op=MPI.MAX)
    if not anywhere[0]:
        return
    for part, mask in tracked:
        flags = part.nan.view(_U8)
        agreed = numpy.empty_like(flags)
        comm.Allreduce(flags, agreed, op=MPI.MAX)
        where = numpy.flatnonzero(mask)[agreed.view(bool)] \
            if not mask.all() else numpy.flatnonzero(agreed)
        total[where] = numpy.nan
