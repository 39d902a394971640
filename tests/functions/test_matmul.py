"""The activation × activation GEMM (ada_loss/functions/matmul.py) and GELU
(ada_loss/functions/gelu.py): numerical gradient checks, the scaled
backward's one scale per input gradient, its rounding and fitting, and the
Algorithm 4 view of each operand."""
import chainer
from chainer import gradient_check
import ml_dtypes
import numpy as np
import pytest

from ada_loss.formats import get_format
from ada_loss.functions import gelu, matmul
from ada_loss.functions.matmul import MatMulFunction
from ada_loss.loss_scale.gemm import gemm_loss_scale


def _operands(seed=0, dtype=np.float64):
    rng = np.random.RandomState(seed)
    a = rng.randn(2, 3, 4, 5).astype(dtype)
    b = rng.randn(2, 3, 5, 6).astype(dtype)
    gy = rng.randn(2, 3, 4, 6).astype(dtype)
    return a, b, gy


def test_forward_is_numpy_matmul():
    a, b, _ = _operands(dtype=np.float32)
    np.testing.assert_array_equal(matmul(a, b).array, np.matmul(a, b))


def test_numerical_gradient():
    a, b, gy = _operands()
    gradient_check.check_backward(
        lambda a, b: matmul(a, b), (a, b), gy, dtype=np.float64,
        atol=1e-6, rtol=1e-6)


def test_gelu_numerical_gradient_and_values():
    x = np.linspace(-4, 4, 41).reshape(1, 41)
    gradient_check.check_backward(gelu, x, np.random.RandomState(0).randn(
        1, 41), dtype=np.float64, atol=1e-6, rtol=1e-6)
    from scipy.stats import norm
    np.testing.assert_allclose(gelu(x).array, x * norm.cdf(x), rtol=1e-12,
                               atol=1e-15)


def test_bad_operands_one_line_errors():
    a, b, _ = _operands(dtype=np.float32)
    with pytest.raises(TypeError, match='one dtype'):
        matmul(a, b.astype(np.float64))
    with pytest.raises(ValueError, match='same leading axes'):
        matmul(a, b[:1])


def _node(a, b, **kw):
    node = MatMulFunction(**kw)
    y, = node.apply((chainer.Variable(a), chainer.Variable(b)))
    return node, y


def test_backward_scaled_one_scale_per_input():
    """gA is the GEMM of β_a·gY, gB of β_b·gY: exactly β times Chainer's
    gradients in float32 (powers of two)."""
    a, b, gy = _operands(dtype=np.float32)
    node, _ = _node(a, b)
    (ga, gb), scales = node.backward_scaled(
        (0, 1), (chainer.Variable(gy),), input_scales={0: 2.0 ** 7,
                                                       1: 2.0 ** -3})
    assert scales == {0: 2.0 ** 7, 1: 2.0 ** -3}
    np.testing.assert_array_equal(
        ga.array, np.matmul(gy, b.swapaxes(-1, -2)) * np.float32(2 ** 7))
    np.testing.assert_array_equal(
        gb.array, np.matmul(a.swapaxes(-1, -2), gy) * np.float32(2 ** -3))
    # one input only
    (gb1,), s1 = node.backward_scaled((1,), (chainer.Variable(gy),))
    assert s1 == {1: 1}
    np.testing.assert_array_equal(gb1.array, np.matmul(a.swapaxes(-1, -2),
                                                       gy))


def test_emulated_format_rounds_and_fits():
    """In an emulated E4M3 precision the output and both gradients are
    rounded to the format (ml_dtypes as the reference), the incoming
    gradient first; with the fit, a β that would overflow is lowered by the
    power of two that keeps the rounded gradient finite."""
    e4m3 = get_format('fp8_e4m3')
    a, b, gy = _operands(1, np.float32)
    ref = ml_dtypes.float8_e4m3fn

    def q(x):
        return np.asarray(x, np.float32).astype(ref).astype(np.float32)
    a, b = q(a), q(b)    # the link rounds the operands
    node, y = _node(a, b, formats=(e4m3, e4m3))
    np.testing.assert_array_equal(y.array, q(np.matmul(a, b)))
    (ga, gb), scales = node.backward_scaled(
        (0, 1), (chainer.Variable(gy),), input_scales={0: 4.0, 1: 2.0 ** 9},
        fit_input_grad=True)
    gq = q(gy)
    np.testing.assert_array_equal(
        ga.array, q(np.matmul(gq, b.swapaxes(-1, -2)) * np.float32(4)))
    assert scales[0] == 4.0
    # 2^9 · |Aᵀ·gY| (entries ~ 1..10) exceeds 448: fitted down
    assert scales[1] < 2.0 ** 9 and np.isfinite(gb.array).all()
    assert np.abs(gb.array).max() <= 448
    np.testing.assert_array_equal(
        gb.array,
        q(np.matmul(a.swapaxes(-1, -2), gq) * np.float32(scales[1])))


def test_float16_emulated_fp32_accumulation():
    a, b, gy = _operands(2, np.float16)
    y = matmul(a, b)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(
        y.array, np.matmul(a.astype(np.float32),
                           b.astype(np.float32)).astype(np.float16))


def test_operand_views_are_algorithm_4s_gemms():
    """For gA = gY·Bᵀ the weight's role is B's (its gain sums B's last
    axis, N); for gB = Aᵀ·gY it is A's (summing A's axis −2, M): the
    'output' bound then holds for each gradient."""
    a, b, gy = _operands(3, np.float32)
    node, _ = _node(a, b, scale_key='blk/qk')
    va, vb = node.operand_gradient(0), node.operand_gradient(1)
    assert (va.scale_key, vb.scale_key) == ('blk/qk:a', 'blk/qk:b')
    assert va.gemm_weight() is node.get_retained_inputs()[1].array
    assert vb.gemm_weight() is node.get_retained_inputs()[0].array
    ga = np.matmul(gy, b.swapaxes(-1, -2))
    gb = np.matmul(a.swapaxes(-1, -2), gy)
    peak = np.abs(gy).max()
    for view, g in ((va, ga), (vb, gb)):
        gain = view.grad_input_gain(view.gemm_weight())
        assert np.abs(g).max() <= peak * gain * (1 + 1e-6)
        # tight: the gain is attained by some row for a gradient of signs
    beta = gemm_loss_scale(va.gemm_weight(), gy * 1e-6, fmt='fp8_e4m3',
                           bound='output',
                           gain=va.grad_input_gain(va.gemm_weight()))
    assert np.abs(ga * 1e-6 * beta).max() <= 448


def test_per_tensor_recipe_backward_reuses_the_forward_copies():
    """fp8:recipe=current: a and b cast once per tensor (E4M3) for the
    forward, the same copies in both gradient GEMMs, gY cast once (E5M2),
    outputs FP32 (TE's per-tensor recipe)."""
    from ada_loss.formats.per_tensor import quantize_per_tensor
    from ada_loss.precision import parse_precision
    scaling = parse_precision('fp8:recipe=current').recipe.state()
    a, b, gy = _operands(4, np.float32)
    node, y = _node(a, b, scaling=scaling)
    e4, e5 = get_format('fp8_e4m3'), get_format('fp8_e5m2')
    aq, bq = quantize_per_tensor(a, e4)[0], quantize_per_tensor(b, e4)[0]
    np.testing.assert_array_equal(y.array, np.matmul(aq, bq))
    (ga, gb), _ = node.backward_scaled((0, 1), (chainer.Variable(gy),))
    gq = quantize_per_tensor(gy, e5)[0]
    np.testing.assert_array_equal(ga.array, np.matmul(gq, bq.swapaxes(-1,
                                                                      -2)))
    np.testing.assert_array_equal(gb.array, np.matmul(aq.swapaxes(-1, -2),
                                                      gq))


def test_mx_recipe_casts_each_operand_along_each_gemms_reduction():
    """mxfp8: blocks of 32 along the reduction of each GEMM — the forward
    sums K (a's last axis, b's axis −2), gA = gY·Bᵀ sums N (gY's and b's
    last axis), gB = Aᵀ·gY sums M (a's and gY's axis −2)."""
    from ada_loss.formats.mx import quantize_mx
    from ada_loss.precision import parse_precision
    scaling = parse_precision('mxfp8').recipe.state()
    rng = np.random.RandomState(6)
    a = rng.randn(1, 2, 32, 32).astype(np.float32)
    b = (rng.randn(1, 2, 32, 32) * np.logspace(-3, 3, 32)).astype(
        np.float32)
    gy = (rng.randn(1, 2, 32, 32) * np.logspace(3, -3, 32)[:, None]).astype(
        np.float32)
    node, y = _node(a, b, scaling=scaling)

    def q(x, axis):
        return quantize_mx(x, 'fp8_e4m3', axis=(axis,))
    np.testing.assert_array_equal(y.array, np.matmul(q(a, 3), q(b, 2)))
    (ga, gb), _ = node.backward_scaled((0, 1), (chainer.Variable(gy),))
    np.testing.assert_array_equal(
        ga.array, np.matmul(q(gy, 3), q(b, 3).swapaxes(-1, -2)))
    np.testing.assert_array_equal(
        gb.array, np.matmul(q(a, 2).swapaxes(-1, -2), q(gy, 2)))


def test_gelu_double_backward():
    rng = np.random.RandomState(1)
    x = rng.randn(3, 7) * 2
    gradient_check.check_double_backward(
        gelu, x, rng.randn(3, 7), rng.randn(3, 7), dtype=np.float64,
        atol=1e-6, rtol=1e-6)


def test_gelu_float16_computed_in_fp32_rounded_once():
    x = np.linspace(-3, 3, 13).astype(np.float16)
    from scipy.stats import norm
    w = x.astype(np.float32)
    np.testing.assert_array_equal(
        gelu(x).array, (w * (0.5 * (1 + __import__('scipy').special.erf(
            w * np.float32(1 / np.sqrt(2)))))).astype(np.float16))
    assert gelu(x).dtype == np.float16
    np.testing.assert_allclose(gelu(x).array.astype(np.float64),
                               x * norm.cdf(x.astype(np.float64)),
                               rtol=2e-3, atol=1e-3)
