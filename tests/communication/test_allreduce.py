"""APS (Algorithm 1, Han et al.) and the CPD-style low-precision sums, NumPy
only: exactness in FP32, no overflow by construction, the ring and
hierarchical orders, Kahan, Eq. 5, the cost model and bad input."""
import numpy
import pytest

from ada_loss.communication import (
    CommPolicy, StepReduction, allreduce_low_precision,
    average_round_off_error, find_max_exp, hierarchical_steps,
    low_precision_sum, plain_mean, ring_steps)
from ada_loss.communication import exponents as X
from ada_loss.communication.allreduce import scale_pow2
from ada_loss.communication.cost import message_bytes
from ada_loss.communication.roundoff import exact_mean
from ada_loss.formats import get_format

F32 = numpy.float32


def grads(n_workers, shape=(257,), scale=1.0, seed=0, spread=0.0):
    rng = numpy.random.RandomState(seed)
    return [(rng.randn(*shape) * scale *
             2.0 ** rng.uniform(-spread, spread, shape)).astype(F32)
            for _ in range(n_workers)]


def sequential(values, fmt):
    """Reference: rank-order accumulation, element by element (slow)."""
    f = get_format(fmt)
    out = numpy.empty(values.shape[1], F32)
    for e in range(values.shape[1]):
        s = values[0, e]
        for w in range(1, values.shape[0]):
            s = f.quantize(numpy.array([s + values[w, e]], F32))[0]
        out[e] = s
    return out


# -- FP32: APS changes nothing ------------------------------------------------
@pytest.mark.parametrize('n', [2, 3, 8, 16])
@pytest.mark.parametrize('order,k', [('ring', None), ('hierarchical', 2)])
def test_fp32_aps_bit_identical_to_plain_mean(n, order, k):
    """The FP32 format with APS on: shifts by powers of two are exact, so the
    mean is bit-identical to FP32 averaging in the same order, for gradients
    from 1e-30 to 1e30; for 2 workers to (g0 + g1) × 0.5 (ChainerMN)."""
    if k is not None and n % k:
        k = 1
    for scale in (1e-30, 1e-3, 1.0, 1e30):
        g = grads(n, (3, 5, 7), scale, seed=n, spread=20)
        aps = allreduce_low_precision(g, 'float32', aps=True, order=order,
                                      group_size=k)
        plain = plain_mean(g, order=order, group_size=k)
        assert aps.dtype == F32 and aps.shape == (3, 5, 7)
        assert numpy.array_equal(aps, plain)
        if n == 2:
            assert numpy.array_equal(aps, (g[0] + g[1]) * F32(0.5))


# -- no overflow by construction ----------------------------------------------
@pytest.mark.parametrize('fmt', ['e5m2', 'e4m3', 'e3m0', 'fp8_e4m3'])
@pytest.mark.parametrize('n', [2, 8, 64])
def test_aps_never_overflows(fmt, n):
    """Random gradients of any magnitude (1e-35 .. 1e35 and up to FP32's
    largest value, wide spread within a
    layer) and N workers, ring and hierarchical, with and without Kahan:
    with APS the low-precision sum is always finite (for 8 workers and
    formats with mantissa bits the mean is also within half the largest
    input of the exact one)."""
    f = get_format(fmt)
    for exp10 in list(range(-35, 36, 10)) + ["max"]:
        if exp10 == 'max':    # the largest finite FP32 magnitudes
            g = [numpy.finfo(F32).max * numpy.sign(x) / F32(4)
                 for x in grads(n, (300,), seed=n)]
            g[0][0] = numpy.finfo(F32).max
        else:
            g = grads(n, (300,), 10.0 ** exp10, seed=exp10 + 100, spread=3)
        exact = exact_mean(g)
        for order, k in (('ring', None), ('hierarchical', 2)):
            for kahan in (False, True):
                m = allreduce_low_precision(g, fmt, True, order, k, kahan)
                assert numpy.isfinite(m).all(), (exp10, order, kahan)
                if f.man_bits >= 2 and n <= 8:   # (3, 0): powers of two
                    top = max(numpy.abs(x).max() for x in g)
                    err = numpy.abs(m - exact).max() / top
                    assert err < 0.5, (exp10, err)


def test_without_aps_overflows_and_underflows():
    """Without APS the plain cast overflows for large gradients (Inf/NaN in
    the mean) and flushes small ones to zero; APS keeps both."""
    n = 8
    big = grads(n, (500,), 1e5)          # e5m2 max 57344
    small = grads(n, (500,), 1e-7)       # e5m2 min subnormal 2^-16 ≈ 1.5e-5
    for fmt in ('e5m2', 'e4m3', 'e3m0'):
        assert not numpy.isfinite(
            allreduce_low_precision(big, fmt, aps=False)).all()
        assert (allreduce_low_precision(small, fmt, aps=False) == 0).all()
        for g in (big, small):
            m = allreduce_low_precision(g, fmt, aps=True)
            assert numpy.isfinite(m).all() and (m != 0).mean() > 0.5
    # and the error APS leaves is the format's, not the range's
    e = average_round_off_error(exact_mean(small),
                                allreduce_low_precision(small, 'e4m3'))
    assert e < 0.5


def test_find_max_exp_exact():
    """⌈log2 |x · N|⌉ over the non-zero elements, exact at powers of two;
    zeros ignored; every finite FP32 exponent fits the one-byte code, and
    the codes order like the exponents (so MAX of codes = MAX of exps)."""
    for k in list(range(-149, 128, 7)) + [127]:
        for n in (1, 2, 3, 256):
            x = numpy.array([0, 2.0 ** k, -2.0 ** (k - 1)], F32)
            want = k + int(numpy.ceil(numpy.log2(n)))
            assert find_max_exp(x, n) == want
            if -126 <= k < 127:
                y = x * F32(1.25)
                assert find_max_exp(y, n) == int(numpy.ceil(
                    numpy.log2(1.25 * 2.0 ** k * n)))
            code = X.code_of_max(numpy.abs(x).max(), n)
            assert 1 <= code <= 254
            if want >= X.exponent_range(n)[0]:
                assert X.decode(code, n) == want
    top = numpy.finfo(F32).max
    assert X.decode(X.code_of_max(top, 256), 256) == 136
    assert find_max_exp(numpy.zeros(4, F32), 8) is None
    assert X.code_of_max(0.0, 8) == X.ZERO
    assert X.code_of_max(numpy.inf, 8) == X.NONFINITE
    assert X.code_of_max(1e-3, 8) < X.code_of_max(1e-2, 8)


def test_nonfinite_layer_becomes_nan():
    g = grads(4, (10,))
    g[2][3] = numpy.inf
    m = allreduce_low_precision(g, 'e5m2')
    assert numpy.isnan(m).all()


# -- order ---------------------------------------------------------------------
def test_orders_against_elementwise_reference():
    """Hierarchical with k = N is rank-order accumulation; the ring adds
    chunk j's values starting at worker j+1 and ending with worker j."""
    f = get_format('e4m3')
    rng = numpy.random.RandomState(1)
    n, size = 8, 19
    vals = f.quantize((rng.rand(n, size) * 4).astype(F32))
    assert numpy.array_equal(
        low_precision_sum(vals, f, 'hierarchical', n),
        sequential(vals, f))
    ring = low_precision_sum(vals, f, 'ring')
    for e in range(size):
        j = (e * n) // size if False else numpy.searchsorted(
            (numpy.arange(1, n) * size) // n, e, side='right')
        rolled = numpy.roll(vals[:, e:e + 1], -(j + 1), axis=0)
        assert ring[e] == sequential(rolled, f)[0]
    # k = 1: the plain ring; groups of 2: pairs first
    assert numpy.array_equal(low_precision_sum(vals, f, 'hierarchical', 1),
                             ring)
    pairs = f.quantize(vals[0::2] + vals[1::2])
    assert numpy.array_equal(low_precision_sum(vals, f, 'hierarchical', 2),
                             low_precision_sum(pairs, f, 'ring'))


# -- Kahan -----------------------------------------------------------------------
@pytest.mark.parametrize('fmt', ['e5m2', 'e4m3'])
def test_kahan_reduces_round_off(fmt):
    """256 workers with same-signed gradients: the running sum soon dwarfs
    each new term (large meets small, §4.2), and naive e5m2/e4m3 addition
    drops them; Kahan summation in the same format cuts Eq. 5's error."""
    n = 256
    g = [numpy.abs(x) + F32(0.1) for x in grads(n, (2000,), 1.0, seed=3)]
    exact = exact_mean(g)
    for order, k in (('ring', None), ('hierarchical', 16)):
        naive = average_round_off_error(
            exact, allreduce_low_precision(g, fmt, order=order, group_size=k))
        kahan = average_round_off_error(
            exact, allreduce_low_precision(g, fmt, order=order, group_size=k,
                                           kahan=True))
        assert kahan < 0.5 * naive, (order, naive, kahan)
    # and the hierarchical order already helps without Kahan (Table 9)
    ring = average_round_off_error(exact, allreduce_low_precision(g, fmt))
    hier = average_round_off_error(exact, allreduce_low_precision(
        g, fmt, order='hierarchical', group_size=16))
    assert hier < ring


def test_eq5():
    h = numpy.array([1.0, -2.0, 0.0, 4.0])
    low = numpy.array([1.5, -2.0, 7.0, 3.0])
    assert average_round_off_error(h, low) == pytest.approx(
        (0.5 + 0 + 0.25) / 3)


# -- policy: FP32 layers, hybrid schedule ------------------------------------
def test_fp32_layers_and_hybrid_schedule():
    names = ['/predictor/conv1/W', '/predictor/fc/W', '/predictor/fc/b']
    pol = CommPolicy('e3m0', fp32_layers=['*/fc/*'], fp32_epochs=2)
    assert pol.low_precision_mask(names, epoch=1.5) == [False] * 3
    assert pol.low_precision_mask(names, epoch=2) == [True, False, False]
    g = grads(4, (40,), 1e-2, seed=5)
    bufs = numpy.stack(g)
    plan = StepReduction(pol, names, [20, 15, 5], 4, epoch=3)
    m = plan.mean_of_stacked(bufs)
    fp32 = plain_mean(g)
    assert numpy.array_equal(m[20:], plain_mean([x[20:] for x in g]))
    assert not numpy.array_equal(m[:20], fp32[:20])
    assert numpy.array_equal(
        StepReduction(pol, names, [20, 15, 5], 4, epoch=0).mean_of_stacked(
            bufs), fp32)                                  # hybrid: FP32 first
    # one exponent byte per low-precision layer
    assert plan.local_max_exps(bufs[0]).dtype == numpy.uint8
    assert plan.local_max_exps(bufs[0]).shape == (1,)


def test_cost_model():
    assert ring_steps(256) == 510 and ring_steps(8) == 14
    assert hierarchical_steps(256, 16) == 4 * 15 + 2 * 15
    assert message_bytes([100, 10], 'e5m2') == (2, 110)
    assert message_bytes([100, 10], 'e3m0', aps=False) == (0, 55)
    assert message_bytes([100, 10], 'e4m3', fp32_mask=[False, True]) == \
        (1, 140)
    # what the wire sends: a 6-bit code takes a byte (not 6/8), FP32 with
    # APS sends its exponent bytes (the MPI counts: test_wire.py)
    assert message_bytes([1000], 'fp6_e3m2') == (1, 1000)
    assert message_bytes([1000], 'fp6_e2m3', aps=False) == (0, 1000)
    assert message_bytes([1000, 3], 'float32') == (2, 4012)
    assert message_bytes([1000], 'bfloat16', aps=False) == (0, 2000)


def test_break_even_bandwidth():
    """The ring's byte saving over FP32 (2(p − 1)/p of the messages,
    exponents included) per second of extra local time."""
    from ada_loss.communication.cost import (break_even_bandwidth,
                                             ring_bytes_saved)
    # FP32 8000 bytes; 8-bit 2000 + 2 exponent bytes; p = 4: × 1.5
    assert ring_bytes_saved([1000, 1000], 'fp8_e5m2', 4) == 1.5 * 5998
    assert ring_bytes_saved([1000, 1000], 'e3m0', 4, aps=False) == \
        1.5 * 7000
    assert break_even_bandwidth([1000, 1000], 'fp8_e5m2', 4, 2.0, 0.5) == \
        1.5 * 5998 / 1.5
    assert break_even_bandwidth([1000], 'fp8_e5m2', 2, 0.1, 0.2) == \
        float('inf')


# -- bad input -------------------------------------------------------------------
def test_bad_input_is_a_clear_value_error():
    g = grads(6, (4,))
    with pytest.raises(ValueError, match='unknown floating-point format'):
        allreduce_low_precision(g, 'e9m9x')
    with pytest.raises(ValueError, match='impossible format'):
        allreduce_low_precision(g, 'e9m2')
    with pytest.raises(ValueError, match='cannot be split into groups of 4'):
        allreduce_low_precision(g, 'e5m2', order='hierarchical',
                                group_size=4)
    with pytest.raises(ValueError, match='needs group_size'):
        allreduce_low_precision(g, 'e5m2', order='hierarchical')
    with pytest.raises(ValueError, match="only meaningful with order"):
        allreduce_low_precision(g, 'e5m2', group_size=2)
    with pytest.raises(ValueError, match='unknown reduction order'):
        allreduce_low_precision(g, 'e5m2', order='tree')
    with pytest.raises(ValueError, match='one shape'):
        allreduce_low_precision(g[:2] + [numpy.zeros(5, F32)], 'e5m2')
    with pytest.raises(ValueError, match='empty'):
        allreduce_low_precision([], 'e5m2')
    with pytest.raises(ValueError, match='cannot be split into groups'):
        CommPolicy('e4m3', order='hierarchical', group_size=4).check(6)


def test_vectorized_exponents_match_per_layer():
    """The one-``reduceat`` exponent codes equal FINDMAXEXP per segment,
    for segments with gaps (FP32 layers between them), empty ones and NaN."""
    rng = numpy.random.RandomState(1)
    for _ in range(100):
        n_layers = rng.randint(1, 8)
        sizes = rng.randint(0, 5, n_layers)
        offs = numpy.concatenate([[0], numpy.cumsum(sizes)])
        n = int(offs[-1])
        buf = (rng.randn(3, n) * 10.0 ** rng.randint(-5, 5, n)).astype(F32)
        if n and rng.rand() < 0.3:
            buf[rng.randint(3), rng.randint(n)] = numpy.nan
        segs = [(int(offs[i]), int(sizes[i])) for i in range(n_layers)
                if rng.rand() < 0.7]
        got = X.stacked_layer_max_exps(buf, segs, 8)
        for r in range(3):
            want = [X.code_of_max(numpy.abs(buf[r, o:o + s]).max()
                                  if s else 0, 8) for o, s in segs]
            assert list(got[r]) == want
            assert list(X.layer_max_exps(buf[r], segs, 8)) == want
    # the compiled max on the bits: −Inf, a negative NaN, float32
    # subnormals and −0 beside normals
    buf = numpy.array([1.0, -numpy.inf, 2.0, -numpy.nan, 0.5, -0.0,
                       2.0 ** -140, -2.0 ** -148, -3.0, 0.0], F32)
    segs = [(0, 2), (2, 2), (4, 2), (6, 2), (8, 2), (9, 1)]
    got = X.layer_max_exps(buf, segs, 8)
    assert list(got) == [X.NONFINITE, X.NONFINITE, X.code_of_max(0.5, 8),
                         X.code_of_max(2.0 ** -148, 8),
                         X.code_of_max(3.0, 8), X.ZERO]


def test_scale_pow2_is_ldexp_bit_for_bit():
    """The shift/unshift by powers of two (a multiplication where the
    exponents allow) equals ldexp on normals, subnormals, overflow, ±0,
    Inf, NaN; exponents out of float32's normal range take ldexp."""
    rng = numpy.random.RandomState(0)
    x = (rng.standard_normal(3000) *
         2.0 ** rng.randint(-149, 128, 3000)).astype(numpy.float32)
    x[:6] = [0.0, -0.0, numpy.inf, -numpy.inf, numpy.nan, 1.5e-45]
    for lo, hi in ((-126, 128), (-140, 140)):
        exps = rng.randint(lo, hi, x.size).astype(numpy.int32)
        with numpy.errstate(over='ignore'):
            got = scale_pow2(x, exps)
            want = numpy.ldexp(x, exps).astype(numpy.float32)
        assert got.dtype == numpy.float32
        assert numpy.array_equal(got.view(numpy.uint32),
                                 want.view(numpy.uint32))


def test_mean_rounds_once_where_it_is_subnormal():
    """× 1/p and the unshift fold into one rounding (issue 34): with p = 3
    and means that are float32 subnormals, ``finish`` (per element),
    ``finish_range`` (per layer) and the wire's fused decode kernel all
    give ``round(sum · fl32(1/3) · 2^−shift)`` computed exactly; rounding
    twice (× 1/p in float32, then the unshift) differs on some of them."""
    from ada_loss.communication import kernels
    rng = numpy.random.RandomState(0)
    n = 4000
    plan = StepReduction(CommPolicy('float32'), ['/a/W', '/b/W'],
                         [n // 2, n // 2], 3)
    total = (1 + rng.random_sample(n)).astype(numpy.float32)
    layer_shift = numpy.array([140, 135], numpy.int32)
    shift = numpy.repeat(layer_shift, [n // 2, n // 2])
    inv_p = numpy.float32(1.0 / 3)
    exact = (total.astype(numpy.float64) * float(inv_p) *
             numpy.ldexp(1.0, -shift)).astype(numpy.float32)
    twice = numpy.ldexp(total * inv_p, -shift).astype(numpy.float32)
    assert (exact != twice).any()
    assert numpy.array_equal(plan.finish(total.copy(), shift), exact)
    bad = numpy.zeros(2, bool)
    assert numpy.array_equal(
        plan.finish_range(total.copy(), 0, n, layer_shift, bad), exact)
    # the kernel: codes of float32 values are not a fast format; decode a
    # byte table holding the totals' values instead (each code one total)
    values = total[:256].copy()
    codes = numpy.arange(n, dtype=numpy.int64) % 256
    out = numpy.empty(n, numpy.float32)
    factor = numpy.ldexp(1.0, -layer_shift)
    kernels.decode(codes.astype(numpy.uint8), 0, n, values, False, True,
                   1.0 / 3, plan.offsets, factor, bad, out)
    want = (values[codes].astype(numpy.float64) * float(inv_p) *
            numpy.ldexp(1.0, -shift)).astype(numpy.float32)
    assert numpy.array_equal(out, want)
