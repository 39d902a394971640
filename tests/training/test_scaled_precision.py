"""Scaled precisions (per-tensor FP8 recipes, MX) on Chainer models.

* Parsing: names, canonical names, options and their errors.
* Training steps of a small conv net (conv 40→8 with bias, ReLU, linear
  128→10 with bias) in every recipe: the forward of each step equals an
  independent re-computation — x and W cast by the ml_dtypes references of
  ``tests/scaled_reference.py`` (per tensor: from the current amax, or for
  the delayed recipe from the previous steps' amaxes; MX: blocks of 32
  along the reduction) and Chainer's own FP32 convolution and linear on
  them — bit for bit.
* The backward: dgrad and wgrad of a linear and a convolution equal
  Chainer's FP32 gradients of the operands cast as the recipe says (MX:
  gy and W re-quantized along the dgrad reduction, gy and x along the
  wgrad reduction; per tensor: the forward's x and W copies, gy cast once).
* Loss scaling combines: one step in ``fixed:64`` and in ``adaptive``
  gives the parameters of ``none`` bit for bit (power-of-two scales pass
  through a current or MX cast exactly, and ⟨α, δ⟩ unscales exactly).
* The delayed recipe's state: not changed by evaluation, saved and loaded
  with the model.
"""
import contextlib
import io

import chainer
import chainer.functions as F
import numpy as np
import pytest

from ada_loss import links as AL
from ada_loss.datasets import get_digits
from ada_loss.formats import get_format
from ada_loss.models import SmallCNN
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, apply_precision, dtype_config,
    parse_precision, setup_optimizer)

from scaled_reference import (reference_current_scale, reference_mx,
                              reference_per_tensor)

F32 = np.float32
ML_NAME = {'fp8_e4m3': 'float8_e4m3fn', 'fp8_e5m2': 'float8_e5m2',
           'fp6_e2m3': 'float6_e2m3fn', 'fp6_e3m2': 'float6_e3m2fn',
           'fp4_e2m1': 'float4_e2m1fn'}


@pytest.mark.parametrize('text, name, fwd, bwd, kind', [
    ('fp8:recipe=current', 'fp8:recipe=current', 'fp8_e4m3', 'fp8_e5m2',
     'current'),
    ('FP8:recipe=delayed,history=1024,margin=0,pow2=false',
     'fp8:recipe=delayed', 'fp8_e4m3', 'fp8_e5m2', 'delayed'),
    ('fp8_e4m3:pow2=true,recipe=delayed,history=16,out=bf16',
     'fp8_e4m3:recipe=delayed,history=16,pow2=true,out=bf16', 'fp8_e4m3',
     'fp8_e4m3', 'delayed'),
    ('mxfp8', 'mxfp8', 'fp8_e4m3', 'fp8_e4m3', 'mx'),
    ('mxfp6:scale=floor,block=16', 'mxfp6:block=16,scale=floor', 'fp6_e2m3',
     'fp6_e3m2', 'mx'),
    ('mxfp4:out=bfloat16', 'mxfp4:out=bf16', 'fp4_e2m1', 'fp4_e2m1', 'mx'),
])
def test_parse_scaled_precision(text, name, fwd, bwd, kind):
    p = parse_precision(text)
    assert p.name == name and parse_precision(p.name) == p
    assert (str(p.fwd), str(p.bwd), p.recipe.kind) == (fwd, bwd, kind)
    assert p.emulated and p.grad_format is get_format(bwd)
    out = 'out=bf16' in name
    assert p.gemm_formats == ((get_format('bfloat16'),) * 2 if out else None)
    if kind == 'delayed':
        assert p.recipe.history == (16 if '16' in name else 1024)


@pytest.mark.parametrize('bad', [
    'fp8:recipe=later', 'fp8:history=4', 'fp8:recipe=current,history=4',
    'fp8:recipe=delayed,history=0', 'fp8:recipe=delayed,pow2=yes',
    'mxfp8:recipe=current', 'mxfp8:scale=nearest', 'mxfp8:out=float16',
    'mxfp5', 'bf16:recipe=current'])
def test_bad_scaled_precision(bad):
    with pytest.raises(ValueError):
        parse_precision(bad)


class Net(chainer.Chain):
    def __init__(self):
        super(Net, self).__init__()
        with self.init_scope():
            self.conv = AL.Convolution2D(40, 8, 3, pad=1)
            self.fc = AL.Linear(128, 10)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)))


def _batches(n=3, seed=0):
    rng = np.random.RandomState(seed)
    return [((rng.standard_normal((4, 40, 4, 4)) * 2.0 ** rng.randint(
        -6, 6, (1, 40, 1, 1))).astype(F32), rng.randint(0, 10, 4))
        for _ in range(n)]


class _Reference(object):
    """The forward of Net re-computed: operands cast by the references,
    Chainer's FP32 GEMMs; per-tensor delayed state kept by hand."""

    def __init__(self, precision):
        self.p = parse_precision(precision)
        self.history = {}

    def cast(self, key, a, axis):
        r = self.p.recipe
        elem = ML_NAME[str(self.p.fwd)]
        if r.kind == 'mx':
            return reference_mx(a, elem, axis, 32, r.scale_rounding)[0]
        amax = F32(np.abs(a).max())
        if r.kind == 'current':
            scale = reference_current_scale(amax, elem, r.pow2)
        else:    # delayed: from the previous steps' amaxes
            h = self.history.setdefault(key, [])
            scale = self.history.get(key + '/scale', F32(1))
            h.append(amax)
            past = F32(max(h[-r.history:]))
            if past > 0 and np.isfinite(past):
                new = F32(F32(F32(448.0 if elem == 'float8_e4m3fn'
                                  else 57344.0) / past) / F32(
                                      2.0 ** r.margin))
                self.history[key + '/scale'] = new
        return reference_per_tensor(a, elem, scale)

    def forward(self, net, x):
        xc = self.cast('conv/x', x, 1)
        wc = self.cast('conv/w', net.conv.W.array, 1)
        h = F.relu(F.convolution_2d(xc, wc, net.conv.b.array, pad=1)).array
        hc = self.cast('fc/x', h.reshape(len(h), -1), 1)
        w2 = self.cast('fc/w', net.fc.W.array, 1)
        return F.linear(hc, w2, net.fc.b.array).array


SCALED = ['fp8:recipe=current', 'fp8:recipe=delayed,history=2',
          'fp8_e4m3:recipe=current,pow2=true', 'mxfp8', 'mxfp6', 'mxfp4',
          'mxfp8:scale=floor']


@pytest.mark.parametrize('precision', SCALED)
def test_training_steps_forward_is_the_cast_operands_in_fp32(precision):
    np.random.seed(1)
    net = Net()
    apply_precision(net, precision)
    opt = chainer.optimizers.SGD(0.1)
    opt.setup(net)
    ref = _Reference(precision)
    for x, t in _batches():
        want = ref.forward(net, x)          # the parameters before the step
        y = net(x)
        assert np.array_equal(y.array.view(np.uint32), want.view(np.uint32))
        net.cleargrads()
        F.softmax_cross_entropy(y, t).backward()
        opt.update()
    # the operands were really cast: the plain FP32 forward differs
    with chainer.using_config('train', False):
        plain = F.linear(F.relu(F.convolution_2d(
            x, net.conv.W, net.conv.b, pad=1)), net.fc.W, net.fc.b).array
    assert not np.array_equal(plain, ref.forward(net, x))


def _linear_grads(precision, gy_scale=1.0):
    rng = np.random.RandomState(3)
    lin = chainer.links.Linear(70, 40)
    # rows of different magnitudes: blocks along either axis of W differ
    lin.W.array *= F32(2.0) ** rng.randint(-8, 8, (40, 1))
    apply_precision(lin, precision)
    x = chainer.Variable((rng.standard_normal((48, 70)) * 3).astype(F32))
    y = lin(x)
    gy = (rng.standard_normal(y.shape) * 1e-3 * gy_scale).astype(F32)
    lin.cleargrads()
    y.grad = gy
    y.backward()
    return lin, x, gy


def _fp32_grads(fn, x, W, gy):
    """Chainer's FP32 input and weight gradients of fn(x, W) at gy."""
    xv, Wv = chainer.Variable(x), chainer.Variable(W)
    y = fn(xv, Wv)
    y.grad = gy
    y.backward()
    return xv.grad, Wv.grad


@pytest.mark.parametrize('precision', ['mxfp8', 'mxfp6', 'mxfp4'])
def test_mx_backward_requantizes_along_each_reduction(precision):
    p = parse_precision(precision)
    fe, be = ML_NAME[str(p.fwd)], ML_NAME[str(p.bwd)]
    lin, x, gy = _linear_grads(precision)
    W = lin.W.array

    def mx(a, elem, axis):
        return reference_mx(a, elem, axis, 32, 'up')[0]
    gx, _ = _fp32_grads(F.linear, x.array, mx(W, fe, 0), mx(gy, be, 1))
    _, gW = _fp32_grads(F.linear, mx(x.array, fe, 0), W, mx(gy, be, 0))
    assert np.array_equal(x.grad, gx)
    assert np.array_equal(lin.W.grad, gW)
    assert np.array_equal(lin.b.grad, gy.sum(0))    # from the FP32 gy
    # re-quantizing W along its dgrad reduction is not the forward copy
    assert not np.array_equal(mx(W, fe, 0), mx(W, fe, 1))

    # a convolution: wgrad blocks along N·H·W of gy and of x
    rng = np.random.RandomState(4)
    conv = chainer.links.Convolution2D(36, 34, 3, pad=1, nobias=True)
    apply_precision(conv, precision)
    xc = chainer.Variable((rng.standard_normal((3, 36, 5, 5))).astype(F32))
    yc = conv(xc)
    g = (rng.standard_normal(yc.shape) * 1e-2).astype(F32)
    conv.cleargrads()
    yc.grad = g
    yc.backward()

    def nhw(a, elem):      # blocks along the flattened (N, H, W)
        c = a.transpose(1, 0, 2, 3)
        q = mx(c.reshape(len(c), -1), elem, 1).reshape(c.shape)
        return np.ascontiguousarray(q.transpose(1, 0, 2, 3))

    def conv_fn(a, w):
        return F.convolution_2d(a, w, pad=1)
    Wc = conv.W.array
    gx, _ = _fp32_grads(conv_fn, xc.array, mx(Wc, fe, 0), mx(g, be, 1))
    _, gW = _fp32_grads(conv_fn, nhw(xc.array, fe), Wc, nhw(g, be))
    assert np.array_equal(xc.grad, gx)
    assert np.array_equal(conv.W.grad, gW)


@pytest.mark.parametrize('precision', ['fp8:recipe=current',
                                       'fp8_e4m3:recipe=current,pow2=true'])
def test_per_tensor_backward_casts_gy_once_and_reuses_x_and_w(precision):
    p = parse_precision(precision)
    fe, be = ML_NAME[str(p.fwd)], ML_NAME[str(p.bwd)]
    lin, x, gy = _linear_grads(precision)
    pow2 = p.recipe.pow2

    def cast(a, elem):
        s = reference_current_scale(np.abs(a).max(), elem, pow2)
        return reference_per_tensor(a, elem, s)
    gq = cast(gy, be)
    gx, _ = _fp32_grads(F.linear, x.array, cast(lin.W.array, fe), gq)
    _, gW = _fp32_grads(F.linear, cast(x.array, fe), lin.W.array, gq)
    assert np.array_equal(x.grad, gx)
    assert np.array_equal(lin.W.grad, gW)


def _step(precision, mode, steps=1):
    data = get_digits(size=16)[0][:64]
    np.random.seed(0)
    with dtype_config(precision):
        model = Classifier(SmallCNN(10, 1, width=8), precision)
    opt = setup_optimizer(chainer.optimizers.SGD(0.05), model, precision)
    it = chainer.iterators.SerialIterator(data, 32, shuffle=False)
    with contextlib.redirect_stdout(io.StringIO()):
        up = MixedPrecisionUpdater(it, opt, make_loss_scaling(mode, precision),
                                   mode)
    for _ in range(steps):
        up.update()
    return model, up


@pytest.mark.parametrize('precision', ['fp8:recipe=current', 'mxfp8'])
def test_loss_scaling_modes_unscale_exactly(precision):
    ref, _ = _step(precision, 'none')
    want = {n: p.array for n, p in ref.namedparams()}
    for mode in ('fixed:64', 'adaptive'):
        model, up = _step(precision, mode)
        assert up.skipped_steps == 0
        for n, p in model.namedparams():
            assert np.array_equal(p.array, want[n]), (mode, n)
    # and the step did something in this precision that FP32 does not
    fp32, _ = _step('float32', 'none')
    assert not np.array_equal(fp32.predictor.conv2.W.array,
                              ref.predictor.conv2.W.array)


def test_default_mode_of_a_scaled_precision_is_none():
    assert parse_precision('mxfp8').default_mode == 'none'
    assert parse_precision('fp8:recipe=delayed').default_mode == 'none'
    assert type(make_loss_scaling(None, 'mxfp8')).__name__ == 'NoScaling'
    with pytest.raises(ValueError):
        make_loss_scaling(None, 'fp8')


def test_delayed_state_evaluation_and_serialization(tmp_path):
    precision = 'fp8:recipe=delayed,history=4'
    model, _ = _step(precision, 'none', steps=3)
    conv = model.predictor.conv1
    h = conv.gemm_scaling.delayed['x'].amax_history
    assert (h[:3] > 0).all() and h[3] == 0
    state = {r: (d.amax_history.copy(), d.scale)
             for r, d in conv.gemm_scaling.delayed.items()}
    x = get_digits(size=16)[1][:8]
    xs = np.stack([a for a, _ in x])
    with chainer.using_config('train', False):
        model.predictor(xs)                 # evaluation: state unchanged
    for r, d in conv.gemm_scaling.delayed.items():
        assert np.array_equal(d.amax_history, state[r][0])
        assert d.scale == state[r][1]
    path = str(tmp_path / 'm.npz')
    chainer.serializers.save_npz(path, model)
    other, _ = _step(precision, 'none', steps=0)
    chainer.serializers.load_npz(path, other)
    for r, d in other.predictor.conv1.gemm_scaling.delayed.items():
        assert np.array_equal(d.amax_history, state[r][0])
        assert d.scale == state[r][1] and d.scale != 1
    with np.load(path) as npz:
        assert 'predictor/conv1/gemm_scaling/gy/amax_history' in npz.files


@pytest.mark.parametrize('precision', ['fp8:recipe=current,out=bf16',
                                       'mxfp8:out=bf16'])
def test_bf16_outputs(precision):
    """out=bf16: every GEMM output and produced gradient is a bfloat16
    value; the forward is bf16(FP32 GEMM of the cast bf16 operands)."""
    bf16 = get_format('bfloat16')
    p = parse_precision(precision)
    fe = ML_NAME[str(p.fwd)]
    np.random.seed(2)
    net = Net()
    apply_precision(net, precision)
    x, t = _batches(1)[0]
    net.cleargrads()
    h = net.conv(x)
    y = net.fc(F.relu(h))
    F.softmax_cross_entropy(y, t).backward()
    for a in (h.array, y.array, net.conv.W.grad, net.fc.W.grad,
              net.fc.b.grad):
        assert np.array_equal(bf16.quantize(a), a)
    assert not np.array_equal(get_format('fp8_e4m3').quantize(h.array),
                              h.array)

    def cast(a, axis):
        a = bf16.quantize(a)
        if p.recipe.kind == 'mx':
            return reference_mx(a, fe, axis, 32, 'up')[0]
        s = reference_current_scale(np.abs(a).max(), fe)
        return reference_per_tensor(a, fe, s)
    want = bf16.quantize(F.convolution_2d(
        cast(x, 1), cast(net.conv.W.array, 1),
        bf16.quantize(net.conv.b.array), pad=1).array)
    assert np.array_equal(h.array, want)
