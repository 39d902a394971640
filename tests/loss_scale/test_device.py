"""The loss-scale math on the GPU (ada_loss.loss_scale.device) against the
NumPy path: the fused statistics kernel, β of Algorithm 4 + §3.2.3 for every
bound, the cap, Algorithm 5 and the power-of-two rescaling, on the GEMM
shapes of ResNet-50 and SSD512 and on zeros, Inf, NaN and subnormal-heavy
gradients."""
import math

import numpy
import pytest

from ada_loss.loss_scale import common_scale, gemm_loss_scale
from ada_loss.loss_scale.gemm import grad_input_gain, round_down_pow2

from gpu_helpers import requires_gpu, to_cpu, to_gpu

pytestmark = requires_gpu

# (W shape, gradient-at-output shape) of GEMM layers: ResNet-50 at batch 64
# (conv1, a bottleneck's 1x1/3x3/1x1, a stride-2 projection, fc) and SSD512
# at batch 8 (conv4_3, fc7, an extra layer, a loc head, a conf head).
SHAPES = [
    ((64, 3, 7, 7), (64, 64, 112, 112)),
    ((64, 256, 1, 1), (64, 64, 56, 56)),
    ((64, 64, 3, 3), (64, 64, 56, 56)),
    ((256, 64, 1, 1), (64, 256, 56, 56)),
    ((512, 256, 1, 1), (64, 512, 28, 28)),
    ((512, 512, 3, 3), (64, 512, 7, 7)),
    ((1000, 2048), (64, 1000)),
    ((512, 512, 3, 3), (8, 512, 64, 64)),
    ((1024, 1024, 1, 1), (8, 1024, 32, 32)),
    ((256, 128, 3, 3), (8, 256, 4, 4)),
    ((16, 512, 3, 3), (8, 16, 64, 64)),
    ((84, 1024, 3, 3), (8, 84, 32, 32)),
]

AXES = {2: (0,), 4: (0, 2, 3)}


def _data(shape, dtype, scale, seed):
    rng = numpy.random.RandomState(seed)
    return (rng.standard_normal(shape) * scale).astype(dtype)


def _device():
    from ada_loss.loss_scale import device
    return device


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
@pytest.mark.parametrize('shapes', SHAPES,
                         ids=lambda s: 'x'.join(map(str, s[1])))
def test_moments_and_beta_equal_numpy(dtype, shapes):
    d = _device()
    w_shape, g_shape = shapes
    W = _data(w_shape, dtype, 0.05, 1)
    # gradients small enough that β > 1 and the bounds matter
    g = _data(g_shape, dtype, 2.0 ** -14, 2)
    for a in (W, g):
        m = to_cpu(d.moments(to_gpu(a)))
        wide = a.astype(numpy.float64)
        assert m[1] == numpy.abs(wide).max()           # exact
        assert m[0] == pytest.approx(numpy.mean(wide * wide), rel=1e-12)
    axes = AXES[W.ndim]
    gain = grad_input_gain(W, axes)
    ws = to_cpu(d.weight_statistics(to_gpu(W), axes))
    wide = W.astype(numpy.float64)
    assert ws[0] == pytest.approx(numpy.mean(wide * wide), rel=1e-12)
    assert ws[1] == numpy.abs(wide).max()
    assert ws[2] == pytest.approx(gain, rel=1e-14)
    for bound in ('output', 'product', 'fan_in'):
        for fmt in ('float16', 'fp8_e5m2'):
            host = gemm_loss_scale(W, g, 1e-3, fmt, bound=bound, gain=gain)
            dev = d.gemm_loss_scale(to_gpu(W), to_gpu(g), 1e-3, fmt,
                                    bound=bound, axes=axes)
            assert dev.shape == () and dev.dtype == numpy.float64
            assert float(dev) == host, (bound, fmt)


@pytest.mark.parametrize('case', ['zeros', 'inf', 'nan', 'subnormal',
                                  'huge', 'empty'])
@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
def test_edge_cases_equal_numpy(case, dtype):
    d = _device()
    W = _data((64, 32, 3, 3), dtype, 0.05, 3)
    g = _data((16, 64, 8, 8), dtype, 2.0 ** -10, 4)
    if case == 'zeros':
        g[...] = 0
    elif case == 'inf':
        g[1, 2, 3, 4] = numpy.inf
    elif case == 'nan':
        g[0, 0, 0, 0] = numpy.nan
    elif case == 'subnormal':
        # FP16 subnormals only (2^-24 .. 2^-15), as deep gradients underflow
        rng = numpy.random.RandomState(5)
        g = (rng.randint(-1023, 1024, g.shape) * 2.0 ** -24).astype(dtype)
    elif case == 'huge':
        g = _data(g.shape, dtype, 1e3, 6)
    elif case == 'empty':
        g = numpy.zeros((0, 64, 8, 8), dtype)
    m = to_cpu(d.moments(to_gpu(g)))
    if g.size:
        wide = g.astype(numpy.float64)
        peak = numpy.abs(wide).max()
        assert (m[1] == peak) or (numpy.isnan(m[1]) and numpy.isnan(peak))
        ref = numpy.mean(wide * wide)
        if numpy.isfinite(ref):
            assert m[0] == pytest.approx(ref, rel=1e-12)
        else:
            assert (m[0] == ref) or (numpy.isnan(m[0]) and numpy.isnan(ref))
    else:
        assert list(m) == [0.0, 0.0]
    gain = grad_input_gain(W, (0, 2, 3))
    for bound in ('output', 'product', 'fan_in'):
        host = gemm_loss_scale(W, g, 1e-3, 'float16', bound=bound,
                               gain=gain, max_scale=2.0 ** 20)
        dev = d.gemm_loss_scale(to_gpu(W), to_gpu(g), 1e-3, 'float16',
                                bound=bound, axes=(0, 2, 3),
                                max_scale=2.0 ** 20)
        assert float(dev) == host, (case, bound)


def test_cap_accum_equals_host():
    d = _device()
    for alpha in (1.0, 2.0 ** 10, 2.0 ** 23, 2.0 ** 30):
        for beta in (1.0, 2.0 ** 5, 2.0 ** 16):
            cap = 2.0 ** 24
            host = beta if alpha * beta <= cap else round_down_pow2(
                cap / alpha)
            assert float(d.cap_accum(d.scalar(beta), d.scalar(alpha),
                                     cap)) == host


def test_common_scale_equals_algorithm5():
    d = _device()
    rng = numpy.random.RandomState(7)
    u_max = 65504.0
    cases = [([8.0, 8.0], [1e9, 1.0]),            # equal scales: no search
             ([1.0, 2.0 ** 10], [1.0, 1.0]),
             ([2.0 ** 10, 2.0, 2.0 ** 5], [100.0, 3e4, 1.0]),
             ([2.0 ** 10, 1.0], [6e4, 6e4]),       # below the smallest
             ([4.0, 1.0], [numpy.inf, 1.0]),       # non-finite: smallest
             ([4.0, 1.0], [numpy.nan, 1.0])]
    for _ in range(50):
        k = rng.randint(2, 9)
        cases.append(([2.0 ** int(e) for e in rng.randint(-5, 20, k)],
                      list(10.0 ** rng.uniform(-6, 5, k))))
    for scales, peaks in cases:
        host = common_scale(scales, lambda i: peaks[i], u_max)
        dev, ratios = d.common_scale([d.scalar(s) for s in scales],
                                     [d.scalar(p) for p in peaks], u_max)
        assert float(dev) == host, (scales, peaks)
        assert d.to_floats(ratios) == [host / s for s in scales]


@pytest.mark.parametrize('dtype', [numpy.float16, numpy.float32])
def test_rescale_equals_numpy_path(dtype):
    d = _device()
    rng = numpy.random.RandomState(8)
    x = (rng.standard_normal(4096) * 2.0 ** rng.uniform(-30, 15, 4096)
         ).astype(dtype)
    x[:4] = [0.0, -0.0, numpy.inf, numpy.nan]
    bits = numpy.uint16 if dtype == numpy.float16 else numpy.uint32
    y = (rng.standard_normal(4096) * 2.0 ** rng.uniform(-30, 15, 4096)
         ).astype(dtype)

    def exact(a, r):
        # the exact product (float64 holds it), rounded once
        return (a.astype(numpy.float64) * r).astype(dtype)

    def same(got, ref):
        # equal bits, NaN payloads aside (a GPU writes its canonical NaN)
        n = numpy.isnan(ref)
        return numpy.array_equal(numpy.isnan(got), n) and \
            numpy.array_equal(got[~n].view(bits), ref[~n].view(bits))
    with numpy.errstate(over='ignore', invalid='ignore'):
        # (2^-160, 2^130, 2^140: beyond float32's range, the product exact
        # as on the host, issue 50 item 9)
        for e in (-160, -30, -8, -1, 0, 3, 20, 130, 140):
            r = 2.0 ** e
            ref = exact(x, r)
            if -126 <= e <= 127:
                assert same(ref, (x.astype(numpy.float32) * numpy.float32(r)
                                  ).astype(dtype))
            got = to_cpu(d.rescale(to_gpu(x), d.scalar(r)))
            assert got.dtype == dtype and same(got, ref), e
            # fused with the addition of a second rescaled gradient, as
            # rescaling both and F.add (x + y in the dtype) would give
            r2 = 2.0 ** (3 - e)
            ref2 = (ref + exact(y, r2)).astype(dtype)
            got2 = to_cpu(d.rescale_add(to_gpu(x), d.scalar(r), to_gpu(y),
                                        r2))
            assert same(got2, ref2), e


def test_to_floats_mixes_host_and_device():
    d = _device()
    vals = d.to_floats([1.0, d.scalar(2.0 ** 40), 3, d.scalar(0.5)])
    assert vals == [1.0, 2.0 ** 40, 3.0, 0.5]
    assert all(isinstance(v, float) for v in vals)
    assert math.isinf(d.to_floats([d.scalar(numpy.inf)])[0])


def test_weight_statistics_of_many_layers_equal_one_at_a_time():
    """All of a model's weight statistics in one launch per dtype (issue 35
    item 1) give the bits of one launch per layer: the SHAPES above in both
    dtypes interleaved (two groups, results back in the callers' order),
    an empty W, a non-contiguous W, Inf and NaN in one layer each."""
    import cupy
    d = _device()
    weights = []
    for i, (w_shape, _) in enumerate(SHAPES):
        dtype = (numpy.float16, numpy.float32)[i % 2]
        W = to_gpu(_data(w_shape, dtype, 0.05, 10 + i))
        weights.append((W, AXES[W.ndim]))
    weights.append((cupy.zeros((0, 3), cupy.float32), (0,)))
    weights.append((to_gpu(_data((40, 24), numpy.float32, 1.0, 3)).T, (0,)))
    inf = to_gpu(_data((8, 5, 3, 3), numpy.float16, 1.0, 4))
    inf[3, 1, 0, 2] = numpy.inf
    nan = to_gpu(_data((7, 9), numpy.float32, 1.0, 5))
    nan[2, 4] = numpy.nan
    weights += [(inf, (0, 2, 3)), (nan, (0,))]
    many = d.weight_statistics_many(weights)
    assert len(many) == len(weights)
    for (W, axes), row in zip(weights, many):
        one = d.weight_statistics(W, axes)
        numpy.testing.assert_array_equal(to_cpu(row), to_cpu(one))
    # again (the counters were reset by their last blocks; cached table)
    again = d.weight_statistics_many(weights)
    for a, b in zip(many, again):
        numpy.testing.assert_array_equal(to_cpu(a), to_cpu(b))
