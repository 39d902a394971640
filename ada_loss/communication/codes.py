"""A format's values as integer codes: what APS puts on the wire (Han et al.,
§3.3.3: "we only need to communicate 8 bits" per gradient value).

The emulation stores a format's values in float32. On the wire each value
is its bit pattern in the format — sign, E exponent bits, M mantissa bits —
in ``bits = 1 + E + M`` bits:

* ``bits <= 4`` (``fp4_e2m1``, ``e3m0``, ``e2m1``, ...): two codes per
  byte, the first value in the low nibble (a chunk of odd length ends in
  a zero nibble);
* ``bits <= 8`` (FP8, FP6, every ``e<E>m<M>`` with E + M <= 7): one byte;
* ``bits <= 16`` (``float16``, ``bfloat16``): two bytes;
* otherwise (``float32``, e.g. ``e8m10``): the float32 value itself.

Encoding needs no arithmetic: every finite value of a format with M
mantissa bits is fixed by the top ``9 + M`` bits of its float32 pattern
(sign, the 8 exponent bits, the top M mantissa bits; the format's
subnormals are float32 normals with at most M significant bits), so a table
of ``2^(9+M)`` codes indexed by ``float32_bits >> (23 − M)`` maps value to
code (16 K entries for an 8-bit format). Decoding is a table of ``2^bits``
float32 values (for packed nibbles: one 256-entry table of value *pairs*).
Both tables are built from the format's own definition (sign, biased
exponent, subnormals, the Inf/NaN encodings of its overflow policy) and
tested against ``quantize`` for every code.

NaN: the format's NaN code decodes to the float32 NaN that ``quantize``
returns (quiet, the sign kept). Formats with no NaN code — the OCP FP6/FP4
formats (they saturate) and IEEE-style formats with M = 0, whose all-ones
exponent is only ±Inf — send a NaN as a number (+0, or ±Inf for
``e<E>m0``, whose NaN and Inf share the top bits); :class:`WireCodec` says so
(``has_nan``), and the ring sends NaN positions separately in that case
(:mod:`~ada_loss.communication.wire`).

Only values of the format may be encoded (``quantize``'s outputs): any
other float32 is mapped to an unspecified code.

**The fast path** (formats of at most 8 bits: ``WireCodec.fast``; the ring
of :mod:`~ada_loss.communication.wire` uses it) works on codes only, with
three kinds of tables built once per format from ``quantize`` itself:

*Rounding by table* (:meth:`WireCodec.round_encode`): ``quantize`` then
encode, for *any* float32 ``y``, in one lookup. With M ≤ 5 (every format
of at most 8 bits) the rounding position of every finite value — the
format's normals (round bit 22 − M) and its subnormals (higher) — lies at
or above bit 17 of the float32 pattern. So round the pattern *to odd* at
bit 16 first — the key: its top 16 bits, bit 16 or'ed with "the low 16
bits are not all zero" (four integer passes: ``(low + 0xFFFF)`` carries
into bit 16 exactly when low ≠ 0) — and round-to-nearest-even of the key's
value is that of ``y`` (rounding to odd with two or more extra bits keeps
every tie a tie and every non-tie off it). One table of 2^16 codes,
``code(quantize(key · 2^16))``, then gives every float32's code: Inf, NaN
and float32 subnormals (which all round to ±0, E ≤ 7) are rows of it.

*APS's shift in the table* (:meth:`WireCodec.shift_table`): for a float32
normal ``x`` whose product ``x · 2^e`` is a normal, the product's key is
``x``'s with the exponent field moved by ``e`` — so the table of shift
``e`` (``keyed`` with rows moved by ``e``, ±0 below the normals, the
overflow code above; built once per shift, cached) encodes the shifted
value without multiplying. A product below 2^−126 (float32 rounds it to a
subnormal) rounds to ±0 in every format here, as the table says; a
float32 subnormal ``x`` gives ±0 too unless the shift is so large that
``2^(e − 126)`` reaches half the format's smallest subnormal
(:meth:`WireCodec.folds`): those layers are multiplied first. Tested for
every top half with low halves 0, 1, 0x7FFF, 0x8000, 0xFFFF and a random
one against ``quantize`` (and ``quantize(scale_pow2(·))`` for shifts from
−140 to the largest folded), and against ml_dtypes' casts where it has the
format (equal on every non-NaN pattern; ml_dtypes' cast measured ~5 ns
per value here, this path under 1, so it is a check, not the
implementation).

*The ⊕ by table* (:meth:`WireCodec.add_codes`, ``sub_codes``,
``pair_block``): ``Q(a + b)`` (and ``Q(a − b)``, for Kahan) of two values
of the format is a function of their two codes; a table of 2^16 bytes
indexed by ``(a << 8) | b`` holds the code of the emulation's result (its
``Accumulator``: FP32 operation, ``quantize``) for every pair — for nibble
formats a byte holds two values, and one lookup adds both pairs. Tested on
every pair against the Accumulator.

*Decoding pairs*: a 1-byte code pair (one ``uint16``) → two float32 values
(one ``uint64``), 2^16 entries; nibbles: one byte → two values (256).

All loops run in blocks of :data:`BLOCK` values with preallocated work
arrays, so their intermediate arrays stay in cache.
"""
import sys

import numpy

from ada_loss.communication.cost import format_bits  # NOQA (re-exported)
from ada_loss.formats import get_format

_F32 = numpy.float32
_U32 = numpy.uint32
_QNAN = 0x7FC00000
_LITTLE = sys.byteorder == 'little'
#: values per step of the blocked loops (their work arrays stay in cache;
#: the tests set it small to cross many block boundaries)
BLOCK = 1 << 16
_SCRATCH = []


def _sticky():
    """The process's ``uint32`` work array of :data:`BLOCK` entries."""
    if not _STICKY or _STICKY[0].size != BLOCK:
        _STICKY[:] = [numpy.empty(BLOCK, _U32)]
    return _STICKY[0]


_STICKY = []


def _pairs():
    """The process's ``uint16`` work array of :data:`BLOCK` entries."""
    if not _PAIRS or _PAIRS[0].size != BLOCK:
        _PAIRS[:] = [numpy.empty(BLOCK, numpy.uint16)]
    return _PAIRS[0]


_PAIRS = []


def _scratch():
    """The process's ``intp`` work array of :data:`BLOCK` entries (the
    table indices of one block)."""
    if not _SCRATCH or _SCRATCH[0].size != BLOCK:
        _SCRATCH[:] = [numpy.empty(BLOCK, numpy.intp)]
    return _SCRATCH[0]
KINDS = ('nibble', 'byte', 'half', 'float32')


def _code_values(fmt):
    """The float32 value of every code ``0 .. 2^bits − 1`` (float64 math,
    exact), and whether the format has a NaN code."""
    e, m = fmt.exp_bits, fmt.man_bits
    bias = 2 ** (e - 1) - 1
    n_mag = 2 ** (e + m)
    values = numpy.empty(2 * n_mag, numpy.float64)
    mags = numpy.arange(n_mag)
    exp_field, man_field = mags >> m, mags & ((1 << m) - 1)
    frac = man_field / 2.0 ** m
    mag_values = numpy.where(exp_field == 0,
                             frac * 2.0 ** (1 - bias),
                             (1 + frac) * 2.0 ** (exp_field - bias))
    has_nan = True
    top = exp_field == 2 ** e - 1
    if fmt.overflow == 'inf':
        # IEEE-style: all-ones exponent is Inf (mantissa 0) or NaN
        mag_values[top & (man_field == 0)] = numpy.inf
        mag_values[top & (man_field != 0)] = numpy.nan
        has_nan = m > 0
    elif fmt.overflow == 'nan':
        # OCP E4M3 ("fn"): only the all-ones code is NaN, no Inf
        mag_values[-1] = numpy.nan
    else:
        has_nan = False     # OCP FP6/FP4: every code is a finite value
    values[:n_mag] = mag_values
    values[n_mag:] = -mag_values
    out = values.astype(_F32)
    # NaN as quantize returns it: the quiet NaN with the code's sign
    bits = out.view(_U32)
    nan = numpy.isnan(out)
    bits[nan] = _QNAN | numpy.where(numpy.arange(2 * n_mag)[nan] >= n_mag,
                                    0x80000000, 0).astype(_U32)
    return out, has_nan


class WireCodec(object):
    """Encode a format's values (float32 storage) to wire bytes and back.

    Args:
        fmt: a format name or :class:`~ada_loss.formats.FloatFormat`.

    Attributes:
        kind (str): ``'nibble'``, ``'byte'``, ``'half'`` or ``'float32'``.
        bits (int): bits per value in the format.
        has_nan (bool): the format has a NaN code (else a NaN is sent as a
            number, and the caller must carry NaN positions itself).
    """

    def __init__(self, fmt):
        self.format = get_format(fmt)
        self.bits = format_bits(self.format)
        self._fast = None
        if self.format.is_float32 or self.bits > 16:
            self.kind = 'float32'
            self.has_nan = True
            return
        self.kind = ('nibble' if self.bits <= 4 else
                     'byte' if self.bits <= 8 else 'half')
        code_dtype = numpy.uint8 if self.bits <= 8 else numpy.uint16
        values, self.has_nan = _code_values(self.format)
        self.decode_table = values
        self.shift = 23 - self.format.man_bits
        enc = numpy.zeros(1 << (32 - self.shift), code_dtype)
        finite = numpy.isfinite(values)
        idx = values.view(_U32) >> _U32(self.shift)
        codes = numpy.arange(values.size)
        # the patterns with exponent 255 (Inf, NaN): the format's Inf/NaN
        # code of that sign (+0 where it has none); finite values last
        m = self.format.man_bits
        half = values.size // 2
        for sign in (0, 1):
            own = (codes >= half) == bool(sign)
            nan_codes = codes[numpy.isnan(values) & own]
            inf_codes = codes[numpy.isinf(values) & own]
            nan_code = nan_codes[0] if nan_codes.size else 0
            lo = (sign << (8 + m)) | (0xFF << m)
            enc[lo:lo + (1 << m)] = nan_code
            enc[lo] = inf_codes[0] if inf_codes.size else nan_code
        enc[idx[finite]] = codes[finite]
        self.encode_table = enc
        if self.kind == 'nibble':
            table16 = numpy.zeros(16, _F32)
            table16[:values.size] = values
            byte = numpy.arange(256)
            pairs = numpy.stack([table16[byte & 15], table16[byte >> 4]], 1)
            self.pair_table = pairs.view(numpy.uint64).ravel()

    # -- the fast path of the ring: codes in, codes out -------------------
    @property
    def fast(self):
        """Whether :meth:`round_encode` and the code tables exist: formats
        of at most 8 bits (one code per byte, or two per byte)."""
        return self.kind in ('nibble', 'byte')

    def _tables(self):
        if self._fast is None:
            self._fast = _FastTables(self)
        return self._fast

    def round_encode(self, y, out=None, shift=0):
        """float32 values (any, 1-D) → the codes of ``quantize(y)``, one per
        byte (``uint8``, unpacked: 0..15 for a nibble format), into ``out``
        when given: bit for bit ``encode(quantize(y))`` (module docstring,
        *Rounding by table*), in blocks of :data:`BLOCK` values. With
        ``shift`` (one that :meth:`folds`): of ``quantize(y · 2^shift)``."""
        y = numpy.ascontiguousarray(y, _F32)
        if out is None:
            out = numpy.empty(y.size, numpy.uint8)
        for a in range(0, y.size, BLOCK):
            self.round_block(y[a:a + BLOCK], out[a:a + BLOCK], shift)
        return out

    def round_block(self, y, out, shift=0):
        """:meth:`round_encode` of at most :data:`BLOCK` contiguous values
        (no allocation): the codes of ``quantize(y · 2^shift)`` (the
        product as ``scale_pow2`` rounds it) for a shift that
        :meth:`folds` (``shift=0`` always does)."""
        key = self.key_block(y)
        return self.shift_table(shift).take(key, out=out)

    def key_block(self, y, idx=None):
        """The table key of each float32 of ``y`` (at most :data:`BLOCK`):
        its top 16 bits, the lowest of them or'ed with "the low 16 bits are
        not all zero" — rounding to odd at bit 16 (module docstring), into
        ``idx`` or the process's ``intp`` work array."""
        if idx is None:
            idx = _scratch()
        idx = idx[:y.size]
        bits = y.view(_U32)
        t = _sticky()[:y.size]
        # bit 16 |= (low 16 bits != 0): (low + 0xFFFF) carries into bit 16
        # exactly when low is not zero, and never beyond
        numpy.bitwise_and(bits, _U32(0xFFFF), out=t)
        numpy.add(t, _U32(0xFFFF), out=t)
        numpy.bitwise_or(t, bits, out=t)
        numpy.right_shift(t, _U32(16), out=t)
        numpy.copyto(idx, t)
        return idx

    def folds(self, shift):
        """Whether the shift by ``2^shift`` can be folded into the rounding
        table (:meth:`shift_table`): always, except upward shifts so large
        that a float32 subnormal could come out of the format's zero (then
        the caller multiplies first)."""
        f = self.format
        return shift <= 125 + f.emin - f.man_bits

    def shift_table(self, shift):
        """The rounding table for values to be multiplied by ``2^shift``:
        the key's exponent moves by ``shift`` (exact for float32 normals,
        whose product is a normal; a product below 2^−126 rounds to ±0 in
        every format of ≤ 8 bits, as does a float32 subnormal times a
        shift that :meth:`folds`; Inf and NaN keep their rows). Cached."""
        t = self._tables()
        table = t.shifted.get(shift)
        if table is None:
            table = t.shifted[shift] = t.shift(int(shift))
        return table

    def pack(self, codes, out=None):
        """Unpacked codes (``uint8``) → wire bytes: the same array for
        1-byte codes, two per byte for nibbles (first value in the low
        nibble; an odd count ends in a zero nibble)."""
        if self.kind != 'nibble':
            return codes
        n = codes.size
        m = n // 2
        if out is None:
            out = numpy.empty((n + 1) // 2, numpy.uint8)
        numpy.left_shift(codes[1:2 * m:2], numpy.uint8(4), out=out[:m])
        numpy.bitwise_or(out[:m], codes[0:2 * m:2], out=out[:m])
        if n % 2:
            out[m] = codes[n - 1]
        return out

    def add_codes(self, a, b, out=None):
        """The wire bytes of ``Q(a + b)`` from the wire bytes of ``a`` and
        ``b`` (values of the format; ``Q`` = ``quantize``): the
        :class:`~ada_loss.communication.summation.Accumulator`'s ⊕ as one
        table lookup per byte (two values per byte for nibbles)."""
        return self._pair_op(self._tables().add, a, b, out)

    def sub_codes(self, a, b, out=None):
        """``Q(a − b)`` on wire bytes, as :meth:`add_codes`."""
        return self._pair_op(self._tables().sub, a, b, out)

    def pair_block(self, op, a, b, out):
        """``add_codes`` (``op='add'``) or ``sub_codes`` of at most
        :data:`BLOCK` bytes, into ``out`` (which may be ``a`` or ``b``)."""
        idx = _scratch()[:a.size]
        pair = _pairs()[:a.size]
        numpy.copyto(pair, a)
        numpy.left_shift(pair, numpy.uint16(8), out=pair)
        numpy.bitwise_or(pair, b, out=pair, casting='unsafe')
        numpy.copyto(idx, pair)
        return getattr(self._tables(), op).take(idx, out=out)

    def _pair_op(self, table, a, b, out):
        a = numpy.asarray(a, numpy.uint8)
        b = numpy.asarray(b, numpy.uint8)
        if out is None:
            out = numpy.empty(a.size, numpy.uint8)
        op = 'add' if table is self._tables().add else 'sub'
        for i in range(0, a.size, BLOCK):
            self.pair_block(op, a[i:i + BLOCK], b[i:i + BLOCK],
                            out[i:i + BLOCK])
        return out

    def nbytes(self, n):
        """Bytes on the wire for ``n`` values."""
        if self.kind == 'nibble':
            return (n + 1) // 2
        return n * {'byte': 1, 'half': 2, 'float32': 4}[self.kind]

    def encode(self, values):
        """float32 values of the format (1-D) → ``uint8`` wire bytes."""
        values = numpy.ascontiguousarray(values, _F32)
        if self.kind == 'float32':
            return values.view(numpy.uint8)
        if self.format.name == 'float16':
            return values.astype(numpy.float16).view(numpy.uint8)
        codes = self.encode_table[values.view(_U32) >> _U32(self.shift)]
        if self.kind != 'nibble':
            return codes.view(numpy.uint8)
        if codes.size % 2:
            codes = numpy.append(codes, numpy.uint8(0))
        packed = codes[1::2] << numpy.uint8(4)
        packed |= codes[0::2]
        return packed

    def decode(self, data, n, out=None):
        """Wire bytes of ``n`` values → float32 values (1-D; into ``out``
        when given, else a new array)."""
        data = numpy.asarray(data, numpy.uint8)
        if data.size != self.nbytes(n):
            raise ValueError('{} values of {} take {} bytes, got {}'.format(
                n, self.format.name, self.nbytes(n), data.size))
        if out is None:
            out = numpy.empty(n, _F32)
        if self.kind == 'float32':
            out[...] = data.view(_F32)
        elif self.format.name == 'float16':
            out[...] = data.view(numpy.float16)
        elif self.kind == 'half':
            numpy.take(self.decode_table, data.view(numpy.uint16), out=out)
        elif self.kind == 'byte' and _LITTLE:
            # two codes per lookup: a 2^16-entry table of value pairs
            pairs = n // 2
            table = self._tables().decode_pairs
            words = data[:2 * pairs].view(numpy.uint16)
            dest = out[:2 * pairs].view(numpy.uint64)
            for a in range(0, pairs, BLOCK):
                idx = _scratch()[:words[a:a + BLOCK].size]
                numpy.copyto(idx, words[a:a + BLOCK])
                table.take(idx, out=dest[a:a + BLOCK])
            if n % 2:
                out[n - 1] = self.decode_table[data[n - 1]]
        elif self.kind == 'byte':                       # pragma: no cover
            numpy.take(self.decode_table, data, out=out)
        else:
            # nibbles: two values per byte, one lookup
            pairs = n // 2
            dest = out[:2 * pairs].view(numpy.uint64)
            for a in range(0, pairs, BLOCK):
                idx = _scratch()[:dest[a:a + BLOCK].size]
                numpy.copyto(idx, data[a:a + idx.size])
                self.pair_table.take(idx, out=dest[a:a + BLOCK])
            if n % 2:
                out[n - 1] = self.decode_table[data[pairs] & 15]
        return out


def _shifted(keyed, shift):
    """``keyed`` (sign, exponent, 7 mantissa bits) with each normal
    exponent row e taken from row e + shift: ±0 below row 1, the overflow
    code (the row of ±Inf) from row 255; rows 0 (zero, float32 subnormals:
    ±0) and 255 (Inf, NaN) as they are."""
    base = keyed.reshape(2, 256, 128)
    out = base.copy()
    rows = numpy.arange(1, 255) + shift
    low, high = rows < 1, rows > 254
    mid = ~(low | high)
    for sign in (0, 1):
        out[sign, 1:255][mid] = base[sign, rows[mid]]
        out[sign, 1:255][low] = base[sign, 0, 0]
        out[sign, 1:255][high] = base[sign, 255, 0]
        out[sign, 0] = base[sign, 0, 0]
    return out.ravel()


class _FastTables(object):
    """The tables of a format of at most 8 bits (module docstring):

    * ``keyed``: the code of ``quantize(v)`` for every float32 pattern
      ``v`` by its key (top 16 bits, rounded to odd), and ``shifted``: the
      same for ``v · 2^shift``, one table per shift met;
    * ``add``, ``sub``: ``(a << 8) | b`` → the wire byte of ``Q(a ± b)``
      for wire bytes ``a``, ``b`` (two nibble values per byte);
    * ``decode_pairs`` (1-byte codes): a little-endian pair of codes (one
      ``uint16``) → the pair of float32 values (one ``uint64``).
    """

    def __init__(self, codec):
        fmt = codec.format
        enc, shift = codec.encode_table, _U32(codec.shift)

        def code(q):
            return enc[q.view(_U32) >> shift]

        top = numpy.arange(1 << 16, dtype=_U32) << _U32(16)
        with numpy.errstate(over='ignore', invalid='ignore'):
            self.keyed = code(fmt.quantize(top.view(_F32)))
        self.shifted = {0: self.keyed}
        values = numpy.zeros(256 if codec.kind == 'byte' else 16, _F32)
        values[:codec.decode_table.size] = codec.decode_table
        tables = []
        for op in (numpy.add, numpy.subtract):
            with numpy.errstate(over='ignore', invalid='ignore'):
                codes = code(fmt.quantize(
                    op(values[:, None], values[None, :]).ravel()))
            if codec.kind == 'nibble':
                # byte a = (a1 << 4) | a0: two independent nibble sums
                codes = codes.reshape(16, 16)
                a = numpy.arange(256)[:, None]
                b = numpy.arange(256)[None, :]
                codes = (codes[a & 15, b & 15] |
                         (codes[a >> 4, b >> 4] << 4)).astype(numpy.uint8)
            tables.append(numpy.ascontiguousarray(codes.ravel(),
                                                  numpy.uint8))
        self.add, self.sub = tables
        self.shift = lambda e: _shifted(self.keyed, e)
        if codec.kind == 'byte':
            bits = values.view(_U32).astype(numpy.uint64)
            u = numpy.arange(1 << 16)
            self.decode_pairs = bits[u & 255] | (bits[u >> 8] <<
                                                 numpy.uint64(32))


_CODECS = {}


def codec_for(fmt):
    """The (cached) :class:`WireCodec` of a format: its tables are built
    once per process, not once per step."""
    name = get_format(fmt).name
    if name not in _CODECS:
        _CODECS[name] = WireCodec(name)
    return _CODECS[name]
