"""Float32 products and ``ldexp`` with IEEE subnormals on NumPy and CuPy.

A block-scaled cast ends by multiplying each rounded element by its block's
scale (``q · 2^e`` for MX, ``q · (1/s)`` for blockwise FP8, ``q · s · d``
for NVFP4). Where the product is a float32 subnormal (a block far below the
tensor's amax, a tiny scale), NumPy rounds it as IEEE 754 says, but CuPy's
float32 arithmetic on the GPU flushed it to zero (measured on an H200,
issue 35: 10 MX and one blockwise CuPy-equals-NumPy test failed on values
such as 5.9e-39 returned as 0). These functions give NumPy's bits on both:
on CuPy the product of two float32s is formed in float64, where it is exact
(24 + 24 significant bits), and rounded to float32 by hand in the
subnormal range (round to nearest even, in double arithmetic, which no
flush-to-zero mode touches); normal results round by the hardware's
conversion, which is exact IEEE there.
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
"""

_kernels = {}


def _kernel(name):
    if name not in _kernels:
        import cupy
        if name == 'mul':
            _kernels[name] = cupy.ElementwiseKernel(
                'float32 a, float32 b', 'float32 y',
                'y = exact_f32((double)a * (double)b)',
                'ada_loss_exact_mul', preamble=_TO_F32)
        else:
            _kernels[name] = cupy.ElementwiseKernel(
                'float32 a, int32 e', 'float32 y',
                'y = exact_f32(ldexp((double)a, e))',
                'ada_loss_exact_ldexp', preamble=_TO_F32)
    return _kernels[name]


def multiply(a, b):
    """``a · b`` of float32 arrays (broadcast), rounded once as IEEE 754
    float32 multiplication rounds it, subnormals included, on NumPy and
    CuPy alike. NaN and Inf propagate as in a float32 product."""
    if isinstance(a, numpy.ndarray) and isinstance(b, numpy.ndarray) \
            or numpy.isscalar(a) and isinstance(b, numpy.ndarray) \
            or numpy.isscalar(b) and isinstance(a, numpy.ndarray):
        return numpy.multiply(a, b, dtype=_F32)
    if numpy.isscalar(a):
        a = _F32(a)
    if numpy.isscalar(b):
        b = _F32(b)
    return _kernel('mul')(a, b)


def ldexp(a, e):
    """``a · 2^e`` of a float32 array and int32 exponents, rounded once to
    float32 (subnormals included) on NumPy and CuPy alike."""
    if isinstance(a, numpy.ndarray):
        return numpy.ldexp(a, e).astype(_F32, copy=False)
    return _kernel('ldexp')(a, e.astype(numpy.int32, copy=False)
                            if hasattr(e, 'astype') else numpy.int32(e))
