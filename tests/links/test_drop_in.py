"""Chainer's dtype contract and keyword arguments, for the ada_loss GEMM
links and functions, built directly and after AdaLossScaled conversion.

Chainer 7.8.1's contract for linear / convolution_2d / deconvolution_2d with
x and W of different float dtypes: the output has x's dtype, each gradient
its own input's dtype; the values are Chainer's (an FP16 operand widens
exactly, so with x in float32/float64 the values are equal bit for bit).
With x in float16 Chainer computes parts in NumPy's float16 arithmetic (the
bias add, float16 dot products) where the emulated FP16 GEMMs accumulate in
FP32: there the values must agree within the tolerances Chainer's own tests
of these functions use for float16 (atol 1e-2, rtol 5e-2; the emulation is
at most a few FP16 steps from NumPy's float16). The bias has x's dtype
(Chainer's type check).
"""
import contextlib
import io
import itertools

import numpy
import pytest

import chainer
import chainer.functions as F
import chainer.links as L

import ada_loss
from ada_loss import functions as AF
from ada_loss import links as AL

DTYPES = [numpy.float16, numpy.float32, numpy.float64]
PAIRS = list(itertools.product(DTYPES, DTYPES))
PAIR_IDS = ['x{}-W{}'.format(numpy.dtype(x).name, numpy.dtype(w).name)
            for x, w in PAIRS]

# (name, link factory (module, W dtype), x shape)
LINKS = [
    ('linear', lambda m, d: m.Linear(6, 4, initialW=_init(d),
                                     initial_bias=_init(d)), (3, 6)),
    ('conv', lambda m, d: m.Convolution2D(4, 6, 3, stride=2, pad=1,
                                          groups=2, initialW=_init(d),
                                          initial_bias=_init(d)),
     (2, 4, 5, 5)),
    ('dilated', lambda m, d: m.DilatedConvolution2D(
        3, 4, 3, pad=2, dilate=2, initialW=_init(d), initial_bias=_init(d)),
     (2, 3, 6, 6)),
    ('deconv', lambda m, d: m.Deconvolution2D(4, 6, 3, stride=2, pad=1,
                                              groups=2, initialW=_init(d),
                                              initial_bias=_init(d)),
     (2, 4, 3, 3)),
]


def _init(dtype):
    return chainer.initializers.Normal(1.0, dtype=dtype)


def _run(link, x, gy_seed):
    """y, gx, gW, gb of one forward/backward (bias in x's dtype)."""
    link.b.array = link.b.array.astype(x.dtype)
    link.cleargrads()
    xv = chainer.Variable(x.copy())
    y = link(xv)
    y.grad = numpy.random.RandomState(gy_seed).standard_normal(
        y.shape).astype(y.dtype)
    y.backward()
    return y.array, xv.grad, link.W.grad, link.b.grad


def _pair_of_links(factory, w_dtype, seed):
    numpy.random.seed(seed)
    ref = factory(L, w_dtype)
    numpy.random.seed(seed)
    ours = factory(AL, w_dtype)
    return ref, ours


def _native_if_all_fp16(*arrays):
    """All-FP16 GEMMs are emulated by default (FP32 accumulation, at most
    one FP16 step from NumPy's float16 arithmetic); NumPy's own float16 path
    (``fp16_gemm='native'``) is Chainer's computation."""
    if all(a.dtype == numpy.float16 for a in arrays):
        return chainer.using_config('fp16_gemm', 'native')
    return contextlib.nullcontext()


def _same(g, w, x_dtype, what):
    if x_dtype != numpy.float16:
        assert numpy.array_equal(g, w), what
    else:
        numpy.testing.assert_allclose(g.astype(numpy.float64),
                                      w.astype(numpy.float64), atol=1e-2,
                                      rtol=5e-2, err_msg=what)


def _check(ref, ours, x):
    want = _run(ref, x, 1)
    with _native_if_all_fp16(x, ours.W.array):
        got = _run(ours, x, 1)
    for what, w, g, dtype in zip(('y', 'gx', 'gW', 'gb'), want, got,
                                 (x.dtype, x.dtype, ours.W.dtype, x.dtype)):
        assert g.dtype == w.dtype == dtype, what
        _same(g, w, x.dtype, what)


@pytest.mark.parametrize('x_dtype, w_dtype', PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize('name, factory, shape', LINKS,
                         ids=[c[0] for c in LINKS])
def test_links_follow_chainers_dtype_contract(name, factory, shape, x_dtype,
                                              w_dtype):
    ref, ours = _pair_of_links(factory, w_dtype, 0)
    x = numpy.random.RandomState(2).standard_normal(shape).astype(x_dtype)
    _check(ref, ours, x)


@pytest.mark.parametrize('x_dtype, w_dtype', PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize('name, factory, shape', LINKS,
                         ids=[c[0] for c in LINKS])
def test_converted_links_follow_chainers_dtype_contract(
        name, factory, shape, x_dtype, w_dtype):
    """The same after AdaLossScaled converts a Chainer model; and its
    ⟨α, δ⟩ backward gives each gradient its input's dtype too."""
    ref, _ = _pair_of_links(factory, w_dtype, 0)
    converted, _ = _pair_of_links(factory, w_dtype, 0)
    model = chainer.Sequential(converted)
    with contextlib.redirect_stdout(io.StringIO()):
        ada = ada_loss.AdaLossScaled(model, verbose=False)
    assert isinstance(converted, AL.__dict__[type(ref).__name__])
    x = numpy.random.RandomState(2).standard_normal(shape).astype(x_dtype)
    _check(ref, converted, x)
    converted.cleargrads()
    xv = chainer.Variable(x)
    loss = F.sum(F.cast(model(xv), numpy.float32) ** 2)
    ada.backward(loss)
    assert xv.grad.dtype == x_dtype
    assert converted.W.grad.dtype == w_dtype
    assert converted.b.grad.dtype == x_dtype


FUNCS = [
    ('linear', AF.linear, F.linear, (3, 6), (4, 6), {}),
    ('conv', AF.convolution_2d, F.convolution_2d, (2, 4, 5, 5),
     (6, 2, 3, 3), dict(stride=2, pad=1, groups=2)),
    ('deconv', AF.deconvolution_2d, F.deconvolution_2d, (2, 4, 3, 3),
     (4, 3, 3, 3), dict(stride=2, pad=1, groups=2)),
]


@pytest.mark.parametrize('x_dtype, w_dtype', PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize('name, ours, ref, xs, ws, kw', FUNCS,
                         ids=[c[0] for c in FUNCS])
def test_functions_follow_chainers_dtype_contract(name, ours, ref, xs, ws,
                                                  kw, x_dtype, w_dtype):
    rs = numpy.random.RandomState(3)
    x = rs.standard_normal(xs).astype(x_dtype)
    W = rs.standard_normal(ws).astype(w_dtype)
    outs = []
    for f in (ref, ours):
        xv, Wv = chainer.Variable(x.copy()), chainer.Variable(W.copy())
        with _native_if_all_fp16(x, W):
            y = f(xv, Wv, **kw)
        y.grad = numpy.random.RandomState(4).standard_normal(
            y.shape).astype(y.dtype)
        with _native_if_all_fp16(x, W):
            y.backward()
        outs.append((y.array, xv.grad, Wv.grad))
    for what, w, g, dtype in zip(('y', 'gx', 'gW'), outs[0], outs[1],
                                 (x_dtype, x_dtype, w_dtype)):
        assert g.dtype == w.dtype == dtype, what
        _same(g, w, x_dtype, what)


def test_chainers_keyword_arguments_are_accepted():
    x = numpy.ones((1, 2, 4, 4), numpy.float32)
    W = numpy.ones((3, 2, 3, 3), numpy.float32)
    y = AF.convolution_2d(x, W, cudnn_fast=False, dilate=1, groups=1)
    numpy.testing.assert_array_equal(
        y.array, F.convolution_2d(x, W, cudnn_fast=False).array)
    # and rejected as Chainer rejects them
    for f in (AF.convolution_2d, AF.deconvolution_2d):
        with pytest.raises(ValueError, match='deterministic argument'):
            f(x, W if f is AF.convolution_2d else W.transpose(1, 0, 2, 3),
              deterministic=True)
        with pytest.raises(TypeError, match='unexpected'):
            f(x, W, bogus=1)
    with pytest.raises(RuntimeError, match='cudnn_fast'):
        AF.convolution_2d(x, W, cudnn_fast=True)      # as Chainer on CPU
    link = AL.Convolution2D(2, 3, 3)
    assert link(x).shape == (1, 3, 2, 2)


def test_conversion_keeps_identity_params_and_float32_results():
    conv = L.Convolution2D(3, 4, 3, pad=1)
    lin = L.Linear(4 * 5 * 5, 2)
    model = chainer.Sequential(conv, F.relu, lin)
    x = numpy.random.RandomState(5).standard_normal(
        (2, 3, 5, 5)).astype(numpy.float32)
    before = model(x).array
    params = {n: (p, p.array.copy()) for n, p in model.namedparams()}
    assert AL.as_gemm_link(conv) and AL.as_gemm_link(lin)
    assert type(conv) is AL.Convolution2D and type(lin) is AL.Linear
    assert model[0] is conv
    assert {n: p for n, (p, _) in params.items()} == dict(model.namedparams())
    for n, p in model.namedparams():
        assert numpy.array_equal(p.array, params[n][1])
    assert numpy.array_equal(model(x).array, before)
    # explicit and reversible; subclasses are left alone
    assert AL.as_chainer_link(conv) and type(conv) is L.Convolution2D

    class Mine(L.Linear):
        pass
    assert not AL.as_gemm_link(Mine(3, 2))
