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

_JIT = dict(nogil=True, cache=True)


@numba.njit(**_JIT)
def _codes_run(x, xu, n, prm, sub_scale, out, o):
    """Codes of ``quantize(x[i])``, i < n, into ``out[o + i]`` (``xu``:
    the same float32 as ``uint32``), by arithmetic on the bits in
    branch-free selects, so that the loop vectorizes: the format's
    normals round the mantissa to M bits (ties to even, the carry moving
    into the exponent); its subnormals round ``|x| · 2^(M − emin)`` to an
    integer (float32's own rounding of ``t + 2^23``, ties to even);
    magnitudes beyond the largest finite code take the format's overflow
    code (Inf, NaN or saturation, as ``quantize``), float32 Inf and NaN
    their codes. ``prm`` (:func:`codes._encoder_parameters`, taken from
    ``quantize`` itself): rounding shift 23 − M, exponent rebias, the
    smallest normal's bits, the sign bit, the largest finite magnitude,
    the overflow, Inf and NaN codes (+, −)."""
    shift, rebias, smallest, sign = prm[0], prm[1], prm[2], prm[3]
    maxfin, ovf_p, ovf_n = prm[4], prm[5], prm[6]
    inf_p, inf_n, nan_p, nan_n = prm[7], prm[8], prm[9], prm[10]
    half = (1 << (shift - 1)) - 1
    s32 = numpy.float32(sub_scale)
    big = numpy.float32(8388608.0)
    # indices from range(n) into slices: provably non-negative, so no
    # wrap-around code and the loop vectorizes
    out = out[o:o + n]
    for i in range(n):
        bits = numpy.int64(xu[i])
        neg = bits >> 31
        a = bits & 0x7FFFFFFF
        normal = ((a + half + ((a >> shift) & 1)) >> shift) - rebias
        # the subnormal branch only below 2^emin (else 0: in range)
        ay = abs(x[i]) if a < smallest else numpy.float32(0.0)
        sub = numpy.int64(numpy.int32((ay * s32 + big) - big))
        mag = normal if a >= smallest else sub
        code = (neg << sign) | mag
        if mag > maxfin:
            code = ovf_n if neg else ovf_p
        if a >= 0x7F800000:
            code = (inf_n if neg else inf_p) if a == 0x7F800000 else \
                (nan_n if neg else nan_p)
        out[i] = code


@numba.njit(**_JIT)
def _codes_of(x, lo, hi, seg_lo, seg_hi, seg_scale, prm, sub_scale, out,
              work):
    """Unpacked codes of ``x[lo:hi]`` into ``out[0:hi − lo]``: elements in
    a segment ``[seg_lo[k], seg_hi[k])`` are multiplied by ``seg_scale[k]``
    first (``scale_pow2``: correctly rounded, so the float32 product by a
    float32 power of two, else the product exact in float64 rounded once),
    the rest by 1 (exact), into the float32 ``work`` block (in cache; a
    separate streaming loop measured faster than keying straight from
    ``x``). The segments are sorted and disjoint; ``hi − lo`` ≤
    ``work.size``."""
    k = numpy.searchsorted(seg_hi, lo, 'right')
    at = lo
    while at < hi:
        if k < seg_lo.size and seg_lo[k] <= at:
            b = min(seg_hi[k], hi)
            scale = seg_scale[k]
            k += 1
        elif k < seg_lo.size and seg_lo[k] < hi:
            b = seg_lo[k]
            scale = 1.0
        else:
            b = hi
            scale = 1.0
        xs = x[at:b]
        ws = work[at - lo:b - lo]
        if 2.0 ** -126 <= scale <= 2.0 ** 127:
            s32 = numpy.float32(scale)
            for i in range(b - at):
                ws[i] = xs[i] * s32
        else:
            for i in range(b - at):
                ws[i] = numpy.float32(numpy.float64(xs[i]) * scale)
        at = b
    m = hi - lo
    _codes_run(work, work.view(numpy.uint32), m, prm, sub_scale, out, 0)


@numba.njit(**_JIT)
def _pack_into(codes, n, out, o):
    """Two unpacked codes per byte (first in the low nibble), ``n`` codes
    into ``out[o:]``; an odd count ends in a zero high nibble."""
    m = n // 2
    dest = out[o:o + (n + 1) // 2]
    for j in range(m):
        dest[j] = codes[2 * j] | (codes[2 * j + 1] << 4)
    if n % 2:
        dest[m] = codes[n - 1]


@numba.njit(**_JIT)
def encode(x, lo, hi, seg_lo, seg_hi, seg_scale, prm, sub_scale, nibble,
           block, scratch, work, out):
    """Wire bytes of ``x[lo:hi]`` into ``out`` (see :func:`_codes_of`;
    packed when ``nibble``)."""
    for a in range(lo, hi, block):
        b = min(a + block, hi)
        if nibble:
            _codes_of(x, a, b, seg_lo, seg_hi, seg_scale, prm, sub_scale,
                      scratch, work)
            _pack_into(scratch, b - a, out, (a - lo) // 2)
        else:
            _codes_of(x, a, b, seg_lo, seg_hi, seg_scale, prm, sub_scale,
                      out[a - lo:], work)


@numba.njit(**_JIT)
def _combine_bytes(s, c, o, own, n, add, sub, kahan):
    """``s[o:o+n] ⊕= own[0:n]`` in place (bytes; Kahan with ``c``)."""
    s = s[o:o + n]
    if not kahan:
        for j in range(n):
            s[j] = add[(numpy.int64(s[j]) << 8) | own[j]]
        return
    c = c[o:o + n]
    for j in range(n):
        sj = numpy.int64(s[j])
        y = numpy.int64(sub[(numpy.int64(own[j]) << 8) | c[j]])
        t = numpy.int64(add[(sj << 8) | y])
        d = numpy.int64(sub[(t << 8) | sj])
        c[j] = sub[(d << 8) | y]
        s[j] = t


@numba.njit(**_JIT)
def hop(s, c, x, lo, hi, seg_lo, seg_hi, seg_scale, prm, sub_scale, add, sub,
        nibble, kahan, block, scratch, work, packed):
    """One ring hop: the partial sum ``s`` (wire bytes of elements
    ``[lo, hi)``; ``c`` its Kahan compensation) ⊕= this rank's own values
    ``x[lo:hi]`` rounded and encoded as :func:`encode` does, in place."""
    for a in range(lo, hi, block):
        b = min(a + block, hi)
        _codes_of(x, a, b, seg_lo, seg_hi, seg_scale, prm, sub_scale,
                      scratch, work)
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
    ``StepReduction.finish_range`` computes it — ``× fl32(inv_p) ×
    factor[l]`` (2^−shift of its layer ``l``, layers
    ``[offsets[l], offsets[l+1])``) exact in float64, rounded once, NaN
    where ``bad[l]`` — as one lookup in a table of the finished value of
    every code, built per layer (the mean depends on the code and the
    layer only)."""
    table = values.copy()
    layer = numpy.searchsorted(offsets, lo, 'right') - 1 if finish else 0
    at = lo
    while at < hi:
        end = hi
        if finish:
            while offsets[layer + 1] <= at:
                layer += 1
            end = min(hi, offsets[layer + 1])
            # × 1/p and × 2^−shift exact in float64, rounded once
            scale = numpy.float64(numpy.float32(inv_p)) * factor[layer]
            for c in range(values.size):
                if bad[layer]:
                    table[c] = numpy.nan
                else:
                    table[c] = numpy.float32(
                        numpy.float64(values[c]) * scale)
        dest = out[at:end]
        if nibble:
            for i in range(end - at):
                j = i + at - lo
                dest[i] = table[(data[j >> 1] >> (4 * (j & 1))) & 15]
        else:
            src = data[at - lo:end - lo]
            for i in range(end - at):
                dest[i] = table[src[i]]
        at = end


@numba.njit(**_JIT)
def segment_tops(x, starts, ends, tops):
    """``tops[k] = max |x[starts[k]:ends[k]]|`` (float64; 0 when empty,
    NaN when the segment holds a NaN, inf for an Inf). On the bits: for
    ``|x|`` the float32 order is the integer order of the patterns, and
    every NaN lies above Inf's — so one integer max, which vectorizes."""
    bits = x.view(numpy.uint32)
    for k in range(starts.size):
        seg = bits[starts[k]:ends[k]]
        top = numpy.uint32(0)
        for i in range(seg.size):
            a = seg[i] & numpy.uint32(0x7FFFFFFF)
            top = a if a > top else top
        if top > numpy.uint32(0x7F800000):
            tops[k] = numpy.nan
        else:
            tops[k] = numpy.float64(numpy.uint32(top).view(numpy.float32))
