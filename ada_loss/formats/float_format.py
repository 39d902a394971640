"""Binary floating-point formats: their range and how values round into them.

The paper (§2.1) writes a format's range as [u_min, u_max]: u_min the smallest
positive (subnormal) value, u_max the largest finite one. Loss scales are
computed against a *format*, independently of the dtype arrays are stored in:
running in float32 with the float16 format is what makes adaptive scaling
testable bit for bit against plain backprop, and storing FP32 values rounded to
a format (:meth:`FloatFormat.quantize`) is how formats without a NumPy dtype
(bfloat16, FP8, any (exp, man) split as in APS, Han et al.) are emulated.

Names accepted by :func:`get_format`. The canonical names are ml_dtypes'
(the NumPy extension types of JAX/XLA), whose suffixes say what a format
does at its edges: ``fn`` = finite only, no infinities (E4M3: the top code
is NaN, so an overflowing cast gives NaN; FP6/FP4: no NaN either, overflow
saturates). So ``float8_e4m3fn`` (OCP, max 448) and ``float8_e4m3``
(IEEE-style, max 240) cannot be confused:

======================  ================  =================================
canonical (ml_dtypes)   also accepted     the format
======================  ================  =================================
``float32``             ``e8m23``         IEEE binary32
``float16``             ``e5m10``         IEEE binary16
``bfloat16``            ``e8m7``          e8m7, IEEE-style
``float8_e4m3fn``       ``fp8_e4m3``      OCP FP8 E4M3: no Inf, max 448,
                                          overflow → NaN
``float8_e5m2``         ``fp8_e5m2``      OCP FP8 E5M2: IEEE-style, max
                                          57344, overflow → Inf
``float8_e4m3``         ``e4m3``          IEEE-style E4M3, max 240, Inf
``float8_e3m4``         ``e3m4``          IEEE-style E3M4, max 15.5, Inf
``float6_e3m2fn``       ``fp6_e3m2``      OCP MX FP6 (max 28), saturates
``float6_e2m3fn``       ``fp6_e2m3``      OCP MX FP6 (max 7.5), saturates
``float4_e2m1fn``       ``fp4_e2m1``      OCP MX FP4 (max 6), saturates
======================  ================  =================================

A canonical name and its alias give the same :class:`FloatFormat` object,
whose ``name`` is the project's historical one (``fp8_e4m3``, ``e4m3``, ...:
configs, run folders and result tables keep their labels) and whose
:attr:`FloatFormat.canonical_name` is ml_dtypes'. ``e5m2`` (the APS
studies' name) is its own object with the numerics of ``float8_e5m2``.
The saturating formats keep NaN as NaN in the FP32 storage.

Besides, ``e<E>m<M>`` names any IEEE-style format with E exponent bits
(2..8) and M mantissa bits (0..23): bias 2^(E-1) − 1, subnormals, Inf and
NaN (``e5m2``, ``e4m3``, ``e3m0``, ...). ml_dtypes' ``*fnuz`` and ``e8m0``
types (other biases and NaN encodings) are not formats here.

The historical table, for reference:

==============  =============================================================
``float32``     IEEE binary32 (e8m23)
``float16``     IEEE binary16 (e5m10)
``bfloat16``    e8m7, IEEE-style (Inf, NaN, subnormals)
``fp8_e4m3``    OCP FP8 E4M3 ("e4m3fn"): no infinities, max 448, overflow → NaN
``fp8_e5m2``    OCP FP8 E5M2: IEEE-style, max 57344, overflow → Inf
``fp6_e3m2``,   OCP MX FP6/FP4: no Inf/NaN encodings; overflow *saturates* to
``fp6_e2m3``,   ± the largest value (max 28, 7.5, 6); NaN is kept as NaN in
``fp4_e2m1``    the FP32 storage
``e<E>m<M>``    IEEE-style with E exponent bits (2..8) and M mantissa bits
                (0..23): bias 2^(E-1) − 1, subnormals, Inf and NaN
                (``e5m2``, ``e4m3`` (max 240), ``e3m0``, ...)
==============  =============================================================

This module needs NumPy only (no Chainer, no SciPy); ``ml_dtypes`` is used
when installed, as the faster implementation of a cast where it is faster.
"""
import re

import numpy
try:
    import ml_dtypes     # optional: the bit-level path needs NumPy only
except ImportError:
    ml_dtypes = None

from ada_loss.formats import quantize as _q

OVERFLOW_POLICIES = ('inf', 'nan', 'saturate')

#: ml_dtypes' name -> the project's name of the same format
ML_DTYPES_NAMES = {
    'float32': 'float32', 'float16': 'float16', 'bfloat16': 'bfloat16',
    'float8_e4m3fn': 'fp8_e4m3', 'float8_e5m2': 'fp8_e5m2',
    'float8_e4m3': 'e4m3', 'float8_e3m4': 'e3m4',
    'float6_e3m2fn': 'fp6_e3m2', 'float6_e2m3fn': 'fp6_e2m3',
    'float4_e2m1fn': 'fp4_e2m1',
}
#: (E, M, overflow) -> ml_dtypes' name
_CANONICAL = {
    (8, 23, 'inf'): 'float32', (5, 10, 'inf'): 'float16',
    (8, 7, 'inf'): 'bfloat16', (4, 3, 'nan'): 'float8_e4m3fn',
    (5, 2, 'inf'): 'float8_e5m2', (4, 3, 'inf'): 'float8_e4m3',
    (3, 4, 'inf'): 'float8_e3m4', (3, 2, 'saturate'): 'float6_e3m2fn',
    (2, 3, 'saturate'): 'float6_e2m3fn', (2, 1, 'saturate'): 'float4_e2m1fn',
}
_EXPLICIT = ('float32', 'float16', 'bfloat16', 'fp8_e4m3', 'fp8_e5m2',
             'fp6_e3m2', 'fp6_e2m3', 'fp4_e2m1')
_ACCEPTED = ', '.join(_EXPLICIT) + ', or e<E>m<M> with E in 2..8 and M in ' \
    '0..23 (IEEE-style, e.g. e5m2, e4m3, e3m0); or ml_dtypes\' names of the ' \
    'same formats: ' + ', '.join(
        '{} (= {})'.format(ml, ours) for ml, ours in ML_DTYPES_NAMES.items()
        if ml != ours)


class FloatFormat(object):
    """A binary floating-point format with FP32-representable values.

    Attributes:
        name (str): the canonical name (see the module docstring).
        exp_bits (int), man_bits (int): E and M.
        emin (int): exponent of the smallest normal value, 2^emin.
        emax (int): exponent of the largest finite value.
        u_min (float): smallest positive (subnormal) value, ``u`` in Eq. (1).
        u_max (float): largest finite value, ``u_max`` in §3.2.3.
        overflow (str): what a value beyond u_max becomes: ``'inf'`` (IEEE),
            ``'nan'`` (OCP E4M3) or ``'saturate'`` (± u_max; OCP FP6/FP4).
        dtype: the NumPy dtype that stores the format natively (float16,
            float32) or ``None``: then values are emulated in float32.
    """

    def __init__(self, name, exp_bits, man_bits, emax, overflow, dtype=None,
                 ml_dtype=None):
        if overflow not in OVERFLOW_POLICIES:
            raise ValueError('overflow must be one of {}, got {!r}'.format(
                OVERFLOW_POLICIES, overflow))
        self.name = name
        self.exp_bits = int(exp_bits)
        self.man_bits = int(man_bits)
        bias = 2 ** (self.exp_bits - 1) - 1
        self.emin = 1 - bias
        self.emax = int(emax)
        self.overflow = overflow
        self.dtype = None if dtype is None else numpy.dtype(dtype)
        self.ml_dtype = ml_dtype
        self.u_min = 2.0 ** (self.emin - self.man_bits)
        top = 2.0 - 2.0 ** -self.man_bits
        if overflow == 'nan' and self.man_bits > 0:
            # E4M3FN: the all-ones mantissa of the top binade encodes NaN.
            top = 2.0 - 2.0 ** (1 - self.man_bits)
        self.u_max = top * 2.0 ** self.emax
        self._rounder = _q.BitRounder(self.man_bits, self.emin, self.u_max,
                                      self.overflow)
        self._magic = (_q.MagicRounder(self.man_bits, self.emin, self.emax,
                                       self.u_max, self.overflow)
                       if _q.MagicRounder.usable(self.man_bits, self.emax)
                       else None)

    @property
    def saturates(self):
        """True if overflow gives ± u_max instead of Inf/NaN (then a value at
        ± u_max must be read as a possible overflow)."""
        return self.overflow == 'saturate'

    @property
    def canonical_name(self):
        """ml_dtypes' name of this format (``'float8_e4m3fn'``, ...), or
        :attr:`name` for a format ml_dtypes does not have (``e3m0``)."""
        return _CANONICAL.get((self.exp_bits, self.man_bits, self.overflow),
                              self.name)

    @property
    def is_float32(self):
        return self.exp_bits == 8 and self.man_bits == 23

    def quantize(self, x, rounding='nearest', rng=None):
        """The values of ``x`` rounded to this format, stored in float32.

        Args:
            x: a float32 (or float16, widened exactly) NumPy or CuPy array.
            rounding (str): ``'nearest'`` (round to nearest, ties to even;
                subnormals kept) or ``'stochastic'`` (round up with
                probability equal to the distance to the lower neighbour,
                in units of the local spacing).
            rng: for ``'stochastic'``: a ``numpy.random.Generator`` (CuPy:
                ``cupy.random.Generator``), an int seed, or a uint32 array
                of x's shape holding uniform random words (their top bits
                are used: a counter-based stream); required.

        Returns:
            a float32 array of x's shape whose values are this format's
            values; beyond u_max: ±Inf, NaN or ±u_max per :attr:`overflow`.
            NaN stays NaN.
        """
        return _q.quantize(self, x, rounding, rng)

    def __eq__(self, other):
        return isinstance(other, FloatFormat) and self.name == other.name

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return ('FloatFormat({!r}, e{}m{}, u_min=2^{}, u_max={!r}, '
                'overflow={!r})'.format(self.name, self.exp_bits,
                                        self.man_bits,
                                        self.emin - self.man_bits,
                                        self.u_max, self.overflow))

    def __str__(self):
        return self.name


def _ml(name):
    return None if ml_dtypes is None else getattr(ml_dtypes, name)


def _ieee(e, m):
    return 2 ** (e - 1) - 1   # emax of an IEEE-style format = its bias


def _make(name):
    if name == 'float32':
        return FloatFormat(name, 8, 23, 127, 'inf', numpy.float32)
    if name == 'float16':
        return FloatFormat(name, 5, 10, 15, 'inf', numpy.float16,
                           numpy.float16)
    if name == 'bfloat16':
        return FloatFormat(name, 8, 7, 127, 'inf', None, _ml('bfloat16'))
    if name == 'fp8_e4m3':
        return FloatFormat(name, 4, 3, 8, 'nan', None, _ml('float8_e4m3fn'))
    if name == 'fp8_e5m2':
        return FloatFormat(name, 5, 2, 15, 'inf', None, _ml('float8_e5m2'))
    if name == 'fp6_e3m2':
        return FloatFormat(name, 3, 2, 4, 'saturate', None,
                           _ml('float6_e3m2fn'))
    if name == 'fp6_e2m3':
        return FloatFormat(name, 2, 3, 2, 'saturate', None,
                           _ml('float6_e2m3fn'))
    if name == 'fp4_e2m1':
        return FloatFormat(name, 2, 1, 2, 'saturate', None,
                           _ml('float4_e2m1fn'))
    match = re.fullmatch(r'e(\d+)m(\d+)', name)
    if match:
        # a run of thousands of digits is no format (and beyond int()'s
        # limit for text): as out of range as e9m0
        e, m = (int(g) if len(g) <= 6 else 10 ** 6 for g in match.groups())
        if 2 <= e <= 8 and 0 <= m <= 23:
            if (e, m) == (8, 23):
                return _make('float32')
            if (e, m) == (5, 10):
                return _make('float16')
            if (e, m) == (8, 7):
                return _make('bfloat16')
            ml = {(5, 2): 'float8_e5m2', (4, 3): 'float8_e4m3',
                  (3, 4): 'float8_e3m4'}.get((e, m))
            # named by its numbers (e04m3 is e4m3: one object, one name)
            return FloatFormat('e{}m{}'.format(e, m), e, m, _ieee(e, m),
                               'inf', None, _ml(ml) if ml else None)
        raise ValueError(
            'impossible format {!r}: exponent bits must be 2..8 and mantissa '
            'bits 0..23 (values must be representable in float32); accepted: '
            '{}'.format(name, _ACCEPTED))
    return None


_CACHE = {}


def get_format(fmt):
    """The :class:`FloatFormat` named ``fmt`` (a name of the module
    docstring's table — ml_dtypes' canonical one or its alias, the same
    object — a NumPy float16/float32 dtype, or a FloatFormat, returned as
    is).

    Raises:
        ValueError: an unknown name or an impossible (E, M), listing what is
            accepted.
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    given = fmt
    if not isinstance(fmt, str):
        try:
            fmt = numpy.dtype(fmt).name
        except Exception:   # NumPy raises TypeError, ValueError, ... here
            raise ValueError('unknown floating-point format {!r}; expected {}'
                             .format(fmt, _ACCEPTED))
    key = fmt.strip().lower()
    if key not in _CACHE:
        f = _make(ML_DTYPES_NAMES.get(key, key))
        if f is None:
            raise ValueError('unknown floating-point format {!r}{}; expected '
                             '{}'.format(given, '' if given is fmt else
                                         ' (NumPy {})'.format(fmt),
                                         _ACCEPTED))
        # one object per format (e8m23 is float32)
        _CACHE[key] = _CACHE.setdefault(f.name, f)
    return _CACHE[key]


def canonical_format(fmt):
    """The one :class:`FloatFormat` of ``fmt``'s numbers (any name
    :func:`get_format` accepts, or a FloatFormat): the object whose
    ``name`` the canonical texts of modes and precisions print
    (``adaptive:fmt=...``, ``fwd=...,bwd=...``).

    Every alias already gives one object (``float8_e4m3fn`` and
    ``fp8_e4m3``; ``e8m23`` and ``float32``), except ``e5m2``, kept its own
    object for the APS studies' labels while its numbers are those of
    ``fp8_e5m2``: here it is ``fp8_e5m2``, so that one format is one text.
    The name is the project's (:attr:`FloatFormat.name`), not ml_dtypes'
    (:attr:`FloatFormat.canonical_name`): configs, run folders and tables
    already carry it."""
    f = get_format(fmt)
    ml = _CANONICAL.get((f.exp_bits, f.man_bits, f.overflow))
    return get_format(ML_DTYPES_NAMES[ml]) if ml else f
