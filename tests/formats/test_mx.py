"""``quantize_mx`` bit for bit against an independent reference built on
ml_dtypes (``tests/scaled_reference.py``): per block, a Python loop computes
the amax in float64, the scale exponent by exact rational arithmetic
(``fractions``), the scale as an ``ml_dtypes.float8_e8m0fnu`` value made
from its code (exponent + 127), and the elements by ml_dtypes' own casts
(``float8_e4m3fn``, ``float8_e5m2``, ``float6_e3m2fn``, ``float6_e2m3fn``,
``float4_e2m1fn``) of x / scale clamped to the element's largest value. It
shares no code with ``ada_loss.formats`` (no get_format, no quantize).

Cases: random tensors whose blocks lie anywhere in 2^-100 … 2^100, values
spread over 2^-100 … 2^100 inside one block, zero blocks, float32-subnormal
blocks, partial blocks, both axes of a matrix and a tuple of axes, every
element format, both scale rules, NaN/Inf blocks.
"""
import zlib

import numpy as np
import pytest

from ada_loss.formats import get_format, mx_scale_exponents, quantize_mx
from scaled_reference import ELEMENTS, reference_mx

F32 = np.float32


def _bits_equal(got, want):
    gn, wn = np.isnan(got), np.isnan(want)
    assert np.array_equal(gn, wn)
    bad = ~gn & (got.view(np.uint32) != want.view(np.uint32))
    assert not bad.any(), (got[bad][:5], want[bad][:5])


def _tensor(seed, shape=(40, 75)):
    """Blocks anywhere in 2^-100..2^100: each row/column offset by its own
    power of two, values spanning 2^-12 of it; plus one row spread over the
    whole 2^-100..2^100, a zero row segment, float32 subnormals."""
    rng = np.random.RandomState(seed)
    r, c = shape
    mant = rng.uniform(1, 2, shape) * np.sign(rng.standard_normal(shape))
    spread = 2.0 ** rng.uniform(-12, 0, shape)
    offset = 2.0 ** rng.randint(-100, 101, (r, 1)) * \
        2.0 ** rng.randint(-4, 5, (1, c))
    x = mant * spread * offset
    x[0] = mant[0] * 2.0 ** rng.uniform(-100, 100, c)
    x[1, :40] = 0.0
    x[1, 5] = -0.0
    x[2] = mant[2] * 2.0 ** rng.uniform(-149, -127, c)     # subnormals
    x[3, :] = mant[3] * 2.0 ** -140                          # subnormal-only
    x[4, :33] = 448.0 * 2.0 ** rng.randint(-5, 5)           # exact ties
    return x.astype(F32)


@pytest.mark.parametrize('element', sorted(ELEMENTS))
@pytest.mark.parametrize('rule', ['up', 'floor'])
def test_quantize_mx_equals_reference(element, rule):
    x = _tensor(zlib.crc32((element + rule).encode()) % 1000)
    for axis, block in ((1, 32), (0, 32), (-1, 16), (0, 7)):
        got, e = quantize_mx(x, element, axis=axis, block_size=block,
                             scale_rounding=rule, return_exponents=True)
        want, we = reference_mx(x, element, axis, block, rule)
        assert got.dtype == F32 and got.shape == x.shape
        _bits_equal(got, want)
        assert np.array_equal(e, we), (axis, block)


@pytest.mark.parametrize('element', sorted(ELEMENTS))
@pytest.mark.parametrize('rule', ['up', 'floor'])
def test_block_aligned_shapes_equal_reference(element, rule):
    # shapes whose blocks need no transpose (whole blocks along the axis,
    # or one block for the whole reduction): the reshaped path
    x = _tensor(zlib.crc32((rule + element).encode()) % 1000, (24, 64))
    x[5, :] = np.nan
    x[6, 40] = np.inf
    for axis, block in ((1, 32), (0, 8), (0, 64), (1, 64), (-1, 16)):
        got = quantize_mx(x, element, axis=axis, block_size=block,
                          scale_rounding=rule)
        want, _ = reference_mx(x, element, axis, block, rule)
        _bits_equal(got, want)
        # the same as the transposing path (taken to return exponents)
        slow, _ = quantize_mx(x, element, axis=axis, block_size=block,
                              scale_rounding=rule, return_exponents=True)
        _bits_equal(got, slow)
    # N·H·W blocks of an NCHW tensor with H·W = 64 and with one block
    rng = np.random.RandomState(2)
    t = (rng.standard_normal((3, 5, 8, 8)) * 2.0 ** rng.randint(
        -30, 30, (3, 5, 8, 1))).astype(F32)
    for shape in ((3, 5, 8, 8), (1, 5, 2, 3)):
        u = np.ascontiguousarray(t[:shape[0], :, :shape[2], :shape[3]])
        got = quantize_mx(u, element, axis=(0, 2, 3), scale_rounding=rule)
        c = u.transpose(1, 0, 2, 3)
        want, _ = reference_mx(c.reshape(5, -1), element, 1, 32, rule)
        _bits_equal(got, want.reshape(c.shape).transpose(1, 0, 2, 3))


def test_aliases_give_the_same_values():
    x = _tensor(3)
    for ours, ml in (('fp8_e4m3', 'float8_e4m3fn'), ('fp4_e2m1',
                                                      'float4_e2m1fn')):
        _bits_equal(quantize_mx(x, ours), quantize_mx(x, ml))


def test_tuple_of_axes_is_the_flattened_axis():
    # blocks along (0, 2, 3) of an NCHW tensor = along the flattened N·H·W
    rng = np.random.RandomState(1)
    x = (rng.standard_normal((3, 5, 4, 6)) * 2.0 ** rng.randint(
        -20, 20, (3, 5, 1, 1))).astype(F32)
    got = quantize_mx(x, 'float8_e5m2', axis=(0, 2, 3))
    flat = x.transpose(1, 0, 2, 3).reshape(5, -1)
    want, _ = reference_mx(flat, 'float8_e5m2', 1, 32, 'up')
    want = want.reshape(5, 3, 4, 6).transpose(1, 0, 2, 3)
    _bits_equal(got, want)


def test_up_never_saturates_floor_does():
    x = F32([[1.0, 1.5, 1.75, 0.1]])
    up = quantize_mx(x, 'float4_e2m1fn')
    fl = quantize_mx(x, 'float4_e2m1fn', scale_rounding='floor')
    # 'up': scale 2^ceil(log2(1.75/6)) = 2^-1, 1.75 -> 3.5 -> 4 · 0.5 = 2
    assert up[0, 2] == 2.0
    # 'floor': scale 2^(0 - 2), 1.75 -> 7 saturates to 6 -> 1.5
    assert fl[0, 2] == 1.5 and fl[0, 1] == 1.5


def test_nan_and_inf_make_their_block_nan():
    x = np.ones((2, 64), F32)
    x[0, 3] = np.nan
    x[1, 40] = -np.inf
    y = quantize_mx(x, 'float8_e4m3fn')
    assert np.isnan(y[0, :32]).all() and (y[0, 32:] == 1).all()
    assert (y[1, :32] == 1).all() and np.isnan(y[1, 32:]).all()


def test_scale_limits():
    # the E8M0 range ends at 2^-127: tiny blocks keep it
    e = mx_scale_exponents(F32([0.0, 2.0 ** -140, 1e-45, 448.0, 449.0,
                                3e38]), 'float8_e4m3fn')
    assert list(e) == [-127, -127, -127, 0, 1, 120]
    e = mx_scale_exponents(F32([3e38]), 'float8_e4m3fn', 'floor')
    assert list(e) == [127 - 8]
    assert get_format('float8_e4m3fn').u_max == 448.0


def test_float16_input_and_bad_arguments():
    h = np.linspace(-3, 3, 64).astype(np.float16)
    _bits_equal(quantize_mx(h, 'float8_e4m3fn'),
                quantize_mx(h.astype(F32), 'float8_e4m3fn'))
    with pytest.raises(ValueError):
        quantize_mx(h, 'float8_e4m3fn', scale_rounding='nearest')
    with pytest.raises(ValueError):
        quantize_mx(h, 'float8_e4m3fn', axis=2)
    with pytest.raises(TypeError):
        quantize_mx(h.astype(np.float64), 'float8_e4m3fn')
