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
code (16 K entries for an 8-bit format: :meth:`WireCodec.encode`, exact
values only). Decoding is a table of ``2^bits`` float32 values.
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
tables built once per format from ``quantize`` itself, read by compiled
kernels (:mod:`~ada_loss.communication.kernels`, Numba) that each make one
pass over memory:

*Rounding by arithmetic* (:meth:`WireCodec.round_encode`, the kernels'
encoding): ``quantize`` then encode, for *any* float32 ``y``, computed on
its bits in branch-free selects, so that the loop vectorizes: a value in
the format's normal range rounds its mantissa to M bits (add half an ulp
less one, plus the lowest kept bit: ties to even; the carry moves into the
exponent field) and rebiases the exponent; a value below the format's
smallest normal rounds ``|y| · 2^(M − emin)`` to an integer (float32's own
rounding of ``t + 2^23``, ties to even; exact, the product being a power
of two away); magnitudes beyond the largest finite code take the code
``quantize`` gives to an overflow (Inf, NaN, or the largest value for
saturating formats), float32 Inf and NaN theirs — those codes are read
from ``quantize`` once per format (:func:`_encoder_parameters`).

*APS's shift*: the kernel multiplies first — by the float32 power of two
(or, beyond float32's powers, exactly in float64 and rounded once): bit
for bit ``scale_pow2`` — and encodes the product, in the same pass over
memory. Tested for every float32 top half with low halves 0, 1, 0x7FFF,
0x8000, 0xFFFF and a random one (every sign, binade, float32 subnormal,
Inf, NaN, both sides of every tie) against ``quantize`` + encode (and
``quantize(scale_pow2(·))`` for shifts from −140 to +140), and against
ml_dtypes' casts where it has the format (equal on every non-NaN pattern).

*The ⊕ by table* (:meth:`WireCodec.add_codes`, ``sub_codes``):
``Q(a + b)`` (and ``Q(a − b)``, for Kahan) of two values of the format is
a function of their two codes; a table of 2^16 bytes indexed by
``(a << 8) | b`` holds the code of the emulation's result (its
``Accumulator``: FP32 operation, ``quantize``) for every pair — for nibble
formats a byte holds two values, and one lookup adds both pairs. Tested on
every pair against the Accumulator.

*Decoding*: the 256-entry (16 for nibbles) table of float32 values, fused
in the ring's last pass with the mean's ``× 1/p`` and the unshift
(:func:`~ada_loss.communication.kernels.decode`).

**On CuPy arrays** (:meth:`WireCodec.encode`, ``decode``,
``round_encode``, ``pack``, ``add_codes``, ``sub_codes`` dispatch on the
array module) the same tables, copied to the device once per codec, are
read by CuPy's gathers: every step is integer work on bit patterns (table
index from the float32 bits, nibble packing, a table of float32 *bits* for
decoding), so no float32 arithmetic can flush a subnormal; the rounding of
``round_encode`` is ``quantize``'s integer kernel after APS's shift by
:func:`ada_loss.formats.exact.ldexp`. The same bytes and values as NumPy.
"""
import numpy

from ada_loss.communication import kernels
from ada_loss.communication.cost import format_bits  # NOQA (re-exported)
from ada_loss.formats import exact, get_format
from ada_loss.formats.quantize import array_module

_F32 = numpy.float32
_U32 = numpy.uint32
_QNAN = 0x7FC00000
#: elements per block of the kernels' loops (their scratch arrays stay in
#: cache; the tests set it small to cross many block boundaries; even, so
#: nibble blocks start on a byte)
BLOCK = 1 << 12
_EMPTY_I64 = numpy.empty(0, numpy.int64)
_EMPTY_F64 = numpy.empty(0, numpy.float64)
_EMPTY_BOOL = numpy.empty(0, numpy.bool_)


def block_size():
    """:data:`BLOCK`, made even (at least 2)."""
    return max(2, BLOCK - BLOCK % 2)


def scratch(k=0):
    """The process's k-th ``uint8`` work array of :func:`block_size`
    bytes (a block's unpacked codes)."""
    n = block_size()
    if _SCRATCH and _SCRATCH[0].size != n:
        del _SCRATCH[:]
    while len(_SCRATCH) <= k:
        _SCRATCH.append(numpy.empty(n, numpy.uint8))
    return _SCRATCH[k]


_SCRATCH = []


def work():
    """The process's ``float32`` work array of :func:`block_size` values
    (a block's shifted values)."""
    n = block_size()
    if not _WORK_F32 or _WORK_F32[0].size != n:
        _WORK_F32[:] = [numpy.empty(n, _F32)]
    return _WORK_F32[0]


_WORK_F32 = []
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
        self._device = None
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

    # -- CuPy arrays (module docstring) -------------------------------------
    def _dev(self):
        """The tables on the device (built at first use): ``encode`` (the
        encode table), ``bits`` (decode table as uint32 bits), and for
        formats of at most 8 bits ``add`` / ``sub``."""
        if self._device is None:
            import cupy
            dev = {}
            if self.kind != 'float32':
                dev['encode'] = cupy.asarray(self.encode_table)
                dev['bits'] = cupy.asarray(self.decode_table.view(_U32))
            if self.fast:
                t = self.tables()
                dev['bits'] = cupy.asarray(t.values.view(_U32))
                dev['add'] = cupy.asarray(t.add)
                dev['sub'] = cupy.asarray(t.sub)
            self._device = dev
        return self._device

    def _codes_device(self, values):
        """Unpacked codes of CuPy float32 values of the format (table
        lookup on the bits, as :meth:`encode`)."""
        bits = values.view(_U32) >> _U32(self.shift)
        return self._dev()['encode'][bits.astype(numpy.int64)]

    def _pack_device(self, codes):
        xp = array_module(codes)
        codes = codes.astype(numpy.uint8, copy=False)
        if self.kind != 'nibble':
            return codes
        if codes.size % 2:
            codes = xp.concatenate([codes, xp.zeros(1, numpy.uint8)])
        hi = xp.left_shift(codes[1::2], numpy.uint8(4))
        return xp.bitwise_or(hi, codes[0::2]).astype(numpy.uint8,
                                                     copy=False)

    def _encode_device(self, values):
        import cupy
        values = cupy.ascontiguousarray(values, _F32).ravel()
        if self.kind == 'float32':
            return values.view(numpy.uint8)
        codes = self._codes_device(values)
        if self.kind == 'half':
            return cupy.ascontiguousarray(codes).view(numpy.uint8)
        return self._pack_device(codes)

    def _decode_device(self, data, n, out):
        import cupy
        data = cupy.ascontiguousarray(data, numpy.uint8)
        self._check_nbytes(data, n)
        if out is None:
            out = cupy.empty(n, _F32)
        dest = out.view(_U32)
        if self.kind == 'float32':
            dest[...] = data.view(_U32)       # bits: no float copy
            return out
        if self.kind == 'half':
            codes = data.view(numpy.uint16)
        elif self.kind == 'nibble':
            codes = cupy.empty(2 * data.size, numpy.uint8)
            codes[0::2] = data & numpy.uint8(15)
            codes[1::2] = data >> numpy.uint8(4)
            codes = codes[:n]
        else:
            codes = data
        dest[...] = self._dev()['bits'][codes.astype(numpy.int64)]
        return out

    # -- the fast path of the ring: codes in, codes out -------------------
    @property
    def fast(self):
        """Whether :meth:`round_encode` and the code tables exist: formats
        of at most 8 bits (one code per byte, or two per byte)."""
        return self.kind in ('nibble', 'byte')

    def tables(self):
        """The format's :class:`_FastTables` (built at first use)."""
        if self._fast is None:
            self._fast = _FastTables(self)
        return self._fast

    def round_encode(self, y, out=None, shift=0):
        """float32 values (any, 1-D) → the codes of
        ``quantize(y · 2^shift)`` (the product as ``scale_pow2`` rounds
        it), one per byte (``uint8``, unpacked: 0..15 for a nibble format),
        into ``out`` when given: bit for bit ``encode(quantize(·))``
        (module docstring, *Rounding by arithmetic*), one compiled pass.
        CuPy ``y``: ``exact.ldexp``, ``quantize``, the encode table."""
        if array_module(y) is not numpy:
            import cupy
            y = cupy.ascontiguousarray(y, _F32).ravel()
            if shift:
                y = exact.ldexp(y, numpy.int32(shift))
            codes = self._codes_device(self.format.quantize(y))
            if out is None:
                return codes.astype(numpy.uint8, copy=False)
            out[...] = codes
            return out
        y = numpy.ascontiguousarray(y, _F32)
        if out is None:
            out = numpy.empty(y.size, numpy.uint8)
        seg = numpy.array([0, y.size] if shift else [], numpy.int64)
        kernels.encode(y, 0, y.size, seg[:1], seg[1:],
                       numpy.full(seg.size // 2, 2.0 ** shift),
                       self.tables().prm, self.tables().sub_scale, False,
                       block_size(), scratch(), work(), out)
        return out

    def pack(self, codes, out=None):
        """Unpacked codes (``uint8``) → wire bytes: the same array for
        1-byte codes, two per byte for nibbles (first value in the low
        nibble; an odd count ends in a zero nibble)."""
        if self.kind != 'nibble':
            return codes
        if array_module(codes) is not numpy:
            packed = self._pack_device(codes)
            if out is None:
                return packed
            out[...] = packed
            return out
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
        return self._pair_op(self.tables().add, a, b, out)

    def sub_codes(self, a, b, out=None):
        """``Q(a − b)`` on wire bytes, as :meth:`add_codes`."""
        return self._pair_op(self.tables().sub, a, b, out)

    def _pair_op(self, table, a, b, out):
        if array_module(a) is not numpy or array_module(b) is not numpy:
            import cupy
            table = self._dev()['add' if table is self.tables().add
                                else 'sub']
            idx = (cupy.asarray(a, numpy.uint8).astype(numpy.int32) << 8) \
                | cupy.asarray(b, numpy.uint8).astype(numpy.int32)
            if out is None:
                return table[idx.ravel()]
            out[...] = table[idx.ravel()]
            return out
        a = numpy.ascontiguousarray(a, numpy.uint8)
        b = numpy.ascontiguousarray(b, numpy.uint8)
        if out is None:
            out = numpy.empty(a.size, numpy.uint8)
        kernels.pair_op(a, b, table, out)
        return out

    def nbytes(self, n):
        """Bytes on the wire for ``n`` values."""
        if self.kind == 'nibble':
            return (n + 1) // 2
        return n * {'byte': 1, 'half': 2, 'float32': 4}[self.kind]

    def _check_nbytes(self, data, n):
        """Wire bytes ``data`` must hold exactly ``n`` values."""
        if data.size != self.nbytes(n):
            raise ValueError('{} values of {} take {} bytes, got {}'.format(
                n, self.format.name, self.nbytes(n), data.size))

    def encode(self, values):
        """float32 values of the format (1-D) → ``uint8`` wire bytes."""
        if array_module(values) is not numpy:
            return self._encode_device(values)
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
        if array_module(data) is not numpy:
            return self._decode_device(data, n, out)
        data = numpy.asarray(data, numpy.uint8)
        self._check_nbytes(data, n)
        if out is None:
            out = numpy.empty(n, _F32)
        if self.kind == 'float32':
            out[...] = data.view(_F32)
        elif self.format.name == 'float16':
            out[...] = data.view(numpy.float16)
        elif self.kind == 'half':
            numpy.take(self.decode_table, data.view(numpy.uint16), out=out)
        else:
            data = numpy.ascontiguousarray(data)
            kernels.decode(data, 0, n, self.tables().values,
                           self.kind == 'nibble', False, 1.0, _EMPTY_I64,
                           _EMPTY_F64, _EMPTY_BOOL, out)
        return out


def _encoder_parameters(codec):
    """``(prm, sub_scale)`` of :func:`~.kernels._code` for a format of at
    most 8 bits: the rounding position, the exponent rebias, the smallest
    normal's bits, the sign bit, the largest finite code magnitude, and
    the codes ``quantize`` gives to overflow, ±Inf and NaN (taken from
    ``quantize`` and the encode table, so that every policy — Inf, NaN,
    saturation — is the format's own)."""
    fmt = codec.format
    m, e = fmt.man_bits, fmt.exp_bits
    bias = 1 - fmt.emin
    enc, shift = codec.encode_table, _U32(codec.shift)

    def code(bits):
        v = numpy.array([bits], _U32).view(_F32)
        with numpy.errstate(over='ignore', invalid='ignore'):
            return int(enc[fmt.quantize(v).view(_U32) >> shift][0])

    top = numpy.array([fmt.u_max], _F32).view(_U32)[0]
    maxfin = code(int(top)) & ((1 << (e + m)) - 1)
    prm = numpy.array([
        23 - m, (127 - bias) << m, (127 + fmt.emin) << 23, e + m, maxfin,
        code(0x7F7FFFFF), code(0xFF7FFFFF),       # overflow
        code(0x7F800000), code(0xFF800000),       # ±Inf
        code(0x7FC00000), code(0xFFC00000)],      # NaN
        numpy.int64)
    return prm, float(2.0 ** (m - fmt.emin))


class _FastTables(object):
    """The tables of a format of at most 8 bits (module docstring):

    * ``prm``, ``sub_scale``: the encoding kernel's parameters
      (:func:`_encoder_parameters`);
    * ``add``, ``sub``: ``(a << 8) | b`` → the wire byte of ``Q(a ± b)``
      for wire bytes ``a``, ``b`` (two nibble values per byte);
    * ``values``: the float32 value of every code (256 entries, or 16 for
      nibbles; codes the format lacks decode to 0).
    """

    def __init__(self, codec):
        fmt = codec.format
        enc, shift = codec.encode_table, _U32(codec.shift)

        def code(q):
            return enc[q.view(_U32) >> shift]

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
        self.values = values
        self.prm, self.sub_scale = _encoder_parameters(codec)


_CODECS = {}


def codec_for(fmt):
    """The (cached) :class:`WireCodec` of a format: its tables are built
    once per process, not once per step."""
    name = get_format(fmt).name
    if name not in _CODECS:
        _CODECS[name] = WireCodec(name)
    return _CODECS[name]
