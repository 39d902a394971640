"""Every scaled GEMM node passes ``chainer.gradient_check.check_backward``
at scales != 1, in float32 and float16 (emulated FP16 GEMMs).

* The forward GEMM nodes (Linear, Convolution2D, Deconvolution2D) produce
  their gradients at the scales of :meth:`GemmFunction.backward_scaled`: the
  input gradient at β, the weight and bias gradients at the scale returned
  with them (γ, lowered where a weight gradient is fitted into FP16). Each
  gradient divided by the scale the node declares for it must be the
  gradient of the node's forward.
* The gradient GEMM nodes (``output_scale``) and the bias-gradient node
  (``scale``) compute scale · f(inputs): their backward must be the
  gradient of that, as for any Chainer node.

Numerical gradients are taken in float64 (``dtype=numpy.float64``), as
Chainer's own tests of these functions do for float16; tolerances are those
of Chainer 7.8.1's tests of linear/convolution_2d for each dtype.
"""
import numpy
import pytest

import chainer
from chainer import gradient_check

from ada_loss.functions import gemm
from ada_loss.functions.convolution_2d import (
    Convolution2DFunction, Convolution2DGradW, Deconvolution2DFunction)
from ada_loss.functions.linear import (
    LinearFunction, LinearGradData, LinearGradWeight)

F16, F32, F64 = numpy.float16, numpy.float32, numpy.float64
TOL = {F32: dict(atol=5e-4, rtol=5e-3), F16: dict(atol=5e-2, rtol=5e-1)}
DTYPES = [F32, F16]


def _uniform(rs, shape, dtype, scale=1.0):
    return (rs.uniform(-1, 1, shape) * scale).astype(dtype)


# (name, node factory, x shape, W shape, b shape)
FORWARD = [
    ('linear', lambda: {}, LinearFunction, (3, 4), (5, 4), (5,)),
    ('conv', lambda: dict(stride=2, pad=1, dilate=1, groups=2),
     Convolution2DFunction, (2, 4, 5, 5), (6, 2, 3, 3), (6,)),
    ('conv_dilate', lambda: dict(pad=2, dilate=2),
     Convolution2DFunction, (2, 3, 6, 6), (4, 3, 3, 3), (4,)),
    ('deconv', lambda: dict(stride=2, pad=1, groups=2),
     Deconvolution2DFunction, (2, 4, 3, 3), (4, 3, 3, 3), (6,)),
]


def _unscaled(node_type, beta, gamma, declared, alpha=1.0):
    """``node_type`` whose backward receives gy at scale α (as in the ⟨α, δ⟩
    backward), runs ``backward_scaled`` at (β, γ) and divides each gradient
    by the scale it was declared at (α·β for gx; α times the returned
    weight-gradient scale for gW and gb)."""

    class Unscaled(node_type):
        def backward(self, indexes, grad_outputs):
            gy = grad_outputs[0] * alpha
            grads, _, w_scale = self.backward_scaled(
                indexes, (gy,), input_scale=beta, weight_scale=gamma,
                fit_weight_grad=True)
            declared.append(w_scale)
            scales = {0: alpha * beta, 1: alpha * w_scale,
                      2: alpha * w_scale}
            return tuple(g / scales[i] for i, g in zip(indexes, grads))
    return Unscaled


@pytest.mark.parametrize('dtype', DTYPES, ids=['float32', 'float16'])
@pytest.mark.parametrize('beta, gamma', [(2.0 ** 5, 2.0 ** -3),
                                         (2.0 ** -4, 0.5)])
@pytest.mark.parametrize('name, kwargs, node_type, xs, ws, bs', FORWARD,
                         ids=[c[0] for c in FORWARD])
def test_forward_gemm_gradients_at_declared_scales(
        name, kwargs, node_type, xs, ws, bs, beta, gamma, dtype):
    rs = numpy.random.RandomState(0)
    x, W, b = (_uniform(rs, s, dtype) for s in (xs, ws, bs))
    declared = []
    node = _unscaled(node_type, beta, gamma, declared)
    y = node(**kwargs()).apply((x, W, b))[0]
    gy = _uniform(rs, y.shape, dtype)
    gradient_check.check_backward(
        lambda *a: node(**kwargs()).apply(a), (x, W, b), gy, dtype=F64,
        **TOL[dtype])
    # no weight gradient overflowed: it came back at γ
    assert declared and set(declared) == {gamma}


@pytest.mark.parametrize('name, kwargs, node_type, xs, ws, bs', FORWARD,
                         ids=[c[0] for c in FORWARD])
def test_fitted_weight_gradient_at_its_declared_scale(
        name, kwargs, node_type, xs, ws, bs):
    """FP16: at α = 2^10, gW would overflow 65504; it is produced at a
    smaller scale, and that scale is the one returned (divided out, the
    gradient is right)."""
    rs = numpy.random.RandomState(1)
    x = _uniform(rs, xs, F16, 8.0)
    W, b = _uniform(rs, ws, F16), _uniform(rs, bs, F16)
    declared = []
    node = _unscaled(node_type, 2.0 ** -6, 1.0, declared, alpha=2.0 ** 10)
    y = node(**kwargs()).apply((x, W, b))[0]
    gy = _uniform(rs, y.shape, F16, 50.0)
    gradient_check.check_backward(
        lambda *a: node(**kwargs()).apply(a), (x, W, b), gy, dtype=F64,
        **TOL[F16])
    assert declared and max(declared) < 1.0


def _conv_grad_w(scale, dtype):
    conv = Convolution2DFunction(stride=2, pad=1, groups=2)
    return (lambda x, gy: Convolution2DGradW(
        conv, (6, 2, 3, 3), x.dtype, None, scale,
        scaled_input=1).apply((x, gy)),
        [(2, 4, 5, 5), (2, 6, 3, 3)])


def _deconv_grad_w(scale, dtype):
    deconv = Deconvolution2DFunction(stride=2, pad=1, outsize=(5, 5), groups=2)
    deconv._set_cover_all((2, 4, 3, 3), (4, 3, 3, 3))
    return (lambda gy, x: Convolution2DGradW(
        deconv, (4, 3, 3, 3), x.dtype, None, scale,
        scaled_input=0).apply((gy, x)),
        [(2, 6, 5, 5), (2, 4, 3, 3)])


# name -> (scale, dtype) -> (callable on Variables, input shapes). A weight
# gradient's dtype is the inputs' (float64 where check_backward takes its
# numerical gradient: a forward rounded to float16 would make it noise).
GRADIENT_NODES = {
    'linear_grad_data': lambda s, d: (
        lambda W, gy: LinearGradData(s).apply((W, gy)), [(5, 4), (3, 5)]),
    'linear_grad_weight': lambda s, d: (
        lambda x, gy: LinearGradWeight(x.dtype, s).apply((x, gy)),
        [(3, 4), (3, 5)]),
    'conv_grad_w': _conv_grad_w,
    'deconv_grad_w': _deconv_grad_w,
    # a deconvolution as a convolution's input-gradient GEMM, and back
    'deconv_as_grad_input': lambda s, d: (
        lambda gy, W: Deconvolution2DFunction(
            stride=2, pad=1, outsize=(5, 5), groups=2,
            output_scale=s).apply((gy, W)), [(2, 6, 3, 3), (6, 2, 3, 3)]),
    'conv_as_grad_input': lambda s, d: (
        lambda gy, W: Convolution2DFunction(
            stride=2, pad=1, groups=2, output_scale=s).apply((gy, W)),
        [(2, 6, 5, 5), (4, 3, 3, 3)]),
    'bias_grad': lambda s, d: (
        lambda gy: gemm.BiasGrad((0, 2, 3), scale=s).apply((gy,)),
        [(2, 6, 3, 3)]),
}


@pytest.mark.parametrize('dtype', DTYPES, ids=['float32', 'float16'])
@pytest.mark.parametrize('scale', [2.0 ** 6, 2.0 ** -5])
@pytest.mark.parametrize('name', sorted(GRADIENT_NODES))
def test_gradient_gemm_nodes(name, scale, dtype):
    fn, shapes = GRADIENT_NODES[name](scale, dtype)
    rs = numpy.random.RandomState(2)
    args = tuple(_uniform(rs, s, dtype) for s in shapes)
    y = fn(*args)[0]
    unscaled = GRADIENT_NODES[name](1, dtype)[0](*args)[0]
    # the node really computes scale · f
    numpy.testing.assert_allclose(
        y.array.astype(F64), unscaled.array.astype(F64) * scale,
        rtol=1e-3 if dtype == F16 else 1e-6)
    gy = _uniform(rs, y.shape, dtype)
    gradient_check.check_backward(fn, args, gy, dtype=F64, **TOL[dtype])


def test_chainer_backward_is_backward_scaled_at_scale_one():
    """``backward`` (what Chainer's backprop calls) is ``backward_scaled``
    with every scale 1: same gradients bit for bit, scale 1 returned."""
    rs = numpy.random.RandomState(3)
    x, W, b = (_uniform(rs, s, F16) for s in ((3, 4), (5, 4), (5,)))
    node = LinearFunction()
    y = node.apply((x, W, b))[0]
    gy = chainer.Variable(_uniform(rs, y.shape, F16))
    with chainer.no_backprop_mode():
        plain = node.backward((0, 1, 2), (gy,))
        grads, _, w_scale = node.backward_scaled((0, 1, 2), (gy,))
    assert w_scale == 1
    for p, g in zip(plain, grads):
        assert p.dtype == g.dtype == F16
        assert numpy.array_equal(p.array, g.array)
