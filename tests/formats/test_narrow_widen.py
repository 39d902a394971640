"""ada_loss.formats.narrow / widen / widen_summable: NumPy's own float16
conversions and reductions, bit for bit.

* ``narrow(y)`` equals ``y.astype(float16)`` (bits, dtype and strides) on the
  edge values (subnormals, ties, the largest finite value and the overflow
  threshold, ±Inf, NaNs with payloads, signed zeros), on every float32 whose
  13 dropped mantissa bits are one of the patterns that decide rounding
  (ties, one above or below, all-ones), on random mixes of magnitudes, and
  on C, NHWC-ordered, strided and small arrays. (The same comparison over
  all 2^32 float32 bit patterns was run once when narrow was written: no
  difference.)
* ``widen_summable(a)`` reduces like ``a`` itself: equal sums where a plain
  float32 copy sums differently (reduced runs longer than NumPy's buffer),
  which is what makes the test able to fail.
"""
import numpy
import pytest

from ada_loss.formats import narrow, widen, widen_summable

F16, F32, U16, U32 = numpy.float16, numpy.float32, numpy.uint16, numpy.uint32


def _astype16(y):
    with numpy.errstate(over='ignore', invalid='ignore'):
        return y.astype(F16)


def assert_same16(a, b):
    assert a.dtype == b.dtype == F16
    assert a.shape == b.shape
    assert a.strides == b.strides
    assert numpy.array_equal(a.view(U16), b.view(U16))


def edge_values():
    f16 = numpy.arange(1 << 16, dtype=U16).view(F16)
    every16 = f16.astype(F32)        # every float16 value, exactly
    with numpy.errstate(invalid='ignore', over='ignore'):
        spacing = numpy.abs(numpy.spacing(f16).astype(F32))
        ties = every16 + spacing / 2          # halfway to the next one
        near = [ties, numpy.nextafter(ties, F32(numpy.inf)),
                numpy.nextafter(ties, F32(-numpy.inf))]
    special = numpy.array(
        [0.0, -0.0, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25, 2.0 ** -26,
         2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 65504.0, 65519.996, 65520.0,
         65536.0, 1e30, 3.4e38, numpy.inf, -numpy.inf, numpy.nan,
         -numpy.nan, 1e-45, -1e-45], F32)
    payload_nans = numpy.array([0x7FC00001, 0xFFC12345, 0x7F800001,
                                0x7FA00000, 0xFF800100], U32).view(F32)
    vals = numpy.concatenate([every16] + near + [special, -special,
                                                 payload_nans])
    return vals


def test_narrow_edge_values():
    y = edge_values()
    assert y.size > 4 * 65536
    assert_same16(narrow(y), _astype16(y))


@pytest.mark.parametrize('low', [0, 1, 0x7FF, 0x800, 0xFFF, 0x1000, 0x1001,
                                 0x1FFF])
def test_narrow_rounding_bit_patterns(low):
    """All 2^19 sign/exponent/kept-mantissa patterns with one pattern of the
    13 bits float16 drops (normal results) — and, below 2^-14, of the bits
    that decide subnormal rounding."""
    y = ((numpy.arange(1 << 19, dtype=U32) << U32(13)) | U32(low)).view(F32)
    assert_same16(narrow(y), _astype16(y))


def test_narrow_random_mixes_and_layouts():
    rs = numpy.random.RandomState(0)
    n = 3 * 65536 + 123                    # several chunks and a remainder
    y = (rs.standard_normal(n) * numpy.exp2(rs.uniform(-30, 18, n))).astype(
        F32)
    assert_same16(narrow(y), _astype16(y))
    x4 = y[:2 * 8 * 96 * 96].reshape(2, 8, 96, 96)
    nhwc = numpy.ascontiguousarray(x4.transpose(0, 2, 3, 1)).transpose(
        0, 3, 1, 2)
    for a in (x4, nhwc, x4[:, ::2], x4[..., 1:], x4.T, y[:5],
              numpy.float32(3.0) * numpy.ones((), F32),
              numpy.zeros((0, 3), F32)):
        assert_same16(narrow(a), _astype16(a))


def test_narrow_nan_chunk_falls_back_exactly():
    y = numpy.linspace(-1, 1, 70000, dtype=F32)
    y[100] = numpy.array(0x7F800001, U32).view(F32)    # signaling NaN
    y[69000] = -numpy.nan
    assert_same16(narrow(y), _astype16(y))


def test_widen_is_numpy_cast():
    a = numpy.arange(1 << 16, dtype=U16).view(F16)     # every pattern
    ref = a.astype(F32).view(U32)
    assert numpy.array_equal(widen(a).view(U32), ref)
    s = widen_summable(a)
    assert s.dtype == numpy.dtype(F32).newbyteorder()
    assert numpy.array_equal(s.astype(F32).view(U32), ref)


@pytest.mark.parametrize('shape,axis', [
    ((2, 8, 100, 100), (0, 2, 3)),    # runs of 10000 > NumPy's 8192 buffer
    ((20000,), None),
    ((3, 3, 9000), -1),
    ((16, 16, 32, 32), (0, 2, 3)),
    ((16, 16, 32, 32), None),
    ((8, 8191, 3), None),
])
def test_widen_summable_sums_like_float16(shape, axis):
    rs = numpy.random.RandomState(1)
    a = (rs.standard_normal(shape) * 3 + 1).astype(F16)
    ref = a.sum(axis=axis, dtype=F32)
    s = widen_summable(a)
    assert numpy.array_equal(numpy.asarray(s.sum(axis=axis, dtype=F32)),
                             numpy.asarray(ref))
    assert numpy.array_equal(s.mean(axis=axis, dtype=F32),
                             a.mean(axis=axis, dtype=F32))
    assert numpy.array_equal(s.var(axis=axis, dtype=F32),
                             a.var(axis=axis, dtype=F32))


def test_plain_widening_would_sum_differently():
    """The case that needs widen_summable: a native float32 copy gives other
    sums (so the test above can fail)."""
    rs = numpy.random.RandomState(1)
    a = (rs.standard_normal((2, 8, 100, 100)) * 3 + 1).astype(F16)
    ref = a.sum(axis=(0, 2, 3), dtype=F32)
    assert not numpy.array_equal(widen(a).sum(axis=(0, 2, 3), dtype=F32),
                                 ref)
