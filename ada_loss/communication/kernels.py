"""The compiled kernels of the APS codec and ring (Numba): each one pass
over memory, on the tables :mod:`~ada_loss.communication.codes` builds
from ``quantize`` (the NumPy emulation stays the definition and the tests'
oracle; these kernels are the only code path that computes with the
tables).

* :func:`encode` — round + encode with APS's per-layer shift: for each
  element, ``y = x · 2^e`` (the product exact in float64, rounded once to
  float32: bit for bit ``scale_pow2``), its table key (the top 16 bits of
  ``y`` rounded to odd at bit 16, see ``codes``) and one lookup in the
  format's rounding table; nibble formats packed two per byte.
* :func:`hop` — one ring hop fused: this rank's own codes (as
  :func:`encode`) added to the received partial sum by the ⊕ table, in
  place; with Kahan the four table operations of the emulation's
  ``Accumulator`` (``y = Q(x − c); t = Q(s + y); c = Q(Q(t − s) − y)``).
* :func:`combine` — the same ⊕ (and Kahan) of two messages of codes (the
  hierarchical leader's group sum) and :func:`pair_op` (one table, the
  ``add_codes`` / ``sub_codes`` of ``codes``).
* :func:`decode` — codes → float32, fused with the mean's ``× 1/p`` and
  APS's unshift per layer and the NaN of layers reported non-finite.
* :func:`segment_tops` — ``max |x|`` per layer (the exponents' max/min),
  NaN-propagating as ``numpy.maximum.reduceat`` is.

Every kernel takes plain arrays and integers, so each compiles to one
specialisation; they are compiled at first use and cached
(``cache=True``): next to this file when its folder is writable, else in
Numba's user-wide cache folder (``NUMBA_CACHE_DIR`` when set, otherwise
``~/.cache/numba``-style, Numba's own fallback).

Loops work block by block (``block`` elements, :data:`codes.BLOCK`):
each block's own codes are computed into a small scratch array that stays
in cache and consumed at once, so memory is read and written once.
"""
import numba
import numpy

_JIT = dict(nopython=True, nogil=True, cache=True)


@numba.njit(**_JIT)
def _codes_of(x, lo, hi, seg_lo, seg_hi, seg_scale, table, out):
    """Unpacked codes of ``x[lo:hi]`` into ``out[0:hi − lo]``: elements in
    a segment ``[seg_lo[k], seg_hi[k])`` are multiplied by ``seg_scale[k]``
    first (exact in float64, rounded once to float32), the rest as they
    are. The segments are sorted and disjoint."""
    k = numpy.searchsorted(seg_hi, lo, 'right')
    at = lo
    while at < hi:
        if k < seg_lo.size and seg_lo[k] < hi:
            a = max(seg_lo[k], lo)
            b = min(seg_hi[k], hi)
            scale = seg_scale[k]
        else:
            a = b = hi
            scale = 1.0
        for i in range(at, a):
            bits = numpy.int64(numpy.float32(x[i]).view(numpy.uint32))
            out[i - lo] = table[(((bits & 0xFFFF) + 0xFFFF) | bits) >> 16]
        for i in range(a, b):
            y = numpy.float32(numpy.float64(x[i]) * scale)
            bits = numpy.int64(y.view(numpy.uint32))
            out[i - lo] = table[(((bits & 0xFFFF) + 0xFFFF) | bits) >> 16]
        at = max(b, at)
        k += 1


@numba.njit(**_JIT)
def _pack_into(codes, n, out, o):
    """Two unpacked codes per byte (first in the low nibble), ``n`` codes
    into ``out[o:]``; an odd count ends in a zero high nibble."""
    m = n // 2
    for j in range(m):
        out[o + j] = codes[2 * j] | (codes[2 * j + 1] << 4)
    if n % 2:
        out[o + m] = codes[n - 1]


@numba.njit(**_JIT)
def encode(x, lo, hi, seg_lo, seg_hi, seg_scale, table, nibble, block,
           scratch, out):
    """Wire bytes of ``x[lo:hi]`` into ``out`` (see :func:`_codes_of`;
    packed when ``nibble``)."""
    for a in range(lo, hi, block):
        b = min(a + block, hi)
        if nibble:
            _codes_of(x, a, b, seg_lo, seg_hi, seg_scale, table, scratch)
            _pack_into(scratch, b - a, out, (a - lo) // 2)
        else:
            _codes_of(x, a, b, seg_lo, seg_hi, seg_scale, table,
                      out[a - lo:])


@numba.njit(**_JIT)
def _combine_bytes(s, c, o, own, n, add, sub, kahan):
    """``s[o:o+n] ⊕= own[0:n]`` in place (bytes; Kahan with ``c``)."""
    if not kahan:
        for j in range(n):
            s[o + j] = add[(numpy.int64(s[o + j]) << 8) | own[j]]
        return
    for j in range(n):
        sj = numpy.int64(s[o + j])
        y = numpy.int64(sub[(numpy.int64(own[j]) << 8) | c[o + j]])
        t = numpy.int64(add[(sj << 8) | y])
        d = numpy.int64(sub[(t << 8) | sj])
        c[o + j] = sub[(d << 8) | y]
        s[o + j] = t


@numba.njit(**_JIT)
def hop(s, c, x, lo, hi, seg_lo, seg_hi, seg_scale, table, add, sub,
        nibble, kahan, block, scratch, packed):
    """One ring hop: the partial sum ``s`` (wire bytes of elements
    ``[lo, hi)``; ``c`` its Kahan compensation) ⊕= this rank's own values
    ``x[lo:hi]`` rounded and encoded as :func:`encode` does, in place."""
    for a in range(lo, hi, block):
        b = min(a + block, hi)
        _codes_of(x, a, b, seg_lo, seg_hi, seg_scale, table, scratch)
        if nibble:
            _pack_into(scratch, b - a, packed, 0)
            _combine_bytes(s, c, (a - lo) // 2, packed, (b - a + 1) // 2,
                           add, sub, kahan)
        else:
            _combine_bytes(s, c, a - lo, scratch, b - a, add, sub, kahan)


@numba.njit(**_JIT)
def combine(s, c, x, add, sub, kahan):
    """``s ⊕= x`` on two messages of wire bytes, in place (Kahan with
    ``c``)."""
    _combine_bytes(s, c, 0, x, s.size, add, sub, kahan)


@numba.njit(**_JIT)
def pair_op(a, b, table, out):
    """``out = table[(a << 8) | b]`` per byte (one ⊕ or ⊖)."""
    for j in range(a.size):
        out[j] = table[(numpy.int64(a[j]) << 8) | b[j]]


@numba.njit(**_JIT)
def decode(data, lo, hi, values, nibble, finish, inv_p, offsets, factor,
           bad, out):
    """float32 values of elements ``[lo, hi)`` from their wire bytes
    ``data`` (``values``: the float32 of each code) into ``out[lo:hi]``.
    With ``finish``: the mean of each element as
    ``StepReduction.finish_range`` computes it — ``× inv_p`` (float32),
    then ``× factor[l]`` (2^−shift of its layer ``l``, layers
    ``[offsets[l], offsets[l+1])``; exact in float64, rounded once), NaN
    where ``bad[l]``."""
    layer = numpy.searchsorted(offsets, lo, 'right') - 1 if finish else 0
    at = lo
    while at < hi:
        if finish:
            while offsets[layer + 1] <= at:
                layer += 1
            end = min(hi, offsets[layer + 1])
        else:
            end = hi
        for i in range(at, end):
            j = i - lo
            if nibble:
                code = (data[j >> 1] >> (4 * (j & 1))) & 15
            else:
                code = data[j]
            v = values[code]
            if finish:
                v = v * numpy.float32(inv_p)
                if bad[layer]:
                    v = numpy.float32(numpy.nan)
                elif factor[layer] != 1.0:
                    v = numpy.float32(numpy.float64(v) * factor[layer])
            out[i] = v
        at = end


@numba.njit(**_JIT)
def segment_tops(x, starts, ends, tops):
    """``tops[k] = max |x[starts[k]:ends[k]]|`` (float64; 0 when empty,
    NaN when the segment holds a NaN, inf for an Inf)."""
    for k in range(starts.size):
        top = numpy.float32(0.0)
        nan = False
        for i in range(starts[k], ends[k]):
            v = abs(x[i])
            if v > top:
                top = v
            elif v != v:
                nan = True
        tops[k] = numpy.nan if nan else numpy.float64(top)
