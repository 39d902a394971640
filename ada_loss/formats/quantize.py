"""Rounding float32 values to a narrower binary format, vectorized.

The bit-level path works on the float32 bit patterns (a ``uint32`` view), so it
runs the same on NumPy and CuPy and costs a dozen whole-array passes, no
per-element Python:

* normal range of the target (|x| ≥ 2^emin): round to nearest even at mantissa
  bit M by adding ``2^(22−M) − 1 + lsb`` to the bits and clearing the low
  ``23 − M`` bits (a carry into the exponent is the correct rounding up);
* subnormal range (|x| < 2^emin): the spacing is the constant 2^(emin−M);
  ``(|x| + C) − C`` with C = 2^(emin−M+23) rounds to it in float32 arithmetic
  (ties to even), exactly;
* overflow (a rounded value above u_max, or ±Inf): per the format's policy;
  NaN stays NaN.

Stochastic rounding adds uniform random bits below the kept mantissa before
truncating (the normal range) or ``floor(|x|/q + u)·q`` with q the subnormal
spacing (exact in float32: |x|/q < 2^M carries M bits, u the other 23 − M).

Round-to-nearest for formats whose range is well inside float32's (E < 8,
M ≥ 1, which includes float16 and FP8) uses float32 arithmetic instead, about
2-4x faster here: with q the spacing of the format at x (2^(e−M) for |x| in
[2^e, 2^(e+1)), and 2^(emin−M) below 2^emin), ``(x + C) − C`` with
C = ±2^(e + 23 − M) (x's sign) rounds x to a multiple of q, ties to even, as
float32 addition does; C is made from the exponent bits of max(|x|, 2^emin)
with two integer operations. Overflow is decided on |x| against the format's
rounding threshold u_max + spacing/2 (at the tie itself: overflow when u_max's
code is odd, as IEEE's ties-to-even says). With M = 0 the parity of the
multiple of q is not the parity of the code, so those formats take the
bit-level path. Both paths are tested bit for bit against ml_dtypes, NumPy and
an exact rational computation.

Where ``ml_dtypes`` has the format with the same semantics and its cast is
faster (bfloat16), round-to-nearest uses ``x.astype(t).astype(float32)``.
"""
import math

import numpy

_U32 = numpy.uint32
_F32 = numpy.float32
_SIGN = 0x80000000
_ABS = 0x7FFFFFFF
_INF_BITS = 0x7F800000
_NAN_BITS = 0x7FC00000

# Formats whose ml_dtypes cast is faster than the bit-level path here
# (measured by scripts/bench_formats.py: bfloat16 2.5 vs ~4 ns per element).
_ML_FASTER = ('bfloat16',)


try:                    # optional: the GPU path
    import cupy as _cupy
except ImportError:     # tried once: a failed import searches sys.path
    _cupy = None


def array_module(a):
    """``numpy`` or ``cupy``, whichever ``a`` belongs to (NumPy when CuPy,
    an optional dependency, is not installed)."""
    return numpy if _cupy is None else _cupy.get_array_module(a)


def _bits_of(value):
    return int(numpy.array(value, _F32).view(_U32))


class BitRounder(object):
    """Constants of the bit-level rounding to one format (see module doc)."""

    def __init__(self, man_bits, emin, u_max, overflow):
        self.shift = 23 - man_bits
        self.emin_bits = _bits_of(2.0 ** emin)
        self.magic = _F32(2.0 ** (emin - man_bits + 23))
        self.sub_quantum = 2.0 ** (emin - man_bits)
        self.max_bits = _bits_of(u_max)
        self.overflow = overflow
        self.over_bits = {'inf': _INF_BITS, 'nan': _NAN_BITS,
                          'saturate': self.max_bits}[overflow]

    def cuda_constants(self):
        """(shift, emin_bits, qe, max_bits, over_bits): the constants of
        :data:`CUDA_ROUND_NEAREST` (qe: the exponent of the format's
        subnormal quantum)."""
        return (self.shift, self.emin_bits,
                math.frexp(self.sub_quantum)[1] - 1, self.max_bits,
                self.over_bits)

    def round(self, x, rng=None):
        """Round-to-nearest-even (``rng`` None) or stochastic rounding."""
        xp = array_module(x)
        bits = x.view(_U32)
        sign = bits & _U32(_SIGN)
        mag = bits & _U32(_ABS)
        if self.shift:
            if rng is None:
                lsb = (mag >> _U32(self.shift)) & _U32(1)
                r = mag + _U32((1 << (self.shift - 1)) - 1)
                r += lsb
            else:
                noise = _random_bits(rng, xp, x.shape, self.shift)
                r = mag + noise
            r &= _U32(~((1 << self.shift) - 1) & 0xFFFFFFFF)
        else:
            r = mag.copy()
        small = mag < _U32(self.emin_bits)
        if bool(small.any()):
            ax = mag.view(_F32)
            if rng is None:
                sub = (ax + self.magic) - self.magic
            else:
                q = self.sub_quantum
                u = noise.astype(numpy.float64) * 2.0 ** -self.shift \
                    if self.shift else 0.0
                sub = (xp.floor(ax.astype(numpy.float64) / q + u) * q
                       ).astype(_F32)
            r = xp.where(small, sub.view(_U32), r)
        # Rounding up past u_max, or an Inf input, overflows; NaN stays NaN.
        nan_in = mag > _U32(_INF_BITS)
        over = (r > _U32(self.max_bits)) & ~nan_in
        r = xp.where(over, _U32(self.over_bits), r)
        r = xp.where(nan_in, _U32(_NAN_BITS), r)
        r |= sign
        return r.view(_F32)


class MagicRounder(object):
    """Round-to-nearest-even in float32 arithmetic (see module doc); only
    for formats with M ≥ 1 and emax + 24 − M < 128 (C cannot overflow)."""

    def __init__(self, man_bits, emin, emax, u_max, overflow):
        self.tiny = _F32(2.0 ** emin)
        self.exp_shift = _U32((23 - man_bits) << 23)
        # u_max's code is odd (all-ones mantissa) except for OCP E4M3, whose
        # all-ones code is NaN
        self.threshold = _F32(u_max + 2.0 ** (emax - man_bits) / 2)
        self.tie_overflows = overflow != 'nan'
        self.over_value = _F32({'inf': numpy.inf, 'nan': numpy.nan,
                                'saturate': u_max}[overflow])

    @staticmethod
    def usable(man_bits, emax):
        return man_bits >= 1 and emax + 24 - man_bits < 128

    def round(self, x):
        xp = array_module(x)
        c = xp.abs(x)
        over = c >= self.threshold if self.tie_overflows else \
            c > self.threshold
        xp.maximum(c, self.tiny, out=c)
        bits = c.view(_U32)
        xp.bitwise_and(bits, _U32(_INF_BITS), out=bits)   # 2^e
        xp.add(bits, self.exp_shift, out=bits)             # 2^(e+23-M)
        xp.copysign(c, x, out=c)
        with numpy.errstate(invalid='ignore', over='ignore'):
            y = x + c
            y -= c
        xp.copysign(y, x, out=y)        # -0 and negatives rounding to 0
        if bool(over.any()):
            y[over] = xp.copysign(self.over_value, x[over])
        return y


# Round-to-nearest-even to a format in integer arithmetic on the bits of a
# float32, for CuPy: the format's subnormal range is rounded without float
# arithmetic on float32 subnormals, which GPU code may flush to zero. A CUDA
# statement block from ``b`` and the rounder's constants (``shift``,
# ``emin_bits``, ``qe``, ``max_bits``, ``over_bits``) to ``y``; also the body
# of the device fit of :mod:`ada_loss.loss_scale.device` (the overflow guard
# decides on the rounded value).
CUDA_ROUND_NEAREST = r"""
unsigned int s = b & 0x80000000u, m = b & 0x7fffffffu, r;
if (m > 0x7f800000u) {
    r = 0x7fc00000u;                              // NaN stays NaN
} else {
    if (m >= emin_bits) {                         // the format's normals
        if (shift > 0) {
            unsigned int lsb = (m >> shift) & 1u;
            r = (m + ((1u << (shift - 1)) - 1u) + lsb)
                & ~((1u << shift) - 1u);
        } else {
            r = m;
        }
    } else {                                      // its subnormals: n * 2^qe
        int E = (int)(m >> 23);
        unsigned int mant = E ? ((m & 0x7fffffu) | 0x800000u) : m;
        int e2 = E ? E - 150 : -149;              // m = mant * 2^e2
        int sh = qe - e2;
        unsigned long long n;
        if (sh <= 0) {
            n = (unsigned long long)mant << (-sh);
        } else if (sh > 25) {
            n = 0ull;
        } else {
            unsigned int rem = mant & ((1u << sh) - 1u), half = 1u << (sh - 1);
            n = mant >> sh;
            if (rem > half || (rem == half && (n & 1ull))) n += 1ull;
        }
        if (n == 0ull) {
            r = 0u;
        } else {
            int p = 63 - __clzll(n);              // n < 2^24: p <= 23
            if (qe + p >= -126) {                 // a float32 normal
                r = ((unsigned int)(qe + p + 127) << 23)
                    | (unsigned int)((n << (23 - p)) & 0x7fffffull);
            } else {                              // a float32 subnormal
                r = (unsigned int)(n << (qe + 149));
            }
        }
    }
    if (r > max_bits) r = over_bits;
}
y = r | s;
"""
_cuda_kernel = []


def _round_nearest_cupy(rounder, x):
    import cupy
    if not _cuda_kernel:
        _cuda_kernel.append(cupy.ElementwiseKernel(
            'uint32 b, int32 shift, uint32 emin_bits, int32 qe, '
            'uint32 max_bits, uint32 over_bits', 'uint32 y', CUDA_ROUND_NEAREST,
            'ada_loss_round_nearest'))
    bits = cupy.ascontiguousarray(x).view(_U32)
    y = _cuda_kernel[0](bits, *rounder.cuda_constants())
    return y.view(_F32)


def _random_bits(rng, xp, shape, nbits):
    if getattr(rng, 'dtype', None) == _U32:
        # uniform uint32 words given by the caller (a counter-based
        # stream, :mod:`ada_loss.formats.counter_rng`): their top bits
        if tuple(rng.shape) != tuple(shape):
            raise ValueError('random words of shape {} for values of shape '
                             '{}'.format(rng.shape, shape))
        return rng >> _U32(32 - nbits)
    if isinstance(rng, (int, numpy.integer)):
        rng = xp.random.default_rng(int(rng))
    return rng.integers(0, 1 << nbits, size=shape, dtype=_U32)


ROUNDINGS = ('nearest', 'stochastic')


def quantize(fmt, x, rounding='nearest', rng=None):
    """``fmt.quantize(x, ...)``; see :meth:`FloatFormat.quantize`."""
    if rounding not in ROUNDINGS:
        raise ValueError('rounding must be one of {}, got {!r}'.format(
            ', '.join(ROUNDINGS), rounding))
    dtype = getattr(x, 'dtype', None)
    if dtype not in (numpy.float32, numpy.float16):
        raise TypeError('quantize expects a float32 (or float16) array, got '
                        '{}'.format(dtype if dtype is not None else type(x)))
    if dtype == numpy.float16:
        x = x.astype(_F32)     # exact
    if rounding == 'stochastic':
        if rng is None:
            raise ValueError("rounding='stochastic' needs rng: a seeded "
                             "numpy.random.Generator, an int seed or an "
                             "array of uint32 random words")
        if fmt.is_float32:
            return x.copy()
        return fmt._rounder.round(numpy.ascontiguousarray(x)
                                  if array_module(x) is numpy else x, rng)
    if fmt.is_float32:
        return x.copy()
    xp = array_module(x)
    if xp is not numpy:
        return _round_nearest_cupy(fmt._rounder, x)
    if xp is numpy and fmt.name in _ML_FASTER and fmt.ml_dtype is not None:
        return x.astype(fmt.ml_dtype).astype(_F32)
    if fmt._magic is not None:
        return fmt._magic.round(x)
    return fmt._rounder.round(xp.ascontiguousarray(x))
