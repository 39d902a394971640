"""Float32 products and ``ldexp`` with IEEE subnormals on NumPy and CuPy.

A block-scaled cast ends by multiplying each rounded element by its block's
scale (``q · 2^e`` for MX, ``q · (1/s)`` for blockwise FP8, ``q · s · d``
for NVFP4). Where the product is a float32 subnormal (a block far below the
tensor's amax, a tiny scale), NumPy rounds it as IEEE 754 says, but CuPy's
float32 arithmetic on the GPU flushed it to zero (measured on an H200,
issue 35: 10 MX and one blockwise CuPy-equals-NumPy test failed on values
such as 5.9e-39 returned as 0). Subnormal *operands* were read as zero
there too (a block of subnormal inputs quantized to 0, a block amax below
2^-126 compared equal to 0). These functions give NumPy's bits on both: on
CuPy the operands are read from their bits into float64 exactly (an
integer significand converted, never a float32 subnormal), the product (or
quotient, or ldexp) formed in float64 — exact for a product of two float32s
(24 + 24 significant bits) — and rounded to float32 by hand in the
subnormal range (round to nearest even, in double arithmetic, which no
flush-to-zero mode touches); normal results round by the hardware's
conversion, which is exact IEEE there. The block max and the zero test
work on the bits.
"""
import numpy

_F32 = numpy.float32

# |d| < 2^-126: a float32 subnormal n·2^-149, n = rint(|d|·2^149) (rint
# rounds half to even); n = 2^23 is the smallest normal, whose bits are
# also n. Otherwise the conversion rounds (no subnormal result there).
_TO_F32 = r"""
__device__ __forceinline__ float exact_f32(double d) {
    double a = fabs(d);
    if (a < 1.1754943508222875e-38) {
        unsigned int n = (unsigned int)rint(a * 7.1362384635297994e+44);
        unsigned int s = signbit(d) ? 0x80000000u : 0u;
        return __uint_as_float(s | n);
    }
    return (float)d;
}
// A float32 (its bits) as a double, exactly, subnormals included: the
// conversion instruction would read a subnormal as 0 where float32 flushes
// to zero; an integer converts exactly.
__device__ __forceinline__ double exact_f64(unsigned int b) {
    if ((b & 0x7f800000u) != 0u) return (double)__uint_as_float(b);
    double m = ldexp((double)(b & 0x7fffffu), -149);      // exact
    return (b & 0x80000000u) ? -m : m;
}
"""

_kernels = {}


_BODIES = {
    'mul': ('uint32 a, uint32 b',
            'y = exact_f32(exact_f64(a) * exact_f64(b))'),
    'div': ('uint32 a, uint32 b',
            'y = exact_f32(exact_f64(a) / exact_f64(b))'),
    'ldexp': ('uint32 a, int32 e', 'y = exact_f32(ldexp(exact_f64(a), e))'),
    # a sum of two float32s rounded to double and then to float32 is the
    # correctly rounded float32 sum (53 >= 2*24 + 2); a subnormal sum is
    # exact (a multiple of 2^-149 below 2^-126)
    'add': ('uint32 a, uint32 b',
            'y = exact_f32(exact_f64(a) + exact_f64(b))'),
    'sub': ('uint32 a, uint32 b',
            'y = exact_f32(exact_f64(a) - exact_f64(b))'),
    # a float32 times a float64 factor, rounded once to float32 (APS's
    # x 1/p and unshift in one rounding)
    'mul_f64': ('uint32 a, float64 f', 'y = exact_f32(exact_f64(a) * f)'),
}


def _kernel(name):
    if name not in _kernels:
        import cupy
        params, body = _BODIES[name]
        _kernels[name] = cupy.ElementwiseKernel(
            params, 'float32 y', body, 'ada_loss_exact_' + name,
            preamble=_TO_F32)
    return _kernels[name]


def _on_device(v):
    return type(v).__module__.split('.')[0] == 'cupy'


def _bits(a):
    """A CuPy float32 array (or a scalar) as its uint32 bits."""
    if not _on_device(a):
        return _F32(a).view(numpy.uint32)
    import cupy
    return cupy.ascontiguousarray(a, dtype=_F32).view(numpy.uint32)


def _on_host(a, b):
    return not (_on_device(a) or _on_device(b))


def multiply(a, b):
    """``a · b`` of float32 arrays or scalars (broadcast; other float
    dtypes are cast to float32 first), rounded once as IEEE 754 float32
    multiplication rounds it, subnormal operands and results included, on
    NumPy and CuPy alike. NaN and Inf propagate as in a float32 product."""
    if _on_host(a, b):
        return numpy.multiply(a, b, dtype=_F32)
    return _kernel('mul')(_bits(a), _bits(b))


def divide(a, b):
    """``a / b`` as IEEE 754 float32 division rounds it (subnormals
    included) on NumPy and CuPy alike: on CuPy the quotient of the two
    exact doubles is rounded to double and then to float32, which gives the
    correctly rounded float32 quotient (53 ≥ 2·24 + 2)."""
    if _on_host(a, b):
        return numpy.divide(a, b, dtype=_F32)
    return _kernel('div')(_bits(a), _bits(b))


def ldexp(a, e):
    """``a · 2^e`` of float32 values (other float dtypes cast to float32
    first) and int32 exponents, rounded once to float32 (subnormal operands
    and results included) on NumPy and CuPy alike."""
    if _on_host(a, e):
        return numpy.ldexp(numpy.asarray(a, dtype=_F32), e).astype(
            _F32, copy=False)
    return _kernel('ldexp')(_bits(a), e.astype(numpy.int32, copy=False)
                            if hasattr(e, 'astype') else numpy.int32(e))


def add(a, b):
    """``a + b`` of float32 arrays or scalars as IEEE 754 float32 addition
    rounds it (subnormal operands and results included) on NumPy and CuPy
    alike (the APS emulation's sums, :mod:`ada_loss.communication`)."""
    if _on_host(a, b):
        return numpy.add(a, b, dtype=_F32)
    return _kernel('add')(_bits(a), _bits(b))


def subtract(a, b):
    """``a − b`` as :func:`add` rounds it."""
    if _on_host(a, b):
        return numpy.subtract(a, b, dtype=_F32)
    return _kernel('sub')(_bits(a), _bits(b))


def multiply_f64(a, f):
    """``a · f`` of float32 values ``a`` and float64 factors ``f``
    (broadcast), computed in float64 and rounded once to float32 on NumPy
    and CuPy alike (exact before the rounding where ``f`` has at most 29
    significant bits, e.g. a float32 times a power of two)."""
    if _on_host(a, f):
        return (numpy.asarray(a, _F32).astype(numpy.float64) *
                numpy.asarray(f, numpy.float64)).astype(_F32)
    import cupy
    return _kernel('mul_f64')(_bits(a), cupy.asarray(f, numpy.float64))


def abs_max_bits(a, axis, keepdims=True):
    """max|a| over ``axis`` of float32 values (other float dtypes cast to
    float32 first), from the bits: the magnitude bits of non-negative
    floats order as the floats do, so a max over integers gives the float
    max with no float arithmetic (no flush of subnormals to zero on a GPU);
    a NaN gives a NaN (its bits exceed Inf's)."""
    if _on_device(a):
        # (the code the H200 ran; the library passes float32 blocks)
        import cupy
        m = (a.view(numpy.uint32) & numpy.uint32(0x7fffffff)).max(
            axis=axis, keepdims=keepdims)
        return cupy.ascontiguousarray(m).view(_F32)
    m = (numpy.asarray(a, dtype=_F32).view(numpy.uint32)
         & numpy.uint32(0x7fffffff)).max(axis=axis, keepdims=keepdims)
    return m.view(_F32)


def is_zero(a):
    """``a == 0`` (±0) from the bits of ``a`` as float32: a float32
    subnormal is not zero, also where the GPU's float32 comparison would
    flush it."""
    if not _on_device(a):
        a = numpy.asarray(a, dtype=_F32)
    return (a.view(numpy.uint32) & numpy.uint32(0x7fffffff)) == 0
