"""``quantize_nvfp4``, ``quantize_blockwise``, the RHT and the counter-based
stochastic rounding, bit for bit against the independent ml_dtypes
references of ``tests/scaled_reference.py`` (block-by-block loops, FP32
scalar arithmetic as TE's reference quantizers, ml_dtypes' E4M3 / E2M1
casts, the Hadamard matrix built entrywise, the hash rewritten on Python
ints; no code shared with ``ada_loss.formats``).

Cases: blocks anywhere in 2^-100 … 2^100, so far below the tensor amax
that the E4M3 block scale underflows (NVFP4's two-level scale only spans
~2^-9 … 448 · 2^…); zeros; float32 subnormals; exact E2M1 ties; partial
blocks and tiles; both axes; NaN/Inf blocks; stochastic rounding
reproducible and unbiased.
"""
import numpy as np
import pytest

from ada_loss.formats import (
    hadamard_matrix, quantize_blockwise, quantize_nvfp4, random_hadamard,
    random_words)
from scaled_reference import (
    reference_blockwise, reference_hadamard, reference_nvfp4,
    reference_rht, reference_words)
from test_mx import _bits_equal, _tensor

F32 = np.float32


def _ties():
    """A matrix whose second block is made of exact E2M1 ties: the global
    amax 2688 gives encode 1, the block amax 6 the scale 1."""
    x = np.zeros((2, 32), F32)
    x[0, :16] = 2688.0
    x[1, 16:] = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75,
                 -1.25, -1.75, -2.5, -3.5, -5, 4.5]
    return x


def _moderate(seed, shape):
    """Rows 2^-8 … 2^8 apart: every block keeps a normal or subnormal
    E4M3 scale."""
    rng = np.random.RandomState(seed)
    return (rng.standard_normal(shape) * 2.0 ** rng.randint(
        -8, 9, (shape[0], 1))).astype(F32)


def _cases():
    yield _moderate(0, (37, 50))
    yield _tensor(1, (40, 75))
    yield _tensor(2, (33, 50)) * F32(2.0 ** -20)
    yield _ties()
    yield np.zeros((5, 20), F32)


@pytest.mark.parametrize('axis', [0, 1])
def test_nvfp4_1d_blocks_equal_reference(axis):
    for x in _cases():
        _bits_equal(quantize_nvfp4(x, axis=axis), reference_nvfp4(x, axis))


def test_nvfp4_tiles_and_other_block_sizes_equal_reference():
    for x in _cases():
        _bits_equal(quantize_nvfp4(x, tile=(16, 16)),
                    reference_nvfp4(x, tile=(16, 16)))
        _bits_equal(quantize_nvfp4(x, axis=(0, 1), tile=(8, 4)),
                    reference_nvfp4(x, tile=(8, 4)))
        _bits_equal(quantize_nvfp4(x, axis=1, block_size=7),
                    reference_nvfp4(x, 1, block=7))


def test_nvfp4_ties_to_even_and_zeros():
    got = quantize_nvfp4(_ties())
    assert got[1, 16:].tolist() == [6, 0, 1, 1, 2, 2, 4, 4, -0.0, -1, -1,
                                    -2, -2, -4, -4, 4]
    z = quantize_nvfp4(np.zeros((3, 17), F32))
    assert not z.any() and np.isfinite(z).all()


def test_nvfp4_blocks_far_below_the_amax_lose_their_scale():
    # a block 2^-20 below the tensor amax: its E4M3 scale underflows to
    # 0 (TE's arithmetic), so it quantizes to zeros, as in the reference
    x = np.ones((1, 32), F32)
    x[0, 16:] = 2.0 ** -20
    got = quantize_nvfp4(x)
    assert (got[0, :16] == 1).all() and not got[0, 16:].any()
    _bits_equal(got, reference_nvfp4(x))


def test_nvfp4_nonfinite_block_is_nan_and_others_as_without_it():
    x = _tensor(3, (8, 40))
    y = x.copy()
    y[2, 17] = np.inf
    y[5, 3] = np.nan
    got = quantize_nvfp4(y)
    _bits_equal(got, reference_nvfp4(y))
    assert np.isnan(got[2, 16:32]).all() and np.isnan(got[5, :16]).all()
    ok = ~np.isnan(got)
    x[2, 16:32] = x[5, :16] = 0    # the other blocks: as without those
    _bits_equal(got[ok], quantize_nvfp4(x)[ok])


def test_nvfp4_scales_are_e4m3_and_axes_tuple():
    x = _tensor(4, (24, 8)).reshape(4, 6, 8)
    got, s, dec = quantize_nvfp4(x, axis=(0, 2), return_scales=True)
    assert s.dtype == F32 and dec.dtype == F32
    import ml_dtypes
    assert np.array_equal(s.astype(ml_dtypes.float8_e4m3fn).astype(F32), s)
    flat = np.moveaxis(x, 1, 0).reshape(6, 32)
    want = reference_nvfp4(flat, 1)
    _bits_equal(np.moveaxis(got, 1, 0).reshape(6, 32), want)


def test_counter_words_equal_reference_and_are_reproducible():
    w = random_words((3, 7), seed=5, step=11)
    assert w.dtype == np.uint32 and w.shape == (3, 7)
    assert w.ravel().tolist() == reference_words(21, 5, 11)
    assert np.array_equal(w, random_words((3, 7), 5, 11))
    assert not np.array_equal(w, random_words((3, 7), 5, 12))
    assert not np.array_equal(w, random_words((3, 7), 6, 11))
    u = random_words((200000,), 0, 0) / 2.0 ** 32
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002


@pytest.mark.parametrize('axis', [0, 1])
def test_nvfp4_stochastic_equals_reference(axis):
    rng = np.random.RandomState(6)
    x = (rng.standard_normal((20, 37)) * 2.0 ** rng.randint(
        -8, 8, (20, 1))).astype(F32)
    x[3, :5] = 0
    got = quantize_nvfp4(x, axis=axis, rounding='stochastic', seed=3,
                         step=9)
    _bits_equal(got, reference_nvfp4(x, axis, sr=(3, 9)))
    again = quantize_nvfp4(x, axis=axis, rounding='stochastic', seed=3,
                           step=9)
    _bits_equal(again, got)
    other = quantize_nvfp4(x, axis=axis, rounding='stochastic', seed=3,
                           step=10)
    assert not np.array_equal(other, got)
    tiled = quantize_nvfp4(x, tile=(16, 16), rounding='stochastic', seed=1,
                           step=2)
    _bits_equal(tiled, reference_nvfp4(x, tile=(16, 16), sr=(1, 2)))


def test_nvfp4_stochastic_rounding_is_unbiased():
    # global amax 2688 and block amax 6: encode 1, scale 1, so the E2M1
    # input is x itself; 8000 rows, each its own draw of one block
    rng = np.random.RandomState(0)
    row = rng.uniform(-6, 6, 16).astype(F32)
    row[0] = 6
    x = np.tile(row, (8001, 1))
    x[-1, 0] = 2688
    x[-1, 1:] = 0
    q = quantize_nvfp4(x, rounding='stochastic', seed=7, step=0)[:-1]
    err = q - row
    se = err.std(axis=0) / np.sqrt(len(err))
    moving = se > 0
    assert moving.sum() >= 14
    assert (np.abs(err.mean(axis=0)) <= 4 * se + 1e-7).all()
    # nearest is biased on the same values (the test can fail)
    qn = quantize_nvfp4(x[:1])[0]
    assert (np.abs(qn - row)[moving] > 4 * se[moving]).any()


def test_hadamard_matrix_equals_reference_and_is_orthogonal():
    t = hadamard_matrix()
    assert np.array_equal(t, reference_hadamard())
    assert np.array_equal(t @ t.T, np.eye(16, dtype=F32))


@pytest.mark.parametrize('axis', [0, 1])
def test_rht_equals_reference_inverse_and_keeps_products(axis):
    rng = np.random.RandomState(axis)
    a = (rng.standard_normal((48, 32)) * 2.0 ** rng.randint(
        -20, 20, (48, 32))).astype(F32)
    got = random_hadamard(a, axis)
    _bits_equal(got, reference_rht(a, axis))
    back = random_hadamard(got, axis, inverse=True)
    assert np.allclose(back, a, rtol=1e-5, atol=np.abs(a).max() * 1e-6)
    b = rng.standard_normal((48, 32)).astype(F32)
    # a GEMM reducing over axis: the transform of both operands cancels
    red = (lambda p, q: p.T @ q) if axis == 0 else (lambda p, q: p @ q.T)
    exact = red(a.astype(np.float64), b.astype(np.float64))
    both = red(got.astype(np.float64),
               random_hadamard(b, axis).astype(np.float64))
    assert np.allclose(both, exact, rtol=1e-5, atol=np.abs(exact).max()
                       * 1e-5)
    with pytest.raises(ValueError):
        random_hadamard(a[:10], 0)


@pytest.mark.parametrize('pow2', [False, True])
def test_blockwise_equals_reference(pow2):
    x = _tensor(7, (40, 300))
    x[5, 140] = np.nan
    for axis in (0, 1):
        _bits_equal(quantize_blockwise(x, axis=axis, pow2=pow2),
                    reference_blockwise(x, axis, pow2=pow2))
    _bits_equal(quantize_blockwise(x, tile=(128, 128), pow2=pow2),
                reference_blockwise(x, tile=(128, 128), pow2=pow2))
    big = _tensor(8, (130, 200))
    _bits_equal(quantize_blockwise(big, tile=(128, 128), pow2=pow2),
                reference_blockwise(big, tile=(128, 128), pow2=pow2))
    _bits_equal(quantize_blockwise(big, axis=1, block_size=32, pow2=pow2),
                reference_blockwise(big, 1, block=32, pow2=pow2))
    z = quantize_blockwise(np.zeros((3, 130), F32))
    assert not z.any()


def test_bad_arguments():
    x = np.ones((4, 4), F32)
    with pytest.raises(ValueError):
        quantize_nvfp4(x, rounding='up')
    with pytest.raises(ValueError):
        quantize_nvfp4(x, axis=0, tile=(16, 16))
    with pytest.raises(TypeError):
        quantize_blockwise(x.astype(np.float64))


def test_e2m1_stochastic_equals_the_general_stochastic_rounding():
    from ada_loss.formats import get_format
    from ada_loss.formats.nvfp4 import e2m1_stochastic
    rng = np.random.RandomState(9)
    y = (rng.uniform(-6, 6, 20000) * 2.0 ** rng.randint(-30, 1, 20000)
         ).astype(F32)
    y[:8] = [0, -0.0, 6, -6, 0.5, 1.75, 5, 3.0]
    words = random_words(y.shape, 4, 2)
    want = get_format('fp4_e2m1').quantize(y, 'stochastic', rng=words)
    _bits_equal(e2m1_stochastic(y, words), want)


@pytest.mark.parametrize('hw', [(4, 4), (4, 8), (3, 5)])
def test_blocks_along_nhw_equal_the_reference_on_the_flattened_matrix(hw):
    # x (N, C, H, W) blocked along (N, H, W) (a convolution's wgrad): by a
    # reshape where H·W holds whole blocks, by a transpose otherwise
    rng = np.random.RandomState(sum(hw))
    x = (rng.standard_normal((3, 5) + hw) * 2.0 ** rng.randint(
        -6, 6, (1, 5, 1, 1))).astype(F32)
    m = np.ascontiguousarray(x.transpose(1, 0, 2, 3)).reshape(5, -1)

    def back(q):
        return q.reshape((5, 3) + hw).transpose(1, 0, 2, 3)
    _bits_equal(quantize_nvfp4(x, axis=(0, 2, 3)),
                back(reference_nvfp4(m, 1)))
    _bits_equal(quantize_nvfp4(x, axis=(0, 2, 3), rounding='stochastic',
                               seed=1, step=1),
                back(reference_nvfp4(m, 1, words=np.ascontiguousarray(
                    random_words(x.shape, 1, 1).astype(np.uint64)
                    .transpose(1, 0, 2, 3)).reshape(5, -1))))
    _bits_equal(quantize_blockwise(x, axis=(0, 2, 3), block_size=32),
                back(reference_blockwise(m, 1, block=32)))
