"""ada_loss.formats.exact on CuPy: float32 products and ldexp whose results
are subnormal (where the GPU's float32 arithmetic flushed them to zero, issue
35) give NumPy's bits; normal, overflowing, zero, NaN and Inf results too.
Skipped without a GPU."""
import numpy as np

from ada_loss.formats import exact

from gpu_helpers import requires_gpu, to_cpu, to_gpu

pytestmark = requires_gpu


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def test_multiply_equals_numpy_through_the_subnormal_range():
    rng = np.random.RandomState(0)
    n = 200000
    # magnitudes from 2^-160 to 2^40 as products of two float32 normals
    a = (rng.standard_normal(n) * 2.0 ** rng.randint(-80, 20, n)).astype(
        np.float32)
    b = (rng.standard_normal(n) * 2.0 ** rng.randint(-80, 20, n)).astype(
        np.float32)
    special = np.array([0, -0.0, np.inf, -np.inf, np.nan, 3e38, 1e-30,
                        1.5 * 2 ** -75, 2 ** -75, 1e-40, -3e-39, 2 ** -149,
                        2 ** 126, 2 ** 100], np.float32)
    a = np.concatenate([a, special, special[::-1]])
    b = np.concatenate([b, special[::-1], special])
    with np.errstate(all='ignore'):
        want = a * b
    got = to_cpu(exact.multiply(to_gpu(a), to_gpu(b)))
    sub = (want != 0) & (np.abs(want) < 2 ** -126)
    assert sub.sum() > 1000          # the range the GPU used to flush
    nan = np.isnan(want)
    assert np.array_equal(nan, np.isnan(got))
    assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan])
    # a scalar operand
    got = to_cpu(exact.multiply(to_gpu(a[:1000]), np.float32(2 ** -100)))
    with np.errstate(all='ignore'):
        want = a[:1000] * np.float32(2 ** -100)
    ok = ~np.isnan(want)
    assert np.array_equal(_bits(got)[ok], _bits(want)[ok])


def test_ldexp_equals_numpy_through_the_subnormal_range():
    rng = np.random.RandomState(1)
    n = 100000
    q = (rng.standard_normal(n) * 4).astype(np.float32)
    e = rng.randint(-160, 130, n).astype(np.int32)
    with np.errstate(all='ignore'):
        want = np.ldexp(q, e)
    got = to_cpu(exact.ldexp(to_gpu(q), to_gpu(e)))
    assert ((want != 0) & (np.abs(want) < 2 ** -126)).sum() > 1000
    assert np.array_equal(_bits(got), _bits(want))


def test_subnormal_operands_divide_max_and_zero_equal_numpy():
    rng = np.random.RandomState(2)
    n = 100000
    # operands in float32's subnormal range and around it
    a = (rng.standard_normal(n) * 2.0 ** rng.randint(-150, -110, n)).astype(
        np.float32)
    b = (rng.standard_normal(n) * 2.0 ** rng.randint(-10, 130, n)).astype(
        np.float32)
    e = rng.randint(0, 160, n).astype(np.int32)
    assert (np.abs(a) < 2 ** -126).sum() > 10000
    with np.errstate(all='ignore'):
        cases = [(exact.multiply(to_gpu(a), to_gpu(b)), a * b),
                 (exact.divide(to_gpu(b), to_gpu(a)), b / a),
                 (exact.divide(np.float32(1), to_gpu(b)), np.float32(1) / b),
                 (exact.ldexp(to_gpu(a), to_gpu(e)), np.ldexp(a, e))]
    for got, want in cases:
        got = to_cpu(got)
        ok = ~np.isnan(want)
        assert np.array_equal(np.isnan(got), ~ok)
        assert np.array_equal(_bits(got)[ok], _bits(want)[ok])
    blocks = a.reshape(-1, 16)
    got = to_cpu(exact.abs_max_bits(to_gpu(blocks), -1))
    assert np.array_equal(_bits(got), _bits(np.abs(blocks).max(
        -1, keepdims=True)))
    z = np.array([0, -0.0, 2 ** -149, -1e-40, 1], np.float32)
    assert to_cpu(exact.is_zero(to_gpu(z))).tolist() == [True, True, False,
                                                         False, False]
