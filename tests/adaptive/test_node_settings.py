"""The ⟨α, δ⟩ backward passes each GEMM its scales as arguments of
``backward_scaled`` and reads the weight gradient's scale from its return
value: nothing is set on a node after it is built; function hooks that want
β get it as an argument (``scaled_backward_preprocess``)."""
import contextlib
import io

import numpy
import pytest

import chainer
import chainer.functions as F
import chainer.links as L

import ada_loss
from ada_loss.functions import GemmFunction


class _Recorder(chainer.FunctionHook):
    """Sees every node and its attributes before and after its backward."""

    name = 'node_settings_recorder'

    def __init__(self):
        self.before, self.after, self.betas, self.plain = {}, {}, {}, []

    def scaled_backward_preprocess(self, function, in_data, out_grad, beta):
        self.betas[function.scale_key] = beta
        self.before[function] = dict(vars(function))

    def backward_preprocess(self, function, in_data, out_grad):
        self.plain.append(type(function).__name__)

    def backward_postprocess(self, function, in_data, out_grad):
        if isinstance(function, GemmFunction):
            self.after[function] = dict(vars(function))


def _model():
    return chainer.Sequential(
        L.Convolution2D(1, 4, 3, pad=1), F.relu,
        L.Deconvolution2D(4, 2, 3, stride=2, pad=1), F.relu,
        L.Linear(None, 3))


@pytest.mark.parametrize('dtype', [numpy.float32, numpy.float16])
def test_no_node_attribute_is_set_by_the_backward(dtype):
    numpy.random.seed(0)
    with chainer.using_config('dtype', dtype):
        model = _model()
    x = numpy.random.RandomState(1).standard_normal(
        (2, 1, 6, 6)).astype(dtype)
    model(x)          # Linear(None, ...) initializes its weight
    with contextlib.redirect_stdout(io.StringIO()):
        ada = ada_loss.AdaLossScaled(model)
    hook = _Recorder()
    loss = F.sum(F.cast(model(x), numpy.float32)) * 2.0 ** -14   # small: β > 1
    with hook:
        ada.backward(loss)
    assert len(hook.before) == 3
    for node, attrs in hook.before.items():
        assert hook.after[node] == attrs, type(node).__name__
        for name in ('grad_input_scale', 'grad_weight_scale',
                     'fit_weight_grad', 'weight_grad_scale'):
            assert not hasattr(node, name)
    # the hook got each layer's β, the one AdaLossScaled reports
    assert hook.betas == dict(ada.layer_scales())
    assert any(b != 1 for b in hook.betas.values())
    # non-GEMM nodes get Chainer's plain call
    assert 'ReLU' in hook.plain


def test_overflowing_fp16_weight_gradient_is_fitted_not_inf():
    """Emulated FP16: at α = 2^15 a Linear's gW = α·Σ_batch x overflows
    65504; it is produced at a lower power of two, which its parameter
    carries (``_loss_scale``), so the unscaled gradient is finite and right.
    (Before the fix the FP32 accumulator was rounded to FP16 first and the
    overflow stayed inf.)"""
    with chainer.using_config('dtype', numpy.float16):
        lin = L.Linear(4, 3)
    model = chainer.Sequential(lin)
    x = numpy.random.RandomState(2).uniform(5, 10, (8, 4)).astype(
        numpy.float16)
    with contextlib.redirect_stdout(io.StringIO()):
        ada = ada_loss.AdaLossScaled(model, init_scale=2.0 ** 15)
    model.cleargrads()
    ada.backward(F.sum(F.cast(model(x), numpy.float32)))
    alpha = lin.W._loss_scale
    assert alpha < 2.0 ** 15
    assert numpy.isfinite(lin.W.grad).all() and numpy.isfinite(
        lin.b.grad).all()
    want = numpy.tile(x.astype(numpy.float64).sum(axis=0), (3, 1))
    numpy.testing.assert_allclose(lin.W.grad.astype(numpy.float64) / alpha,
                                  want, rtol=2.0 ** -10)
    assert lin.b._loss_scale == alpha
    numpy.testing.assert_array_equal(lin.b.grad.astype(numpy.float64) / alpha,
                                     numpy.full(3, 8.0))
