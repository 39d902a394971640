"""FP16 GEMM emulation of ada_loss.functions / ada_loss.links.

* Emulated FP16 GEMMs (FP32 accumulation, one rounding to FP16) agree with
  NumPy's own float16 path (``chainer.config.fp16_gemm = 'native'``) to FP16
  rounding, forward and backward (gx, gW, gb), for Linear, Convolution2D
  (stride, pad, groups, dilate) and Deconvolution2D (stride, pad, groups).
* In float32 the ada_loss links are bit-for-bit chainer.links.
* Emulated results are exactly ``(FP32 computation).astype(float16)``, with
  FP16 subnormals kept.

Tolerance of emulated vs native (justification). Emulated rounds the exact-in-
FP32 products' FP32 sum once: error <= 2^-11 |y| (half an FP16 ulp; the FP32
accumulation error, ~K 2^-24, is negligible). The native float16 path may
round partial sums to FP16 too (bias add, fp16 reductions): each rounding
costs <= 2^-11 of the running sum, and K roundings with random signs grow like
sqrt(K). So |emulated - native| <= 4 * 2^-10 * sqrt(K) * max|native| with K
the reduction length of that GEMM is a loose but honest few-FP16-ulp bound;
a real bug (wrong stride/pad/group/dilation, a missing bias, a transposed
weight, a lost scale) gives errors of order max|y| itself, far above it.
"""
import numpy
import pytest

import chainer
import chainer.functions as F
import chainer.links as L

from ada_loss import functions as AF
from ada_loss import links as AL
from ada_loss.functions.fp16_gemm import FP16_GEMM_MODES, fp16_gemm_mode

F16 = numpy.float16
F32 = numpy.float32
ULP16 = 2.0 ** -10  # FP16 ulp at 1 (10 mantissa bits)


# (name, constructor(module) -> link, input shape, groups)
CASES = [
    ('linear', lambda m: m.Linear(7, 5), (4, 7), 1),
    ('linear_nobias', lambda m: m.Linear(6, 3, nobias=True), (5, 6), 1),
    ('conv', lambda m: m.Convolution2D(3, 4, 3), (2, 3, 7, 7), 1),
    ('conv_stride_pad',
     lambda m: m.Convolution2D(3, 4, 3, stride=2, pad=1), (2, 3, 8, 8), 1),
    ('conv_groups2',
     lambda m: m.Convolution2D(4, 6, 3, pad=1, groups=2), (2, 4, 6, 6), 2),
    ('conv_dilate2',
     lambda m: m.Convolution2D(3, 4, 3, pad=2, dilate=2), (2, 3, 7, 7), 1),
    ('conv_all',
     lambda m: m.Convolution2D(4, 4, 3, stride=2, pad=1, dilate=2, groups=2,
                               nobias=True), (2, 4, 9, 9), 2),
    ('deconv', lambda m: m.Deconvolution2D(3, 4, 3), (2, 3, 5, 5), 1),
    ('deconv_stride_pad',
     lambda m: m.Deconvolution2D(3, 4, 4, stride=2, pad=1), (2, 3, 4, 4), 1),
    ('deconv_groups2',
     lambda m: m.Deconvolution2D(4, 6, 3, stride=2, groups=2), (2, 4, 4, 4),
     2),
    ('deconv_nobias',
     lambda m: m.Deconvolution2D(2, 3, 3, stride=3, nobias=True),
     (2, 2, 3, 3), 1),
]
IDS = [c[0] for c in CASES]


def build(ctor, module, dtype):
    with chainer.using_config('dtype', dtype):
        return ctor(module)


def copy_params(dst, src, dtype=None):
    for (n1, p1), (n2, p2) in zip(sorted(dst.namedparams()),
                                  sorted(src.namedparams())):
        assert n1 == n2
        a = p2.array if dtype is None else p2.array.astype(dtype)
        p1.array = a.copy()


def init_params(link, seed):
    rs = numpy.random.RandomState(seed)
    for _, p in sorted(link.namedparams()):
        p.array = rs.standard_normal(p.shape).astype(p.dtype)


def forward_backward(link, x, gy_seed=1):
    """y, gx, gW, gb (gb None without bias) of ``link`` at ``x``."""
    link.cleargrads()
    xv = chainer.Variable(x.copy())
    y = link(xv)
    # FP16-representable in every dtype, so float32 references see the same gy
    y.grad = numpy.random.RandomState(gy_seed).standard_normal(
        y.shape).astype(F16).astype(y.dtype)
    y.backward()
    gb = None if link.b is None else link.b.grad
    return y.array, xv.grad, link.W.grad, gb


def reduction_lengths(W, groups, x, y):
    """Upper bounds of the reduction length K of y/gx, gW and gb."""
    spatial = int(numpy.prod(W.shape[2:]))
    k_data = max(int(numpy.prod(W.shape[1:])),
                 W.shape[0] // groups * spatial)
    k_weight = max(x.size // x.shape[1], y.size // y.shape[1])
    k_bias = y.size // y.shape[1]
    return k_data, k_data, k_weight, k_bias


def assert_fp16_close(actual, ref, k, what):
    assert actual.dtype == F16, what
    assert ref.dtype == F16, what
    assert actual.shape == ref.shape, what
    a = actual.astype(F32)
    r = ref.astype(F32)
    assert numpy.isfinite(a).all(), what
    scale = float(numpy.abs(r).max())
    assert scale > 0, what
    atol = 4 * ULP16 * numpy.sqrt(k) * scale
    err = float(numpy.abs(a - r).max())
    assert err <= atol, '{}: max error {} > {} ({} FP16 ulps of max)'.format(
        what, err, atol, err / (ULP16 * scale))


def test_fp16_gemm_default_and_bad_mode():
    assert FP16_GEMM_MODES == ('emulated', 'native')
    assert fp16_gemm_mode() == 'emulated'
    x = numpy.ones((2, 3), F16)
    W = numpy.ones((4, 3), F16)
    with chainer.using_config('fp16_gemm', 'fast'):
        with pytest.raises(ValueError, match='emulated, native'):
            AF.linear(x, W)


@pytest.mark.parametrize('name, ctor, shape, groups', CASES, ids=IDS)
def test_emulated_matches_native_fp16(name, ctor, shape, groups):
    link = build(ctor, AL, chainer.mixed16)
    x = numpy.random.RandomState(0).standard_normal(shape).astype(F16)
    link(x)  # initialize lazily-shaped params, if any
    assert link.W.dtype == F16
    init_params(link, seed=2)
    emu = forward_backward(link, x)
    with chainer.using_config('fp16_gemm', 'native'):
        nat = forward_backward(link, x)
    ks = reduction_lengths(link.W, groups, x, nat[0])
    for what, e, n, k in zip(('y', 'gx', 'gW', 'gb'), emu, nat, ks):
        if n is None:
            assert e is None
            continue
        assert_fp16_close(e, n, k, '{} {}'.format(name, what))


@pytest.mark.parametrize('name, ctor, shape, groups', CASES, ids=IDS)
def test_emulated_matches_stock_chainer_fp16(name, ctor, shape, groups):
    """Same check against chainer.links itself on float16 (NumPy fp16)."""
    link = build(ctor, AL, chainer.mixed16)
    ref = build(ctor, L, chainer.mixed16)
    x = numpy.random.RandomState(3).standard_normal(shape).astype(F16)
    link(x)
    ref(x)
    init_params(ref, seed=4)
    copy_params(link, ref)
    emu = forward_backward(link, x)
    nat = forward_backward(ref, x)
    ks = reduction_lengths(link.W, groups, x, nat[0])
    for what, e, n, k in zip(('y', 'gx', 'gW', 'gb'), emu, nat, ks):
        if n is None:
            assert e is None
            continue
        assert_fp16_close(e, n, k, '{} {}'.format(name, what))


@pytest.mark.parametrize('name, ctor, shape, groups', CASES, ids=IDS)
def test_emulated_is_fp32_rounded_once(name, ctor, shape, groups):
    """Emulated y, gx, gW, gb == chainer's float32 result on the widened
    FP16 inputs, rounded to float16 (bit for bit)."""
    link = build(ctor, AL, chainer.mixed16)
    ref = build(ctor, L, F32)
    x = numpy.random.RandomState(5).standard_normal(shape).astype(F16)
    link(x)
    ref(x.astype(F32))
    init_params(link, seed=6)
    copy_params(ref, link, F32)
    emu = forward_backward(link, x)
    wide = forward_backward(ref, x.astype(F32))
    for what, e, w in zip(('y', 'gx', 'gW', 'gb'), emu, wide):
        if w is None:
            assert e is None
            continue
        assert e.dtype == F16, what
        numpy.testing.assert_array_equal(
            e, w.astype(F16), err_msg='{} {}'.format(name, what))


def test_linear_emulation_formula_bitwise():
    rs = numpy.random.RandomState(7)
    x = rs.standard_normal((16, 33)).astype(F16)
    W = rs.standard_normal((9, 33)).astype(F16)
    b = rs.standard_normal(9).astype(F16)
    gy = rs.standard_normal((16, 9)).astype(F16)
    x32, W32, b32, gy32 = (a.astype(F32) for a in (x, W, b, gy))

    xv, Wv, bv = (chainer.Variable(a) for a in (x, W, b))
    y = AF.linear(xv, Wv, bv)
    y.grad = gy
    y.backward()
    assert y.dtype == F16
    numpy.testing.assert_array_equal(y.array, (x32 @ W32.T + b32).astype(F16))
    numpy.testing.assert_array_equal(xv.grad, (gy32 @ W32).astype(F16))
    numpy.testing.assert_array_equal(Wv.grad, (gy32.T @ x32).astype(F16))
    numpy.testing.assert_array_equal(bv.grad, gy32.sum(axis=0).astype(F16))
    # Double rounding (FP16 product, FP16 bias add) is not what we compute:
    # this input is chosen so that it would differ somewhere.
    twice = ((x32 @ W32.T).astype(F16) + b).astype(F16)
    assert not numpy.array_equal(twice, y.array)


def test_fp32_accumulation_keeps_small_terms():
    """FP16 accumulation would lose the 1s next to 2048 (ulp 2, ties to
    even); FP32 accumulation keeps them: 2048 + 64 = 2112 exactly."""
    x = numpy.ones((1, 65), F16)
    x[0, 0] = 2048.0
    W = numpy.ones((1, 65), F16)
    y = AF.linear(x, W).array
    assert y.dtype == F16
    assert float(y[0, 0]) == 2112.0


SUB = 2.0 ** -22  # 2^-20 * 2^-2: an FP16 subnormal (normal min is 2^-14)


def test_linear_keeps_fp16_subnormals():
    assert 0 < F16(SUB) < numpy.finfo(F16).tiny
    x = numpy.full((2, 3), 2.0 ** -20, F16)
    W = numpy.full((4, 3), 2.0 ** -2, F16)
    xv, Wv = chainer.Variable(x), chainer.Variable(W)
    y = AF.linear(xv, Wv)
    assert y.dtype == F16
    numpy.testing.assert_array_equal(y.array, numpy.full((2, 4), 3 * SUB, F16))
    # gx = gy W with gy = 2^-20, W = 2^-2; gW = gy^T x with x = 2^-20, gy
    # summed over a batch of 2 -> 2 * 2^-40 would underflow, so use gy = 2^-3:
    # gW = 2 * 2^-3 * 2^-20 = 2^-22.
    y.grad = numpy.full((2, 4), 2.0 ** -20, F16)
    y.backward()
    numpy.testing.assert_array_equal(xv.grad, numpy.full((2, 3), 4 * SUB, F16))
    xv.cleargrad()
    Wv.cleargrad()
    y = AF.linear(xv, Wv)
    y.grad = numpy.full((2, 4), 2.0 ** -3, F16)
    y.backward()
    numpy.testing.assert_array_equal(Wv.grad, numpy.full((4, 3), SUB, F16))


@pytest.mark.parametrize('deconv', [False, True])
def test_conv_keeps_fp16_subnormals(deconv):
    x = numpy.full((1, 2, 3, 3), 2.0 ** -20, F16)
    W = numpy.full((2, 2, 1, 1), 2.0 ** -2, F16)
    f = AF.deconvolution_2d if deconv else AF.convolution_2d
    xv = chainer.Variable(x)
    y = f(xv, W)
    assert y.dtype == F16
    numpy.testing.assert_array_equal(
        y.array, numpy.full((1, 2, 3, 3), 2 * SUB, F16))
    y.grad = numpy.full(y.shape, 2.0 ** -20, F16)
    y.backward()
    numpy.testing.assert_array_equal(
        xv.grad, numpy.full(x.shape, 2 * SUB, F16))


@pytest.mark.parametrize('name, ctor, shape, groups', CASES, ids=IDS)
def test_float32_bitwise_equal_to_chainer_links(name, ctor, shape, groups):
    link = build(ctor, AL, F32)
    ref = build(ctor, L, F32)
    assert isinstance(link, type(ref))
    x = numpy.random.RandomState(8).standard_normal(shape).astype(F32)
    link(x)
    ref(x)
    init_params(ref, seed=9)
    copy_params(link, ref)
    got = forward_backward(link, x)
    want = forward_backward(ref, x)
    for what, g, w in zip(('y', 'gx', 'gW', 'gb'), got, want):
        if w is None:
            assert g is None
            continue
        assert g.dtype == F32
        numpy.testing.assert_array_equal(g, w, err_msg='{} {}'.format(
            name, what))


def test_float32_dilated_convolution_bitwise():
    ref = L.DilatedConvolution2D(3, 4, 3, pad=2, dilate=2)
    link = AL.DilatedConvolution2D(3, 4, 3, pad=2, dilate=2)
    init_params(ref, seed=10)
    copy_params(link, ref)
    x = numpy.random.RandomState(11).standard_normal((2, 3, 6, 6)).astype(F32)
    for g, w in zip(forward_backward(link, x), forward_backward(ref, x)):
        numpy.testing.assert_array_equal(g, w)


def test_float32_gemm_function_nodes_are_used():
    """The links really go through ada_loss nodes (else FP16 emulation and
    layer-wise scales would silently not apply)."""
    for ctor, shape in [(lambda: AL.Linear(3, 2), (2, 3)),
                        (lambda: AL.Convolution2D(1, 2, 3), (1, 1, 4, 4)),
                        (lambda: AL.Deconvolution2D(1, 2, 3), (1, 1, 4, 4))]:
        y = ctor()(numpy.zeros(shape, F32))
        assert isinstance(y.creator, AF.gemm_function_types()), y.creator


# ------------------------------------------------ function-level options

def _grads(f, args, gy, beta=1):
    vs = [chainer.Variable(a.copy()) for a in args]
    y = f(*vs)
    if beta == 1:
        y.grad = gy
        y.backward()
        return [y.array] + [v.grad for v in vs]
    # β through the documented method (GemmFunction.backward_scaled); the
    # GEMM node may sit under a reshape (n_batch_axes=2), which the
    # gradient crosses as a reshape.
    node = y.creator
    while not isinstance(node, AF.gemm_function_types()):
        node = node.inputs[0].creator
    g = chainer.Variable(gy.reshape(node.outputs[0]().shape))
    with chainer.no_backprop_mode():
        grads = node.backward_scaled(tuple(range(len(vs))), (g,),
                                     input_scale=beta).grads
    return [y.array] + [r.array.reshape(v.shape)
                        for r, v in zip(grads, vs)]


FUNCS = [
    ('linear', AF.linear, F.linear, (5, 6), (4, 6), (4,)),
    ('linear_2batch', lambda x, W, b: AF.linear(x, W, b, n_batch_axes=2),
     lambda x, W, b: F.linear(x, W, b, n_batch_axes=2), (2, 3, 6), (4, 6),
     (4,)),
    ('conv_cover_all',
     lambda x, W, b: AF.convolution_2d(x, W, b, stride=2, cover_all=True),
     lambda x, W, b: F.convolution_2d(x, W, b, stride=2, cover_all=True),
     (2, 3, 6, 6), (4, 3, 3, 3), (4,)),
    ('deconv_outsize',
     lambda x, W, b: AF.deconvolution_2d(x, W, b, stride=2, pad=1,
                                         outsize=(8, 8)),
     lambda x, W, b: F.deconvolution_2d(x, W, b, stride=2, pad=1,
                                        outsize=(8, 8)),
     (2, 3, 4, 4), (3, 4, 3, 3), (4,)),
]


@pytest.mark.parametrize('name, f, ref, xs, ws, bs', FUNCS,
                         ids=[c[0] for c in FUNCS])
def test_functions_match_chainer(name, f, ref, xs, ws, bs):
    rs = numpy.random.RandomState(12)
    args16 = [rs.standard_normal(s).astype(F16) for s in (xs, ws, bs)]
    args32 = [a.astype(F32) for a in args16]
    y32 = ref(*args32)
    gy16 = rs.standard_normal(y32.shape).astype(F16)
    want32 = _grads(ref, args32, gy16.astype(F32))
    got32 = _grads(f, args32, gy16.astype(F32))
    for g, w in zip(got32, want32):  # float32: bit for bit
        numpy.testing.assert_array_equal(g, w, err_msg=name)
    got16 = _grads(f, args16, gy16)  # emulated: float32 result, rounded
    for g, w in zip(got16, want32):
        assert g.dtype == F16
        numpy.testing.assert_array_equal(g, w.astype(F16), err_msg=name)


@pytest.mark.parametrize('name, f, ref, xs, ws, bs', FUNCS,
                         ids=[c[0] for c in FUNCS])
def test_grad_input_scale_scales_gx_only(name, f, ref, xs, ws, bs):
    """β (``input_scale`` of GemmFunction.backward_scaled, a power of two)
    multiplies gx
    exactly and leaves gW and gb alone (float32 and emulated FP16)."""
    rs = numpy.random.RandomState(13)
    args32 = [rs.standard_normal(s).astype(F16).astype(F32)
              for s in (xs, ws, bs)]
    args16 = [a.astype(F16) for a in args32]
    gy = rs.standard_normal(ref(*args32).shape).astype(F16)
    beta = 2.0 ** 10
    base32 = _grads(f, args32, gy.astype(F32))
    sc32 = _grads(f, args32, gy.astype(F32), beta)
    numpy.testing.assert_array_equal(sc32[1], base32[1] * F32(beta))
    for i in (0, 2, 3):
        numpy.testing.assert_array_equal(sc32[i], base32[i])
    sc16 = _grads(f, args16, gy, beta)
    numpy.testing.assert_array_equal(
        sc16[1], (base32[1] * F32(beta)).astype(F16))
    for i in (0, 2, 3):
        numpy.testing.assert_array_equal(sc16[i], base32[i].astype(F16))
    # a small gradient lifted out of FP16's subnormal range by β
    tiny = (gy.astype(F32) * 2.0 ** -20).astype(F16)
    lifted = _grads(f, args16, tiny, beta)[1].astype(F32)
    exact = _grads(f, args32, tiny.astype(F32))[1] * F32(beta)
    numpy.testing.assert_array_equal(lifted, exact.astype(F16).astype(F32))


def test_grad_input_scale_scales_the_fp32_accumulator():
    """Emulated, β multiplies the FP32 accumulator before the one rounding:
    gy * β = 102400 would overflow FP16 as a pre-scaled operand, but
    gx * β = 4 * 100 * 2^-6 * 2^10 = 6400 is representable and exact."""
    x = numpy.ones((3, 2), F16)
    W = numpy.full((4, 2), 2.0 ** -6, F16)
    gy = numpy.full((3, 4), 100.0, F16)
    gx = _grads(AF.linear, (x, W), gy, beta=2.0 ** 10)[1]
    assert gx.dtype == F16
    numpy.testing.assert_array_equal(gx, numpy.full((3, 2), 6400.0, F16))
