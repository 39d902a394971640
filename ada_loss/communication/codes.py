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
"""
import numpy

from ada_loss.communication.cost import format_bits  # NOQA (re-exported)
from ada_loss.formats import get_format

_F32 = numpy.float32
_U32 = numpy.uint32
_QNAN = 0x7FC00000
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
        elif self.kind == 'byte':
            numpy.take(self.decode_table, data, out=out)
        elif n % 2:
            out[...] = self.pair_table[data].view(_F32)[:n]
        else:
            numpy.take(self.pair_table, data, out=out.view(numpy.uint64))
        return out


_CODECS = {}


def codec_for(fmt):
    """The (cached) :class:`WireCodec` of a format: its tables are built
    once per process, not once per step."""
    name = get_format(fmt).name
    if name not in _CODECS:
        _CODECS[name] = WireCodec(name)
    return _CODECS[name]
