"""``grad=loss``: the scaled recipes with the gradient's scale from loss
scaling (issue 32, item 1; docs/precisions.md).

* Parsing: the option on every scaled precision, canonical names that
  round-trip (``grad=scaled``, the default, left out); no default mode.
* Each GEMM's gradient operand, mode none: a linear's and a convolution's
  dgrad and wgrad equal Chainer's FP32 gradients of gy rounded *unscaled*
  by ml_dtypes (``tests/scaled_reference.py``) with W and x cast as the
  recipe casts them (per tensor: the forward's copies; MX: re-quantized
  along the dgrad and wgrad reductions), bit for bit.
* The forward equals the recipe's (``grad=scaled``) bit for bit, step
  after step (the delayed recipe's x and W histories included).
* Adaptive on values every step represents exactly (powers of two): its
  unscaled gradients equal plain FP32 backprop bit for bit, where mode none
  loses the gradient to E4M3's underflow.
* The overflow guard and the skip report see the gradient element format:
  a gradient beyond E4M3's 448 is fitted by adaptive's guard (NaN without
  it); the recipe's own scale (``grad=scaled``) needs no guard; a global
  mode's overflowing step is skipped and named.
"""
import contextlib
import io

import chainer
import chainer.functions as F
import numpy as np
import pytest

import ada_loss
from ada_loss import links as AL
from ada_loss.datasets import get_digits
from ada_loss.formats import get_format
from ada_loss.models import SmallCNN
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, apply_precision, dtype_config,
    parse_precision, setup_optimizer)

from scaled_reference import (reference_current_scale, reference_mx,
                              reference_per_tensor, reference_unscaled)

F32 = np.float32
ML_NAME = {'fp8_e4m3': 'float8_e4m3fn', 'fp8_e5m2': 'float8_e5m2',
           'fp6_e2m3': 'float6_e2m3fn', 'fp6_e3m2': 'float6_e3m2fn',
           'fp4_e2m1': 'float4_e2m1fn'}


def _bits_equal(a, b):
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32),
                                                 b.view(np.uint32))


# -- parsing ---------------------------------------------------------------
@pytest.mark.parametrize('text, name, bwd', [
    ('fp8_e4m3:recipe=current,grad=loss', 'fp8_e4m3:recipe=current,grad=loss',
     'fp8_e4m3'),
    ('FP8:grad=loss,recipe=delayed,history=16',
     'fp8:recipe=delayed,history=16,grad=loss', 'fp8_e5m2'),
    ('fp8:out=bf16,grad=loss,pow2=true,recipe=current',
     'fp8:recipe=current,pow2=true,grad=loss,out=bf16', 'fp8_e5m2'),
    ('mxfp8:grad=loss', 'mxfp8:grad=loss', 'fp8_e4m3'),
    ('mxfp6:grad=loss,scale=floor', 'mxfp6:scale=floor,grad=loss',
     'fp6_e3m2'),
    ('mxfp4:grad=loss', 'mxfp4:grad=loss', 'fp4_e2m1'),
])
def test_grad_loss_canonical_name_round_trips(text, name, bwd):
    p = parse_precision(text)
    assert p.name == name and parse_precision(p.name) == p
    assert p.recipe.grad_loss and p.grad_format is get_format(bwd)
    # the recipe without the option: grad=scaled, left out of the name
    plain = parse_precision(name.replace(',grad=loss', '').replace(
        ':grad=loss', ''))
    assert not plain.recipe.grad_loss and plain != p
    assert parse_precision(plain.name.replace(':', ':grad=scaled,', 1)
                           if ':' in plain.name else
                           plain.name + ':grad=scaled') == plain


@pytest.mark.parametrize('bad', ['mxfp8:grad=lose', 'fp8:recipe=current,grad=',
                                 'fp8_e4m3:grad=loss', 'fp8_e4m3,grad=loss',
                                 'mxfp8:grad=loss,grad=loss'])
def test_bad_grad_option(bad):
    with pytest.raises(ValueError):
        parse_precision(bad)


def test_grad_loss_needs_a_mode_named():
    """No default mode: unscaled gradients underflow without loss scaling
    (as in fp8_e4m3), and picking a method would pick among those compared;
    the loss scale targets the recipe's gradient element format."""
    for name in ('fp8_e4m3:recipe=current,grad=loss', 'mxfp8:grad=loss'):
        assert parse_precision(name).default_mode is None
        with pytest.raises(ValueError, match='grad=loss'):
            make_loss_scaling(None, name)
        assert make_loss_scaling('adaptive', name).fmt is \
            get_format('fp8_e4m3')
    assert make_loss_scaling('dynamic', 'fp8:recipe=current,grad=loss').fmt \
        is get_format('fp8_e5m2')


# -- each GEMM's gradient operand ------------------------------------------
def _fp32_grads(fn, x, W, gy):
    """Chainer's FP32 input and weight gradients of fn(x, W) at gy."""
    xv, Wv = chainer.Variable(x), chainer.Variable(W)
    y = fn(xv, Wv)
    y.grad = gy
    y.backward()
    return xv.grad, Wv.grad


def _gradient(rng, shape):
    """Entries over 2^-14 … 2^2: some below each element format's smallest
    subnormal (flushed unscaled), none above its largest value."""
    return (rng.standard_normal(shape) * 2.0 ** rng.randint(-14, 1, shape)
            ).astype(F32)


def _cast(p, a, axis):
    """x or W cast as the recipe casts it (first step: a delayed scale is
    1, TE's initial scale)."""
    r, elem = p.recipe, ML_NAME[str(p.fwd)]
    if r.kind == 'mx':
        return reference_mx(a, elem, axis, 32, r.scale_rounding)[0]
    scale = F32(1) if r.kind == 'delayed' else reference_current_scale(
        np.abs(a).max(), elem, r.pow2)
    return reference_per_tensor(a, elem, scale)


GRAD_LOSS = ['fp8_e4m3:recipe=current,grad=loss',
             'fp8:recipe=current,grad=loss',
             'fp8_e4m3:recipe=current,pow2=true,grad=loss',
             'fp8:recipe=delayed,grad=loss', 'mxfp8:grad=loss',
             'mxfp6:grad=loss', 'mxfp4:grad=loss']


@pytest.mark.parametrize('precision', GRAD_LOSS)
def test_gradient_operand_is_the_unscaled_cast(precision):
    p = parse_precision(precision)
    be = ML_NAME[str(p.bwd)]
    mx = p.recipe.kind == 'mx'
    rng = np.random.RandomState(3)
    lin = chainer.links.Linear(70, 40)
    lin.W.array *= F32(2.0) ** rng.randint(-8, 8, (40, 1))
    apply_precision(lin, precision)
    x = chainer.Variable((rng.standard_normal((48, 70)) * 3).astype(F32))
    y = lin(x)
    gy = _gradient(rng, y.shape)
    lin.cleargrads()
    y.grad = gy
    y.backward()                      # mode none: Chainer's own backward
    gq = reference_unscaled(gy, be)
    # the unscaled cast is not the recipe's: entries were flushed
    assert (gq == 0).sum() > (gy == 0).sum()
    W = lin.W.array
    gx, _ = _fp32_grads(F.linear, x.array, _cast(p, W, 0 if mx else 1), gq)
    _, gW = _fp32_grads(F.linear, _cast(p, x.array, 0 if mx else 1), W, gq)
    assert _bits_equal(x.grad, gx)
    assert _bits_equal(lin.W.grad, gW)
    assert _bits_equal(lin.b.grad, gy.sum(0))   # from the FP32 gy

    # a convolution: the same unscaled gy in dgrad and wgrad
    conv = chainer.links.Convolution2D(36, 34, 3, pad=1, nobias=True)
    apply_precision(conv, precision)
    xc = chainer.Variable(rng.standard_normal((3, 36, 5, 5)).astype(F32))
    yc = conv(xc)
    g = _gradient(rng, yc.shape)
    conv.cleargrads()
    yc.grad = g
    yc.backward()
    gq = reference_unscaled(g, be)

    def conv_fn(a, w):
        return F.convolution_2d(a, w, pad=1)

    def nhw(a):      # MX wgrad: x blocked along the flattened (N, H, W)
        c = a.transpose(1, 0, 2, 3)
        q = _cast(p, c.reshape(len(c), -1), 1).reshape(c.shape)
        return np.ascontiguousarray(q.transpose(1, 0, 2, 3))
    Wc = conv.W.array
    W_d = _cast(p, Wc, 0) if mx else _cast(p, Wc, 1)
    x_w = nhw(xc.array) if mx else _cast(p, xc.array, 1)
    gx, _ = _fp32_grads(conv_fn, xc.array, W_d, gq)
    _, gW = _fp32_grads(conv_fn, x_w, Wc, gq)
    assert _bits_equal(xc.grad, gx)
    assert _bits_equal(conv.W.grad, gW)


# -- the forward is the recipe's -------------------------------------------
class Net(chainer.Chain):
    def __init__(self):
        super(Net, self).__init__()
        with self.init_scope():
            self.conv = AL.Convolution2D(40, 8, 3, pad=1)
            self.fc = AL.Linear(128, 10)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)))


@pytest.mark.parametrize('precision', [
    'fp8_e4m3:recipe=current,grad=loss',
    'fp8:recipe=delayed,history=2,grad=loss',
    'mxfp8:grad=loss', 'mxfp4:grad=loss'])
def test_forward_is_the_recipes(precision):
    recipe = precision.replace(',grad=loss', '').replace(':grad=loss', '')
    np.random.seed(1)
    net = Net()
    twin = net.copy('copy')
    apply_precision(net, precision)
    apply_precision(twin, recipe)
    opt = chainer.optimizers.SGD(0.1)
    opt.setup(net)
    rng = np.random.RandomState(0)
    for _ in range(3):
        x = (rng.standard_normal((4, 40, 4, 4)) * 2.0 ** rng.randint(
            -6, 6, (1, 40, 1, 1))).astype(F32)
        t = rng.randint(0, 10, 4)
        for (_, a), (_, b) in zip(sorted(net.namedparams()),
                                  sorted(twin.namedparams())):
            b.array[...] = a.array
        y = net(x)
        assert _bits_equal(y.array, twin(x).array)
        net.cleargrads()
        F.softmax_cross_entropy(y, t).backward()
        opt.update()
    if 'delayed' in precision:
        # gy has no recipe scale under grad=loss, hence no amax history
        assert list(net.fc.gemm_scaling.delayed) == ['x', 'w']
        assert list(twin.fc.gemm_scaling.delayed) == ['x', 'w', 'gy']


# -- adaptive and the guard on exact values --------------------------------
class Chain3(chainer.Chain):
    """l1 → ×gain (not a GEMM: α passes through) → l2."""

    def __init__(self, gain):
        super(Chain3, self).__init__()
        self.gain = gain
        with self.init_scope():
            self.l1 = AL.Linear(4, 4, nobias=True)
            self.l2 = AL.Linear(4, 3, nobias=True)

    def forward(self, x):
        return self.l2(self.l1(x) * self.gain)


def _exact_net(seed, gain, w_exp=(-2, 0), w2_exp=None):
    """Weights with one signed power of two per row and column (of
    exponents ``w_exp``; l2's ``w2_exp`` if given), an input of powers of
    two: every forward value is one product (a power of two the recipe's
    casts keep exactly), every backward value one product too."""
    rng = np.random.RandomState(seed)
    model = Chain3(gain)
    for p, e in ((model.l1.W, w_exp), (model.l2.W, w2_exp or w_exp)):
        p.array[...] = 0
        rows, cols = p.shape
        perm = rng.permutation(cols)[:rows]
        p.array[np.arange(rows), perm] = rng.choice([-1.0, 1.0], rows) * \
            2.0 ** rng.randint(e[0], e[1] + 1, rows)
    # (l2's 3 rows read 3 of l1's 4 outputs: one row of l1's gradient is 0)
    x = (rng.choice([-1.0, 1.0], (1, 4)) * 2.0 ** rng.randint(-1, 2, (1, 4))
         ).astype(F32)
    return model, x


def _reference(model, x):
    ref = model.copy('copy')
    ref.cleargrads()
    F.sum(ref(x)[0, :]).backward()
    return {n: p.grad.copy() for n, p in ref.namedparams()}


def _backward(model, x, precision, mode):
    """Gradients (unscaled by each parameter's own α) of Σ y[0] under
    ``precision`` and a loss-scaling ``mode``, and the method."""
    apply_precision(model, precision)
    scaling = make_loss_scaling(mode, precision)
    with contextlib.redirect_stdout(io.StringIO()):
        scaling.bind(model)
    model.cleargrads()
    with np.errstate(invalid='ignore'):
        scaling.backward(F.sum(model(x)[0, :]))
    return scaling, {n: p.grad / F32(getattr(p, '_loss_scale', None) or 1)
                     for n, p in model.namedparams()}


EXACT = ['fp8_e4m3:recipe=current,pow2=true,grad=loss', 'mxfp8:grad=loss']


@pytest.mark.parametrize('precision', EXACT)
@pytest.mark.parametrize('seed', range(3))
def test_adaptive_unscaled_gradients_are_exact(precision, seed):
    """l2's weights of 2^-13 … 2^-10: l1's entering gradient lies below
    E4M3's smallest subnormal 2^-9 unscaled; adaptive's β of l2 (Eq. 1
    sees these weights) lifts it into range, and unscaling is exact."""
    model, x = _exact_net(seed, 1.0, w2_exp=(-13, -10))
    ref = _reference(model, x)
    assert all(np.abs(g).max() > 0 for g in ref.values())
    _, none = _backward(model.copy('copy'), x, precision, 'none')
    assert not np.array_equal(none['/l1/W'], ref['/l1/W'])
    assert not np.abs(none['/l1/W']).max() > 0     # all flushed
    scaling, ada = _backward(model, x, precision, 'adaptive')
    assert scaling.ada.layer_scales()['l2'] >= 2.0 ** 4
    for name in ref:
        assert _bits_equal(ada[name], ref[name]), name


@pytest.mark.parametrize('precision', EXACT)
@pytest.mark.parametrize('seed', range(3))
def test_guard_fits_an_e4m3_overflow(precision, seed):
    """×2^8 between the GEMMs: adaptive's β of l2 fits l2's own input
    gradient into E4M3; the ×2^8 after it overflows 448 where l1 rounds it
    (E4M3 'fn': NaN). The guard sees E4M3 there and fits it exactly; under
    the recipe's own gradient scale there is nothing to guard."""
    model, x = _exact_net(seed, 2.0 ** 8)
    ref = _reference(model, x)
    # mode none: the unscaled gradient (≤ 2^8) fits E4M3, nothing is lost
    _, none = _backward(model.copy('copy'), x, precision, 'none')
    for name in ref:
        assert _bits_equal(none[name], ref[name]), name
    unguarded, paper = _backward(model.copy('copy'), x, precision,
                                 'adaptive:guard=false')
    assert not np.isfinite(paper['/l1/W']).all()
    assert unguarded.last_nonfinite().layer == 'l1'   # where E4M3 overflowed
    scaling, ada = _backward(model.copy('copy'), x, precision, 'adaptive')
    assert set(scaling.ada.guarded()) == {('l1', 'in')}
    for name in ref:
        assert _bits_equal(ada[name], ref[name]), name
    recipe = precision.replace(',grad=loss', '').replace(':grad=loss', '')
    scaling, _ = _backward(model, x, recipe, 'adaptive')
    assert scaling.ada.guarded() == {}


def _updater(precision, mode):
    data = get_digits(size=16)[0][:32]
    np.random.seed(0)
    with dtype_config(precision):
        model = Classifier(SmallCNN(10, 1, width=8), precision)
    opt = setup_optimizer(chainer.optimizers.SGD(0.05), model, precision)
    it = chainer.iterators.SerialIterator(data, 32, shuffle=False)
    with contextlib.redirect_stdout(io.StringIO()):
        return MixedPrecisionUpdater(it, opt, make_loss_scaling(
            mode, precision), mode), model


def test_overflowing_step_is_skipped_and_named():
    """dynamic (2^16): the scaled loss gradient (up to 2^16/32 = 2048)
    overflows E4M3 where the classifier rounds it, unscaled: the step is
    skipped and the classifier named. The recipe's own gradient scale
    absorbs the same loss scale (no skip)."""
    up, model = _updater('fp8_e4m3:recipe=current,grad=loss', 'dynamic')
    up.update()
    assert up.skipped_steps == 1
    last = [n for n, l in model.predictor.namedlinks()
            if isinstance(l, AL.Linear)][-1].strip('/')
    assert up.last_skip.layer == 'predictor/' + last
    assert not np.isfinite(up.last_skip.max_abs)
    up, _ = _updater('fp8_e4m3:recipe=current', 'dynamic')
    up.update()
    assert up.skipped_steps == 0


# -- what grad=loss shares with the unscaled precision, and what not --------
def _linear_step(precision):
    """One fixed:4 step of a Linear on values E4M3 holds (and the recipe's
    per-tensor casts keep exactly: x·112 and W·448 are E4M3 values); its
    output y, and gW, gx, gb unscaled."""
    layer = AL.Linear(2, 2)
    layer.W.array[...] = [[1.0, 0.0625], [0.5, 1.0]]
    layer.b.array[...] = [0.1, 0.0]       # not an E4M3 value
    x = chainer.Variable(np.array([[4.0, 0.0625], [0.0625, 4.0]], F32))
    gy = np.array([[1.0, 1.0], [1.0, 0.0625]], F32)
    apply_precision(layer, precision)
    scaling = make_loss_scaling('fixed:4', precision)
    scaling.bind(layer)
    layer.cleargrads()
    y = layer(x)
    scaling.backward(F.sum(y * gy))
    return y.array, layer.W.grad / 4, x.grad / 4, layer.b.grad / 4, \
        (x.array, layer.W.array, layer.b.array, gy)


def test_grad_loss_against_the_unscaled_precision():
    """docs/precisions.md: fp8_e4m3:recipe=current,grad=loss against
    fp8_e4m3 rounds the incoming gradient the same way (here: exactly, 4·gy
    is E4M3) but differs in the forward (b and y are FP32, not E4M3) and in
    the produced gradients: FP32 under grad=loss, rounded to E4M3 at the
    mode's scale under fp8_e4m3 (gW 4.0625 vs 4.0, gx 1.0625 vs 1.0, gb
    1.0625 vs 1.0)."""
    e4m3 = get_format('fp8_e4m3')
    y8, gW8, gx8, gb8, (x, W, b, gy) = _linear_step('fp8_e4m3')
    yl, gWl, gxl, gbl, _ = _linear_step('fp8_e4m3:recipe=current,grad=loss')
    # FP32 references (the data is exact, so are these sums)
    y = x @ W.T + b
    gW, gx, gb = gy.T @ x, gy @ W, gy.sum(axis=0)
    # grad=loss: the recipe's forward (FP32 bias and output), FP32 gradients
    assert _bits_equal(yl, y)
    assert _bits_equal(gWl, gW) and _bits_equal(gxl, gx) and \
        _bits_equal(gbl, gb)
    # fp8_e4m3: b and y rounded to E4M3; each produced gradient rounded to
    # E4M3 at the scale 4 it was produced at
    assert _bits_equal(y8, e4m3.quantize(x @ W.T + e4m3.quantize(b)))
    for got, ref in ((gW8, gW), (gx8, gx), (gb8, gb)):
        assert _bits_equal(got, e4m3.quantize(4 * ref) / 4)
    assert (gWl[0, 0], gW8[0, 0]) == (4.0625, 4.0)
    assert (gxl[0, 1], gx8[0, 1]) == (1.0625, 1.0)
    assert (gbl[1], gb8[1]) == (1.0625, 1.0)


def test_grad_loss_bias_gradient_skips_the_incoming_cast():
    """docs/precisions.md: the incoming gradient's E4M3 cast is shared by
    gx and gW only; the bias gradient under the recipe (grad=loss or not)
    is summed from the gradient before its cast (TE's dbias, fused with
    the cast, reads the high-precision gradient), while fp8_e4m3 sums the
    cast one. With fixed:4 and 4·gy = 1.19 (E4M3: 1.25) in three rows:
    gb 0.8925 (= 3·1.19/4) vs 0.9375 (= 3·1.25/4), gW 0.9375 in both."""
    e4m3 = get_format('fp8_e4m3')
    gy = np.full((3, 1), 0.2975, F32)
    cast = e4m3.quantize(4 * gy)
    assert cast[0, 0] == 1.25
    got = {}
    for precision in ('fp8_e4m3', 'fp8_e4m3:recipe=current,grad=loss'):
        layer = AL.Linear(1, 1)
        layer.W.array[...] = 1.0
        layer.b.array[...] = 0.0
        x = chainer.Variable(np.ones((3, 1), F32))
        apply_precision(layer, precision)
        scaling = make_loss_scaling('fixed:4', precision)
        scaling.bind(layer)
        layer.cleargrads()
        scaling.backward(F.sum(layer(x) * gy))
        got[precision] = (layer.b.grad[0] / 4, layer.W.grad[0, 0] / 4)
    assert got['fp8_e4m3'] == (cast.sum() / 4, cast.sum() / 4)
    assert got['fp8_e4m3:recipe=current,grad=loss'] == (
        F32((4 * gy).sum()) / 4, cast.sum() / 4)
