"""A power-of-two scale beyond float32's range (issue 50, item 9).

The overflow decision of a fitted GEMM output (``gemm._fit_ratio``, then
:func:`ada_loss.loss_scale.fit.fit_ratio`) judges ``scale · max|y|`` as a
double; the output must then be that product, rounded once. A float32
factor cannot hold 2^130 (inf) or 2^-160 (0): ``y = [2^-140, 0]`` at scale
2^130 (true value 2^-10) was stored as [Inf or NaN or u_max, NaN] in every
format. :func:`ada_loss.functions.scales.scaled` now multiplies by such a
scale in float64 (exact for a float32 value) and rounds once.
"""
import chainer
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ada_loss.adaptive.backward import HostScales
from ada_loss.formats import get_format
from ada_loss.functions.fp16_gemm import round_to
from ada_loss.functions.gemm import BiasGrad
from ada_loss.functions.scales import scaled

from property_helpers import examples

FORMATS = ['float16', 'bfloat16', 'fp8_e4m3', 'fp8_e5m2', 'fp6_e3m2',
           'fp6_e2m3', 'fp4_e2m1']


@pytest.mark.parametrize('fmt', FORMATS)
def test_fitted_output_at_a_scale_beyond_float32(fmt):
    """The bias gradient of [2^-140, 2^-130, 0] produced at 2^130 with
    ``fit_output`` (nothing to fit: 2^-10 and 1 are below every format's
    largest value): the emulated path (float32 storage, rounded to
    ``fmt``), the true values rounded to ``fmt`` (2^-10 is 0 in E4M3, FP6
    and FP4, whose smallest values are 2^-9, 2^-4, 2^-3 and 0.5)."""
    f = get_format(fmt)
    gy = np.array([[2.0 ** -140, 2.0 ** -130, 0.0]], np.float32)
    node = BiasGrad(0, f, 2.0 ** 130, fit_output=True)
    gb, = node.apply((gy,))
    assert node.applied_scale == 2.0 ** 130
    true = np.array([2.0 ** -10, 1.0, 0.0], np.float32)
    assert gb.array.tolist() == f.quantize(true).tolist()
    assert gb.array[1] == 1.0


def test_fp16_storage_at_a_scale_beyond_float32():
    """mixed16's path: the FP32 accumulator scaled and rounded to float16
    (:func:`round_to`), and a float16 array scaled down by 2^-150."""
    acc = np.array([2.0 ** -140, 0.0, -2.0 ** -149], np.float32)
    got = round_to(acc, np.float16, 2.0 ** 130)
    assert got.dtype == np.float16
    assert got.tolist() == [2.0 ** -10, 0.0, -2.0 ** -19]
    half = np.array([2.0 ** 15, -1.0, 0.0], np.float16)
    assert scaled(half, 2.0 ** -150).tolist() == [0.0, -0.0, 0.0]
    assert scaled(half, 2.0 ** -150).dtype == np.float16


def test_host_rescale_below_float32():
    """Algorithm 5's ratios in the ⟨α, δ⟩ backward (NumPy): 2^100 times
    2^-150 is 2^-50, not 0 (float32's 2^-150 is 0)."""
    v = chainer.Variable(np.array([2.0 ** 100, -2.0 ** 60], np.float32))
    got = HostScales.rescale(v, 2.0 ** -150).array
    assert got.dtype == np.float32
    assert got.tolist() == [2.0 ** -50, -2.0 ** -90]


@settings(max_examples=examples(500))
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=1,
                max_size=8),
       st.integers(-300, 300))
def test_scaled_is_the_exact_product_rounded_once(values, k):
    """For every power of two a double holds: NumPy's ``ldexp`` (float32
    in, float32 out, correctly rounded) is the reference."""
    a = np.array(values, np.float32)
    with np.errstate(over='ignore', under='ignore', invalid='ignore'):
        got = scaled(a, 2.0 ** k)
        ref = np.ldexp(a, k)
    assert got.dtype == np.float32
    assert np.array_equal(got, ref), (values, k)


@pytest.mark.parametrize('dtype, k, g, want', [
    (np.float32, 130, [2.0 ** -140, 0.0], [2.0 ** -10, 0.0]),
    (np.float32, -150, [2.0 ** 100, -1.0], [2.0 ** -50, -0.0]),
    # a scale beyond float16's range (2^20 is inf in float16)
    (np.float16, 20, [2.0 ** -20, 0.0], [1.0, 0.0]),
    (np.float16, -30, [2.0 ** 15, 1.0], [2.0 ** -15, 0.0]),
])
def test_double_backward_of_a_scaled_node_beyond_the_dtype(dtype, k, g, want):
    """The backward of a node producing ``scale · f`` (BiasGrad here, and
    every ScaledOutput GEMM) multiplies the incoming gradient by the scale:
    Chainer's ``g * scale`` casts the constant to g's dtype first (2^130
    is inf in float32: [Inf, NaN] instead of [2^-10, 0])."""
    gy = chainer.Variable(np.zeros((1, 2), dtype))
    gb, = BiasGrad(0, None, 2.0 ** k).apply((gy,))
    ggy, = chainer.grad([gb], [gy], grad_outputs=[
        chainer.Variable(np.array(g, dtype))])
    assert ggy.dtype == dtype
    assert ggy.array.tolist() == [want]
    assert np.signbit(ggy.array).tolist() == [np.signbit(want).tolist()]
