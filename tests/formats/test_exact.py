"""ada_loss.formats.exact on NumPy: what plain NumPy float32 arithmetic
gives, also for inputs that are not float32 arrays (float16 and float64
values, NumPy and Python scalars, a reduction over all axes) — found in
review; the CuPy side is tests/formats/test_exact_gpu.py."""
import numpy as np

from ada_loss.formats import exact

F32 = np.float32


def test_ldexp_of_float16_is_float32_arithmetic():
    h = np.array([1.0, 2.0 ** -20, 60000.0], np.float16)
    want = np.ldexp(h.astype(F32), 20)        # [2^20, 1, 6.29e10]
    got = exact.ldexp(h, 20)
    assert np.array_equal(got, want), got
    got = exact.ldexp(h, -10)       # 2^-30: kept (float16 would lose it)
    assert np.array_equal(got, np.ldexp(h.astype(F32), -10)), got


def test_ldexp_of_a_numpy_scalar_stays_on_the_host():
    assert exact.ldexp(F32(3), 2) == F32(12)
    assert exact.ldexp(3.0, 2) == F32(12)
    assert exact.multiply([1.0, 2.0], F32(3)).tolist() == [3.0, 6.0]


def test_abs_max_bits_of_float16_and_float64():
    for dt in (np.float16, np.float64):
        a = np.array([[1, -3]], dt)
        got = exact.abs_max_bits(a, -1)
        assert got.shape == (1, 1) and got[0, 0] == 3, (dt, got)


def test_abs_max_bits_without_keepdims_over_all_axes_is_0d():
    got = exact.abs_max_bits(np.array([[1, -3]], F32), None, keepdims=False)
    assert np.shape(got) == () and got == 3


def test_is_zero_of_float16_and_float64():
    for dt in (np.float16, np.float64):
        a = np.array([0, 1e-7], dt)
        got = exact.is_zero(a)
        assert got.tolist() == [True, False], (dt, got)


def test_float32_results_equal_numpy_bit_for_bit():
    rng = np.random.RandomState(0)
    a = (rng.standard_normal(5000) * 2.0 ** rng.randint(-150, 60, 5000)
         ).astype(F32)
    b = (rng.standard_normal(5000) * 2.0 ** rng.randint(-60, 60, 5000)
         ).astype(F32)
    e = rng.randint(-40, 40, 5000).astype(np.int32)
    with np.errstate(all='ignore'):
        for got, want in ((exact.multiply(a, b), a * b),
                          (exact.divide(a, b), a / b),
                          (exact.ldexp(a, e), np.ldexp(a, e))):
            assert got.dtype == F32
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
