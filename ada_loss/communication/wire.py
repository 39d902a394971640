"""APS on the wire: the low-precision sum of one step as real MPI messages
of format codes (Han et al., Algorithm 1 line 8, §4.1–4.2), bit-identical to
the emulation of :mod:`~ada_loss.communication.summation`.

The emulation gathers FP32 payloads and accumulates them in the format in a
stated order; here each rank only ever sends codes
(:mod:`~ada_loss.communication.codes`: 1 byte per value for formats of
5–8 bits, half a byte for ≤ 4 bits) and every addition happens on the rank
where the emulation's order puts it:

``ring`` — reduce-scatter of ``p − 1`` ``Sendrecv`` steps, then all-gather
    (one ``Allgatherv``).
    The elements are cut into p chunks exactly as the emulation's ring
    (chunk j = ``[j·n//p, (j+1)·n//p)``). At step s (0 ≤ s ≤ p − 2) rank r
    sends chunk ``(r − 1 − s) mod p`` to rank r + 1 and receives chunk
    ``(r − 2 − s) mod p`` from rank r − 1, decodes it, adds its own value
    with the emulation's ⊕ (:class:`~.summation.Accumulator`: FP32 add,
    round to the format; Kahan's four rounded operations) and re-encodes
    it. So chunk j starts at rank j + 1 and ends at rank j, which adds the
    last value — the emulation's ring order, unchanged. Then one
    ``Allgatherv`` gathers the finished chunks' codes (copies: no
    arithmetic; MPI picks its algorithm, a ring's bytes are below).

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

The mean is then :meth:`StepReduction.finish` (× 1/p and unshift in one
rounding, non-finite layers → NaN), as in the emulation (``finish_range``:
the same rounding, fused into the decoding pass on the fast path).

Two implementations of the parts, one result:

*fast path* (:class:`_CodePart`; formats of at most 8 bits, unless NaN
    positions must be tracked), the compiled kernels of
    :mod:`~.kernels`, each one pass over memory: this rank's values are
    shifted (``x · 2^shift`` per layer, as ``scale_pow2`` rounds it),
    rounded and encoded in the pass that needs them (the first message;
    a hop), never stored as float32 payloads; a hop adds them to the
    received partial sum by the format's ⊕ table (four table operations
    with Kahan: ``y = Q(x − c); t = Q(s + y); c = Q(Q(t − s) − y)``), in
    place in the received message, which is then sent on as it is; the
    end decodes each chunk with the mean (× 1/p, unshift, NaN layers)
    fused, one lookup per value in a per-layer table of finished values.
    The messages live in buffers kept from call to call.
*value path* (:class:`_ValuePart`): FP32 layers, 16-bit formats, and
    formats without a NaN code when APS is off (their NaN positions are
    tracked at each encoding): decode, ``Accumulator.add``, encode, as
    before.
"""
import numpy

from ada_loss.communication import codes as _codes
from ada_loss.communication import kernels
from ada_loss.communication.codes import codec_for
from ada_loss.communication.summation import Accumulator
from ada_loss.formats import get_format
from ada_loss.formats.quantize import array_module

_F32 = numpy.float32
_U8 = numpy.uint8


def _starts(n, g):
    """Chunk boundaries of the emulation's ring: chunk j = [s[j], s[j+1])."""
    return (numpy.arange(g + 1, dtype=numpy.int64) * n) // g


def _join(pieces):
    """One message from its fields: no copy when they already lie one after
    the other in one buffer (the fields of the message just received)."""
    if len(pieces) == 1:
        return pieces[0]
    base = pieces[0].base if pieces[0].base is not None else pieces[0]
    at = pieces[0].__array_interface__['data'][0]
    for piece in pieces:
        if piece.base is not base or \
                piece.__array_interface__['data'][0] != at:
            return numpy.concatenate(pieces)
        at += piece.nbytes
    start = pieces[0].__array_interface__['data'][0] - \
        base.__array_interface__['data'][0]
    return base[start:start + sum(piece.size for piece in pieces)]


class _CodePart(object):
    """Low-precision layers of a format of at most 8 bits, reduced in its
    codes (module docstring, *fast path*) by the compiled kernels of
    :mod:`~.kernels`: this rank's values are shifted, rounded and encoded
    in the pass that needs them (the first message, or a hop); a hop adds
    them to the received partial sum by the ⊕ table in place (four table
    operations with Kahan's compensation). Or, for the leaders' ring of
    the hierarchical order: the group sum's codes (``codes``, unpacked)."""

    def __init__(self, codec, kahan, n, x=None, segments=(), codes=None):
        self.codec = codec
        self.kahan = kahan
        self.n = n
        self.x = x
        # (start, end, shift) in x, sorted; shift 0: as they are
        segments = [seg for seg in segments if seg[2]]
        self.seg_lo = numpy.array([seg[0] for seg in segments], numpy.int64)
        self.seg_hi = numpy.array([seg[1] for seg in segments], numpy.int64)
        self.seg_scale = numpy.array([2.0 ** int(seg[2])
                                      for seg in segments], numpy.float64)
        self.codes = codes
        self.nan = None
        self.nibble = codec.kind == 'nibble'
        self.tables = codec.tables()

    def own_wire(self, a, b, out=None):
        """Wire bytes of this rank's values [a, b) (into ``out``)."""
        if out is None:
            out = numpy.empty(self.codec.nbytes(b - a), _U8)
        if self.codes is not None:
            out[...] = self.codec.pack(self.codes[a:b])
            return out
        t = self.tables
        kernels.encode(self.x, a, b, self.seg_lo, self.seg_hi,
                       self.seg_scale, t.prm, t.sub_scale, self.nibble,
                       _codes.block_size(), _codes.scratch(0), _codes.work(),
                       out)
        return out

    def hop(self, a, b, s, c):
        """Adds this rank's values [a, b) to the received partial sum
        ``s`` (and compensation ``c``, None at the first step), in place."""
        t = self.tables
        if self.kahan and c is None:
            c = numpy.zeros_like(s)
        if self.codes is not None:
            kernels.combine(s, c if self.kahan else _EMPTY, self.own_wire(
                a, b), t.add, t.sub, self.kahan)
        else:
            kernels.hop(s, c if self.kahan else _EMPTY, self.x, a, b,
                        self.seg_lo, self.seg_hi, self.seg_scale, t.prm,
                        t.sub_scale, t.add, t.sub, self.nibble, self.kahan,
                        _codes.block_size(), _codes.scratch(0),
                        _codes.work(), _codes.scratch(1))
        self.state = (s, c)

    def state_wire(self, with_c):
        s, c = self.state
        return [s, c] if with_c else [s]

    def group_sum(self, messages):
        """The hierarchical leader: this rank's values ⊕ each member's
        (``messages``: wire bytes of all n values, in rank order), as a
        part whose own codes are the group sum."""
        t = self.tables
        s = self.own_wire(0, self.n)
        c = numpy.zeros_like(s) if self.kahan else _EMPTY
        for data in messages:
            kernels.combine(s, c, data, t.add, t.sub, self.kahan)
        codes = s if not self.nibble else _unpack(s, self.n)
        return _CodePart(self.codec, self.kahan, self.n, codes=codes)

    def decode(self, chunk, a, b, out, finish):
        """Elements [a, b) from their wire bytes ``chunk`` into ``out``;
        with ``finish`` (:class:`_Finish`'s ``args``), the mean of each, in the
        same pass."""
        if finish is None:
            finish = (False, 1.0, _EMPTY_I64, _EMPTY_F64, _EMPTY_BOOL)
        else:
            finish = (True,) + finish
        kernels.decode(chunk, a, b, self.tables.values, self.nibble,
                       *finish, out)


_EMPTY = numpy.empty(0, _U8)
_EMPTY_I64 = numpy.empty(0, numpy.int64)
_EMPTY_F64 = numpy.empty(0, numpy.float64)
_EMPTY_BOOL = numpy.empty(0, numpy.bool_)
_WORK = {}


def _work(name, size):
    """A byte buffer of this process kept from call to call (the messages
    of the ring: no fresh pages to fault in at every step), at least
    ``size`` bytes; grows when a larger one is asked for."""
    buf = _WORK.get(name)
    if buf is None or buf.size < size:
        buf = _WORK[name] = numpy.empty(size, _U8)
    return buf[:size]


def _unpack(data, n):
    out = numpy.empty(2 * data.size, _U8)
    numpy.bitwise_and(data, _U8(15), out=out[0::2])
    numpy.right_shift(data, _U8(4), out=out[1::2])
    return out[:n]


class _ValuePart(object):
    """Layers reduced from float32 values as the emulation stores them
    (module docstring, *value path*): FP32 layers (exact sums), the 16-bit
    formats, and formats without a NaN code where NaN positions are
    tracked (no APS). Each hop decodes, adds with the
    :class:`~.summation.Accumulator` and re-encodes."""

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

    def _encode(self, values, start):
        if self.nan is not None:
            self.nan[start:start + values.size] |= numpy.isnan(values)
        return self.codec.encode(values)

    def own_wire(self, a, b, out=None):
        return self._encode(self.values[a:b], a)

    def hop(self, a, b, s, c):
        n = b - a
        s = self.codec.decode(s, n)
        if self.kahan:
            c = numpy.zeros(n, _F32) if c is None else \
                self.codec.decode(c, n)
        acc = Accumulator(s, self.fmt, self.kahan, c, copy=False)
        acc.add(self.values[a:b])
        self.state = (acc.s, acc.c, a)

    def state_wire(self, with_c):
        s, c, a = self.state
        out = [self._encode(s, a)]
        if with_c:
            out.append(self._encode(c, a))
        return out

    def group_sum(self, messages):
        acc = Accumulator(self.values.copy(), self.fmt, self.kahan, None)
        for data in messages:
            acc.add(self.codec.decode(data, self.n))
        total = _ValuePart(acc.s, self.fmt, self.kahan, self.nan is not None)
        total.parent = self
        return total


def _layout(parts, g):
    """Bytes of chunk j of each part (``sizes[j][i]``) for g chunks."""
    starts = [_starts(part.n, g) for part in parts]
    return starts, [[part.codec.nbytes(int(st[j + 1] - st[j]))
                     for part, st in zip(parts, starts)] for j in range(g)]


def _ring(comm, parts):
    """Ring reduce-scatter (``Sendrecv`` steps) and all-gather
    (``Allgatherv``) of every part over ``comm``; returns the gathered
    bytes (chunk-major: chunk j of every part, in part order) and their
    layout (:func:`_layout`)."""
    from mpi4py import MPI
    g, r = comm.Get_size(), comm.Get_rank()
    starts, sizes = _layout(parts, g)

    def bounds(i, j):
        return int(starts[i][j]), int(starts[i][j + 1])

    right, left = (r + 1) % g, (r - 1) % g
    for step in range(g - 1):
        out_j, in_j = (r - 1 - step) % g, (r - 2 - step) % g
        pieces, in_sizes = [], []
        for i, part in enumerate(parts):
            if step == 0:
                a, b = bounds(i, out_j)
                out = _work('own' if i == 0 else 'own%d' % i,
                            part.codec.nbytes(b - a))
                pieces.append(part.own_wire(a, b, out))
            else:
                # c = 0 at the first step: not sent
                pieces += part.state_wire(part.kahan)
            in_sizes.append(sizes[in_j][i])
            if part.kahan and step:
                in_sizes.append(sizes[in_j][i])
        send = _join(pieces)
        # two message buffers in turn: one is sent on while the other fills
        recv = _work('recv%d' % (step % 2), sum(in_sizes))
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
        fields = _split_message(recv, in_sizes)
        at = 0
        for i, part in enumerate(parts):
            s, c = fields[at], None
            at += 1
            if part.kahan and step:
                c = fields[at]
                at += 1
            part.hop(*bounds(i, in_j), s, c)
    # rank r now holds chunk r's sum: gather every rank's chunk
    if g == 1:
        mine = [part.own_wire(*bounds(i, 0)) for i, part in
                enumerate(parts)]
    else:
        mine = [part.state_wire(False)[0] for part in parts]
    counts = [sum(row) for row in sizes]
    displs = numpy.concatenate([[0], numpy.cumsum(counts)]).astype(int)
    total = int(displs[-1])
    gathered = _work('gathered', total)
    if g == 1:
        gathered[...] = _join(mine) if total else gathered
    else:
        comm.Allgatherv(_join(mine), [gathered, counts,
                                      [int(d) for d in displs[:-1]],
                                      MPI.BYTE])
    return gathered, starts, sizes


def _split_message(data, sizes):
    out, at = [], 0
    for size in sizes:
        out.append(data[at:at + size])
        at += size
    return out


class _Finish(object):
    """The mean of the decoded sum of a single part (``StepReduction``'s
    ``finish_range``): ``args`` for the fused decode kernel of the fast
    path (× 1/p, × 2^−shift per layer, NaN for non-finite layers), and
    :meth:`apply` for a value part's decoded chunk."""

    def __init__(self, plan, total, layer_shift, layer_bad):
        self.plan, self.total = plan, total
        self.layer_shift, self.layer_bad = layer_shift, layer_bad
        factor = numpy.ldexp(numpy.ones(layer_shift.size),
                             -layer_shift.astype(numpy.int32))
        if not plan.uses_exponents:
            factor[...] = 1.0
        self.args = (1.0 / plan.n_workers, plan.offsets, factor,
                     numpy.ascontiguousarray(layer_bad, numpy.bool_))

    def apply(self, a, b):
        self.plan.finish_range(self.total, a, b, self.layer_shift,
                               self.layer_bad)


def _decode(parts, data, starts, sizes, outs, finish=None):
    """Each part's values from the gathered chunk-major bytes ``data``;
    with ``finish`` (:class:`_Finish`, one part) the mean of each chunk
    (fused in the decoding pass of the fast path)."""
    at = 0
    for j, row in enumerate(sizes):
        for i, part in enumerate(parts):
            a, b = int(starts[i][j]), int(starts[i][j + 1])
            codec, chunk = part.codec, data[at:at + row[i]]
            at += row[i]
            if isinstance(part, _CodePart):
                part.decode(chunk, a, b, outs[i],
                            None if finish is None else finish.args)
                continue
            codec.decode(chunk, b - a, outs[i][a:b])
            if finish is not None:
                finish.apply(a, b)


def _hierarchical(groups, parts, n_workers, outs, finish=None):
    """Reduce to the group leader in rank order, ring among the leaders,
    broadcast; decodes each part's sum into ``outs``."""
    group, leaders = groups
    k, member = group.Get_size(), group.Get_rank()
    n_leaders = n_workers // k
    if member:
        group.Send(_join([part.own_wire(0, part.n) for part in parts]),
                   dest=0)
        starts, sizes = _layout(parts, n_leaders)
        data = _work('gathered', sum(sum(row) for row in sizes))
    else:
        own = [part.codec.nbytes(part.n) for part in parts]
        messages = [[] for _ in parts]
        for src in range(1, k):
            recv = numpy.empty(sum(own), _U8)
            group.Recv(recv, source=src)
            for i, field in enumerate(_split_message(recv, own)):
                messages[i].append(field)
        sums = [part.group_sum(msgs) for part, msgs in zip(parts, messages)]
        data, starts, sizes = _ring(leaders, sums)
        for part, total in zip(parts, sums):
            if total.nan is not None:
                part.nan |= total.nan
    group.Bcast(data, root=0)
    _decode(parts, data, starts, sizes, outs, finish)


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
            methods: ``Allreduce``, ``Sendrecv``, ``Allgatherv``, ``Send``,
            ``Recv``, ``Bcast``, ``Get_rank``, ``Get_size``).
        plan (StepReduction): for ``comm``'s size.
        buffer (numpy.ndarray): float32, ``plan.size`` elements.
        groups: ``split_groups(comm, k)`` for the hierarchical order.

    Returns:
        ``(mean, agreed)``: the float32 mean (the same on every rank, bit
        for bit the emulation's; a new array) and the agreed exponent
        codes.

    The work arrays and message buffers are the process's, kept between
    calls: one call at a time per process (as ChainerMN makes them).

    A CuPy ``buffer`` is copied to the host, reduced there and the mean
    copied back (a CuPy array; ``agreed`` stays a NumPy array): the
    messages are host bytes (mpi4py without a CUDA-aware MPI), so the
    codes are made where they are sent; the result is the host's, bit
    for bit.
    """
    from mpi4py import MPI
    xp = array_module(buffer)
    if xp is not numpy:
        mean, agreed = wire_mean(comm, plan, xp.asnumpy(buffer), groups)
        return xp.asarray(mean), agreed
    p = comm.Get_size()
    if p != plan.n_workers:
        raise ValueError('the plan is for {} workers, the communicator has '
                         '{} ranks'.format(plan.n_workers, p))
    buffer = numpy.ascontiguousarray(buffer, _F32)
    local = plan.local_max_exps(buffer)
    agreed = numpy.empty_like(local)
    if plan.uses_exponents:
        comm.Allreduce(local, agreed, op=MPI.MAX)
    pol = plan.policy
    if p == 1 or not plan.size:
        shift, bad = plan.shifts(agreed)
        return plan.finish(plan.encode(buffer, shift), shift, bad), agreed
    layer_shift, layer_bad = plan.layer_shifts(agreed)
    parts, masks = [], []
    lp_layers = plan.lp_layers
    lp = plan.lp_elements if not (lp_layers.all() or not lp_layers.any()) \
        else None
    if lp_layers.any():
        codec = codec_for(pol.format)
        track = not plan.uses_exponents
        mask = lp if lp is not None else slice(None)
        if codec.fast and not (track and not codec.has_nan):
            x = buffer if lp is None else buffer[lp]
            segments, at = [], 0
            for i in numpy.flatnonzero(lp_layers):
                size = plan.sizes[i]
                if plan.uses_exponents and layer_shift[i]:
                    segments.append((at, at + size, int(layer_shift[i])))
                at += size
            parts.append(_CodePart(codec, pol.kahan, x.size, x, segments))
        else:
            shift, _ = plan.shifts(agreed)
            payload = plan.encode(buffer, shift)
            parts.append(_ValuePart(payload[mask], pol.format, pol.kahan,
                                    track))
        masks.append(mask)
    if not lp_layers.all():
        mask = ~lp if lp is not None else slice(None)
        parts.append(_ValuePart(buffer[mask], get_format('float32'), False,
                                False))
        masks.append(mask)
    total = numpy.empty(plan.size, _F32)
    outs = [total if len(parts) == 1 else numpy.empty(part.n, _F32)
            for part in parts]
    tracked = [(part, mask) for part, mask in zip(parts, masks)
               if part.nan is not None]
    finish = None
    if len(parts) == 1 and not tracked:
        # the mean of each chunk in its decoding pass
        finish = _Finish(plan, total, layer_shift, layer_bad)
    if pol.order == 'ring':
        data, starts, sizes = _ring(comm, parts)
        _decode(parts, data, starts, sizes, outs, finish)
    else:
        if groups is None:
            raise ValueError("order='hierarchical' needs groups="
                             "split_groups(comm, group_size)")
        _hierarchical(groups, parts, p, outs, finish)
    if len(parts) > 1:
        for mask, values in zip(masks, outs):
            total[mask] = values
    if tracked:
        _send_nan_positions(comm, total, tracked)
    if finish is None:
        plan.finish_layers(total, layer_shift, layer_bad)
    return total, agreed


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
        where = numpy.flatnonzero(agreed)
        if not isinstance(mask, slice):
            where = numpy.flatnonzero(mask)[where]
        total[where] = numpy.nan
