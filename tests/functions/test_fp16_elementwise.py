"""mixed16 element-wise nodes (ada_loss.functions.relu, add,
batch_normalization) against Chainer's own float16 path, bit for bit.

The reference is always Chainer's own function on NumPy float16 arrays (or
the ada_loss function with ``chainer.config.fp16_elementwise = 'native'``,
which calls it). Every comparison is of bit patterns, strides included
(memory order decides how later reductions sum).

* ReLU forward on all 65536 float16 patterns; its gradient on all 65536 gy
  patterns against y of every class (positive, ±0, negative, subnormal,
  ±Inf, NaN), the Inf/NaN fallback included.
* Addition on the cross product of float16 edge values (subnormals, ties
  that round to even, sums that reach 65504, 65520 and overflow to ±Inf,
  ±Inf, NaN, signed zeros) and on random pairs of all magnitudes.
* Batch normalization: y, batch statistics, running averages, gx, gγ, gβ,
  for NCHW, NHWC-ordered, large feature maps (reduced runs longer than
  NumPy's 8192-element buffer, where a plain float32 copy would sum
  differently) and (N, C) inputs, with subnormal and non-finite inputs; and
  the link in training and evaluation.
* Gradient sums of an array used several times (GradAccumulation), NaN
  payloads included (NaN + NaN keeps the second operand's).
"""
import numpy
import pytest

import chainer
import chainer.functions as F
import chainer.links as L
from chainer.functions.activation.relu import ReLUGrad2

from ada_loss import functions as AF
from ada_loss import links as AL
from ada_loss.formats import widen, widen_summable
from ada_loss.functions.add import Add
from ada_loss.functions.batch_normalization import (
    Float16BatchNormalizationImpl)
from ada_loss.functions.fp16_elementwise import fp16_elementwise_mode
from ada_loss.functions.relu import ReLU, ReLUGrad
from ada_loss.training.precision_setup import apply_precision

F16, F32, U16 = numpy.float16, numpy.float32, numpy.uint16
ALL16 = numpy.arange(1 << 16, dtype=U16).view(F16)


def bits(a):
    a = getattr(a, 'array', a)
    return a.view(U16) if a.dtype == F16 else a.view(numpy.uint32)


def assert_same(a, b):
    a, b = getattr(a, 'array', a), getattr(b, 'array', b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.strides == b.strides
    assert numpy.array_equal(bits(a), bits(b))


def native():
    return chainer.using_config('fp16_elementwise', 'native')


def test_mode_switch():
    assert fp16_elementwise_mode() == 'emulated'
    with native():
        assert fp16_elementwise_mode() == 'native'
    with chainer.using_config('fp16_elementwise', 'fast'):
        with pytest.raises(ValueError, match='emulated, native'):
            fp16_elementwise_mode()


# -- ReLU ------------------------------------------------------------------
def test_relu_forward_all_patterns():
    y = AF.relu(ALL16)
    assert isinstance(y.creator, ReLU)
    with native():
        ref = AF.relu(ALL16)
    assert not isinstance(ref.creator, ReLU)
    assert_same(y, ref)
    assert_same(y, F.relu(ALL16))


def y_classes():
    """y values of every class, as ReLU outputs and as arbitrary arrays."""
    return numpy.array([1.0, 2.0 ** -24, 65504.0, numpy.inf, 0.0, -0.0,
                        -1.0, -2.0 ** -24, -numpy.inf, numpy.nan, -numpy.nan],
                       F16)


@pytest.mark.parametrize('finite_gy', [True, False])
def test_relu_grad_all_patterns(finite_gy):
    gy = ALL16
    if finite_gy:     # the bit path (no fallback)
        gy = gy[(gy.view(U16) & 0x7FFF) < 0x7C00]
    with numpy.errstate(invalid='ignore'):      # Inf * 0
        for yv in y_classes():
            y = numpy.full(gy.shape, yv, F16)
            out, = ReLUGrad(y).forward((gy,))
            ref, = ReLUGrad2(y).forward_cpu((gy,))
            assert_same(out, ref)
        # interleaved classes
        y = numpy.resize(y_classes(), gy.shape)
        assert_same(ReLUGrad(y).forward((gy,))[0],
                    ReLUGrad2(y).forward_cpu((gy,))[0])


def test_relu_backward_layouts_and_double_backward():
    rs = numpy.random.RandomState(0)
    x = _nhwc(rs.standard_normal((4, 3, 5, 6)).astype(F16))
    g = (rs.standard_normal((4, 3, 5, 6)) * 1e-6).astype(F16)   # subnormals
    gg = (rs.standard_normal((4, 3, 5, 6)) * 1e-3).astype(F16)
    outs = []
    for mode in ('emulated', 'native'):
        with chainer.using_config('fp16_elementwise', mode):
            v = chainer.Variable(x)
            y = AF.relu(v)
            gx, = chainer.grad([y], [v], grad_outputs=[chainer.Variable(g)],
                               enable_double_backprop=True)
            vg = chainer.Variable(g)
            gx2, = chainer.grad([y], [v], grad_outputs=[vg],
                                enable_double_backprop=True)
            ggy, = chainer.grad([gx2], [vg],
                                grad_outputs=[chainer.Variable(gg)])
            outs.append((y, gx, ggy))
    assert isinstance(outs[0][1].creator, ReLUGrad)
    for a, b in zip(*outs):
        assert_same(a, b)


# -- addition --------------------------------------------------------------
def add_edge_values():
    f = [0.0, -0.0, 2.0 ** -24, -2.0 ** -24, 3 * 2.0 ** -24, 2.0 ** -14,
         -2.0 ** -14, 2.0 ** -14 - 2.0 ** -24, 1.0, 1.0 + 2.0 ** -10,
         2.0 ** -11, 3 * 2.0 ** -11, -1.0, 2048.0, 1.0, 0.5, 65504.0,
         -65504.0, 16.0, 32.0, 8.0, 65472.0, 32752.0, numpy.inf, -numpy.inf,
         numpy.nan, 1e-3, -7e-5, 6e-8]
    v = numpy.array(f, F16)
    # a few NaN payloads and the largest subnormal
    extra = numpy.array([0x7E01, 0xFE00, 0x7C01, 0x03FF, 0x83FF, 0x7BFF],
                        U16).view(F16)
    return numpy.concatenate([v, extra])


def test_add_edge_value_pairs():
    v = add_edge_values()
    a, b = numpy.meshgrid(v, v)
    a, b = a.ravel(), b.ravel()
    with numpy.errstate(all='ignore'):
        ref = a + b
    # sums that round to 65504, to Inf, and ties to even are among them
    assert numpy.isinf(ref[numpy.isfinite(a) & numpy.isfinite(b)]).any()
    # below narrow's 1024-element threshold NumPy casts; pad past it
    a, b, ref = (numpy.tile(z, 8) for z in (a, b, ref))
    assert a.size >= 4096
    out, = Add().forward((a, b))
    assert_same(out, ref)


def test_add_random_pairs_and_layouts():
    rs = numpy.random.RandomState(0)
    n = 1 << 18
    with numpy.errstate(all='ignore'):
        a = rs.randint(0, 1 << 16, n).astype(U16).view(F16)    # any pattern
        b = (rs.standard_normal(n) * numpy.exp2(rs.uniform(-26, 16, n))
             ).astype(F16)
        c = (a.astype(F32) * F32(1 + 2.0 ** -11)).astype(F16)  # near ties
        for x, y in ((a, b), (b, c), (c, a), (b, -b)):
            assert_same(Add().forward((x, y))[0], x + y)
        x4 = b.reshape(16, 16, 32, 32)
        y4 = numpy.ascontiguousarray(
            c.reshape(16, 32, 32, 16).transpose(0, 3, 1, 2))
        t4 = numpy.ascontiguousarray(c.reshape(16, 32, 32, 16)).transpose(
            0, 3, 1, 2)
        for x, y in ((x4, y4), (x4, t4), (t4, x4), (t4, t4)):
            assert_same(Add().forward((x, y))[0], x + y)


def test_add_graph():
    rs = numpy.random.RandomState(0)
    a = rs.standard_normal((8, 4, 16, 16)).astype(F16)
    b = rs.standard_normal((8, 4, 16, 16)).astype(F16)
    va, vb = chainer.Variable(a), chainer.Variable(b)
    y = AF.add(va, vb)
    assert isinstance(y.creator, Add)
    g = rs.standard_normal(a.shape).astype(F16)
    y.grad = g
    y.backward()
    assert va.grad is g or numpy.array_equal(bits(va.grad), bits(g))
    assert_same(y, F.add(a, b))
    # broadcasting goes through Add too (bit for bit: test_add_broadcast_*);
    # float32, a scalar addend and a single addend go to Chainer
    assert isinstance(AF.add(va, vb[:1]).creator, Add)
    assert not isinstance(AF.add(a.astype(F32), b.astype(F32)).creator, Add)
    assert not isinstance(AF.add(va, F16(2)).creator, Add)
    assert not isinstance(AF.add(va).creator, Add)


def random_halves(rs, shape, nan_share=0.25):
    """float16 arrays of any pattern, a share of them NaNs with payloads of
    both signs (quiet and signaling), the first element always one."""
    u = numpy.array(rs.randint(0, 1 << 16, shape), U16)
    nan = numpy.array(rs.uniform(size=shape) < nan_share)
    nan.reshape(-1)[:1] = True
    u[nan] = (u[nan] & U16(0x83FF)) | U16(0x7C01)
    return u.view(F16)


def chainer_sum(*xs):
    """Chainer's own F.add of float16 NumPy arrays."""
    with native(), numpy.errstate(all='ignore'):
        y = AF.add(*xs)
    assert not isinstance(y.creator, Add)
    return y


# TestMultipleAdd's shapes (Chainer 7.8.1), 0-dim ones included, and larger
# ones past widen's and narrow's table thresholds, NHWC-ordered among them
ADD_SHAPES = [
    ((3, 2), (3, 2)), ((), ()), ((1, 3), ()), ((), (2, 1, 2)),
    ((3, 1), (1, 1)), ((3, 1), (2,)), ((2, 1, 2, 1), (1, 3)),
    ((1, 5), (5, 5)), ((5, 5), (5, 1)), ((1,), (5000,)), ((5000,), (1,)),
    ((64, 1), (1, 64)), ((4, 8, 32, 32), (1, 8, 1, 1)),
    ((1, 8, 1, 1), (4, 8, 32, 32)), ((4, 8, 32, 1), (4, 8, 32, 32)),
    ((4, 8, 32, 32), 'nhwc', (1, 8, 1, 1)), ((4, 8, 32, 32), 'nhwc', ()),
    ((4, 8, 32, 32), (4, 8, 32, 32), 'nhwc'),
]


def _add_operands(rs, spec):
    xs, i = [], 0
    while i < len(spec):
        x = random_halves(rs, spec[i])
        if i + 1 < len(spec) and spec[i + 1] == 'nhwc':
            x, i = _nhwc(x), i + 1
        xs.append(x)
        i += 1
    return xs


@pytest.mark.parametrize('spec', ADD_SHAPES, ids=str)
def test_add_broadcast_two_addends_bits(spec):
    """a + b, b + a with broadcasting, any patterns, NaN + NaN included:
    values, dtype, shape and memory order of Chainer's F.add."""
    rs = numpy.random.RandomState(len(str(spec)))
    a, b = _add_operands(rs, spec)
    assert (numpy.isnan(a) & numpy.isnan(b)).any()
    for x, y in ((a, b), (b, a)):
        out = AF.add(x, y)
        assert isinstance(out.creator, Add)
        assert_same(out, chainer_sum(x, y))
        assert type(out.array) is numpy.ndarray


def test_add_broadcast_views_of_one_shape():
    """Addends of one shape, one of them a broadcast view (0 strides), NaN +
    NaN included: Chainer's bits (widen copies the view, so NumPy's loops
    for arrays of one shape run)."""
    rs = numpy.random.RandomState(2)
    for shape, row in (((64, 64), (1, 64)), ((64, 64), (64, 1)),
                       ((8, 4096), (1, 4096)), ((8, 4096), (8, 1))):
        a = random_halves(rs, shape)
        b = numpy.broadcast_to(random_halves(rs, row), shape)
        for x, y in ((a, b), (b, a)):
            assert_same(AF.add(x, y), chainer_sum(x, y))


def test_add_broadcast_nan_rule_is_needed():
    """Where an operand is broadcast NumPy's float32 loops do not all give
    NaN + NaN the float16 loop's NaN (the second operand's): without Add's
    rule for it the sum would differ, with it it does not."""
    from ada_loss.formats import narrow
    rs = numpy.random.RandomState(1)
    differs = 0
    for spec in ADD_SHAPES:
        a, b = _add_operands(rs, spec)
        with numpy.errstate(all='ignore'):
            plain = narrow(numpy.asarray(widen(b) + widen(a)))
        ref = chainer_sum(a, b).array
        differs += not numpy.array_equal(bits(plain), bits(ref))
        assert_same(Add().forward((a, b))[0], ref)
    assert differs >= 2


@pytest.mark.parametrize('n', [3, 4, 5])
@pytest.mark.parametrize('spec', [
    ((3, 2),) * 3, ((),) * 3, ((1, 3), (), (2, 1, 2, 1)),
    ((), (2, 1, 2), (3, 1)), ((3, 1), (1, 1), (2,)),
    # y += x in y's memory order, whatever x's (NHWC y, C x and back)
    ((4, 8, 32, 32), 'nhwc', (4, 8, 32, 32), 'nhwc', (4, 8, 32, 32)),
    ((4, 8, 32, 32), (4, 8, 32, 32), (4, 8, 32, 32), 'nhwc'),
    ((4, 8, 32, 32), (1, 8, 1, 1), (4, 8, 1, 32), (4, 8, 32, 32), 'nhwc'),
], ids=str)
def test_add_many_addends_bits(spec, n):
    """F.add(*xs) of 3..5 float16 arrays: MultiAdd's partial sums, each
    rounded, in MultiAdd's order and memory order."""
    rs = numpy.random.RandomState(n)
    xs = _add_operands(rs, spec)
    xs = (xs * 2)[:n]
    out = AF.add(*xs)
    assert isinstance(out.creator, Add) and len(out.creator.inputs) == n
    assert_same(out, chainer_sum(*xs))


def test_add_many_addends_rounds_each_partial_sum():
    """(65504 + 16) + (-16): each partial sum rounded to float16 (Inf), not
    the float32 sum of all three rounded once (65504)."""
    xs = [numpy.array([65504.0, 1.0], F16), numpy.array([16.0, 2.0 ** -11],
                                                         F16),
          numpy.array([-16.0, 2.0 ** -11], F16)]
    y = AF.add(*xs).array
    assert numpy.isinf(y[0]) and y[1] == 1.0     # 1 + 2^-11 rounds to 1
    assert_same(y, chainer_sum(*xs))


@pytest.mark.parametrize('spec', [
    ((3, 2),) * 3, ((),) * 3, ((1, 3), (), (2, 1, 2, 1)),
    ((4, 8, 6, 6), 'nhwc', (1, 8, 1, 1)), ((), (2, 1, 2), (3, 1))],
    ids=str)
def test_add_graph_backward_and_double_backward(spec):
    """Gradients (sum_to each input's shape) and second-order gradients of
    F.add(*xs), emulated against native: same bits."""
    rs = numpy.random.RandomState(0)
    xs = _add_operands(rs, spec)
    for x in xs:
        x[...] = rs.uniform(.5, 1, x.shape)     # in each one's memory order
    shape = numpy.broadcast_shapes(*(x.shape for x in xs))
    gy = numpy.array(rs.standard_normal(shape) * 1e-5, F16)     # subnormals
    ggs = [numpy.array(rs.standard_normal(x.shape), F16) for x in xs]
    results = []
    for mode in ('emulated', 'native'):
        with chainer.using_config('fp16_elementwise', mode):
            vs = [chainer.Variable(x) for x in xs]
            vgy = chainer.Variable(gy)
            y = AF.add(*vs)
            assert isinstance(y.creator, Add) == (mode == 'emulated')
            gxs = chainer.grad([y], vs, grad_outputs=[vgy],
                               enable_double_backprop=True)
            ggy, = chainer.grad(gxs, [vgy], grad_outputs=ggs)
            results.append([y] + list(gxs) + [ggy])
    for a, b in zip(*results):
        assert_same(a, b)


def test_add_errors_are_chainers():
    """Shapes that do not broadcast: Chainer's InvalidType for two addends
    (Add's type check), NumPy's ValueError for more (MultiAdd has none)."""
    from chainer.utils.type_check import InvalidType
    a = numpy.ones((3, 2), F16)
    b = numpy.ones((4,), F16)
    for f in (AF.add, F.add):
        with pytest.raises(InvalidType):
            f(a, b)
        with pytest.raises(ValueError):
            f(a, a, b)


@pytest.mark.parametrize('value', [1.5, -1.5, 0.0, -0.0, 2.0 ** -24,
                                   -2.0 ** -24, numpy.inf, -numpy.inf,
                                   numpy.nan])
def test_relu_zero_dim(value):
    """relu of a 0-dim float16 array: a 0-dim array (not a NumPy scalar),
    forward, backward and double backward as Chainer's."""
    x = numpy.array(value, F16)
    gy, gg = numpy.array(-3.0, F16), numpy.array(2.0 ** -20, F16)
    results = []
    for mode in ('emulated', 'native'):
        with chainer.using_config('fp16_elementwise', mode):
            v, vg = chainer.Variable(x), chainer.Variable(gy)
            y = AF.relu(v)
            assert isinstance(y.creator, ReLU) == (mode == 'emulated')
            gx, = chainer.grad([y], [v], grad_outputs=[vg],
                               enable_double_backprop=True)
            ggy, = chainer.grad([gx], [vg], grad_outputs=[
                chainer.Variable(gg)])
            results.append((y, gx, ggy))
    for a, b in zip(*results):
        assert type(a.array) is numpy.ndarray and a.shape == ()
        assert_same(a, b)


def test_drop_in_in_chainer_functions_place(monkeypatch):
    """Put in chainer.functions' place (as docs/drop_in.md's recipe does),
    relu and add still reach Chainer's own functions for what they do not
    emulate (float32, a scalar addend): no recursion."""
    monkeypatch.setattr(chainer.functions, 'relu', AF.relu)
    monkeypatch.setattr(chainer.functions, 'add', AF.add)
    x = numpy.array([[-1.0, 2.0]], F32)
    numpy.testing.assert_array_equal(F.relu(x).array, [[0.0, 2.0]])
    numpy.testing.assert_array_equal(F.add(x, x, x).array, [[-3.0, 6.0]])
    numpy.testing.assert_array_equal(F.add(x, 1.0).array, [[0.0, 3.0]])
    h = x.astype(F16)
    assert isinstance(F.add(h, h, h[:, :1]).creator, Add)
    assert isinstance(F.relu(h[0, 0, ...]).creator, ReLU)    # 0-dim


# -- batch normalization ---------------------------------------------------
def _bn_run(x, gy, mode, link_cls=L.BatchNormalization, seed=0):
    """Forward and backward in training mode through the link ``link_cls``
    or, if None, through ada_loss.functions.batch_normalization."""
    size = x.shape[1]
    with chainer.using_config('dtype', chainer.mixed16):
        bn = (link_cls or L.BatchNormalization)(size)
    rs = numpy.random.RandomState(seed)
    bn.gamma.array[...] = rs.uniform(0.5, 2.0, size)
    bn.beta.array[...] = rs.standard_normal(size)
    bn.avg_mean[...] = rs.standard_normal(size)
    bn.avg_var[...] = rs.uniform(0.5, 2.0, size)
    bn.cleargrads()
    with chainer.using_config('fp16_elementwise', mode), \
            chainer.using_config('train', True):
        vx = chainer.Variable(x)
        y = AF.batch_normalization(
            vx, bn.gamma, bn.beta, running_mean=bn.avg_mean,
            running_var=bn.avg_var) if link_cls is None else bn(vx)
        y.grad = gy
        y.backward()
        impl = y.creator._impl
    return dict(y=y.array, gx=vx.grad, ggamma=bn.gamma.grad,
                gbeta=bn.beta.grad, mean=bn.avg_mean.copy(),
                var=bn.avg_var.copy(), impl=impl)


def _nhwc(a):
    return numpy.ascontiguousarray(numpy.moveaxis(a, 1, -1)).transpose(
        0, 3, 1, 2) if a.ndim == 4 else a


def _bn_inputs(shape, layout, seed=0, scale_gy=1e-5):
    rs = numpy.random.RandomState(seed)
    x = (rs.standard_normal(shape) * 2 + 0.5).astype(F16)
    gy = (rs.standard_normal(shape) * scale_gy).astype(F16)
    if layout == 'nhwc':
        x, gy = _nhwc(x), _nhwc(gy)
    return x, gy


@pytest.mark.parametrize('shape,layout,scale_gy', [
    ((16, 8, 16, 16), 'nchw', 1e-5),   # gradients around FP16's subnormals
    ((16, 8, 16, 16), 'nhwc', 1e-5),
    # per-channel runs of 10000 > NumPy's 8192-element reduction buffer
    ((2, 3, 100, 100), 'nchw', 1e-2),
    ((2, 3, 100, 100), 'nhwc', 1e-5),
    ((64, 40), 'nchw', 1e-5),
])
def test_batch_normalization_bits(shape, layout, scale_gy):
    x, gy = _bn_inputs(shape, layout, scale_gy=scale_gy)
    fast = _bn_run(x, gy, 'emulated', AL.BatchNormalization)
    ref = _bn_run(x, gy, 'native')
    assert isinstance(fast['impl'], Float16BatchNormalizationImpl)
    assert not isinstance(ref['impl'], Float16BatchNormalizationImpl)
    if scale_gy < 1e-3:
        assert (numpy.abs(fast['gx'].astype(F32)) < 2.0 ** -14).mean() > 0.05
    for k in ('y', 'gx', 'ggamma', 'gbeta', 'mean', 'var'):
        assert_same(fast[k], ref[k])


def test_batch_normalization_reductions_need_float16_order():
    """In the (2, 3, 100, 100) case above, float32 copies summed unbuffered
    give other statistics and Σ gy: the test can tell."""
    x, gy = _bn_inputs((2, 3, 100, 100), 'nchw', scale_gy=1e-2)
    ax = (0, 2, 3)
    for a, f in ((x, 'mean'), (x, 'var'), (gy, 'sum')):
        ref = getattr(a, f)(axis=ax, dtype=F32)
        assert not numpy.array_equal(getattr(widen(a), f)(axis=ax, dtype=F32),
                                     ref)
        assert numpy.array_equal(
            getattr(widen_summable(a), f)(axis=ax, dtype=F32), ref)


def test_batch_normalization_function_and_edge_values():
    x, gy = _bn_inputs((8, 6, 12, 12), 'nchw', seed=3)
    x[:, 0] = numpy.array(2.0 ** -24, F16)    # constant channel: var 0
    x[:, 1] *= F16(2.0 ** -20)                 # subnormal inputs
    x[0, 2, 0, 0] = numpy.inf                  # a non-finite channel
    x[0, 3, 0, 0] = numpy.nan
    x[:, 4] = numpy.clip(x[:, 4].astype(F32) * 3e4, -65504, 65504)  # large
    gy[0, 5, :, :] = numpy.inf
    with numpy.errstate(all='ignore'):
        fast = _bn_run(x, gy, 'emulated', None)
        ref = _bn_run(x, gy, 'native', None)
    assert numpy.isnan(ref['y']).any()
    for k in ('y', 'gx', 'ggamma', 'gbeta', 'mean', 'var'):
        assert_same(fast[k], ref[k])


def test_batch_normalization_arguments_and_errors_are_chainers():
    """Keyword-only settings, as Chainer's: a positional eps, ``train=`` and
    an unknown keyword raise what Chainer raises."""
    x, _ = _bn_inputs((4, 3, 2, 2), 'nchw')
    g, b = numpy.ones(3, F32), numpy.zeros(3, F32)
    for f in (AF.batch_normalization, F.batch_normalization):
        assert f(x, g, b, eps=1e-3, decay=0.5).shape == x.shape
        with pytest.raises(TypeError):
            f(x, g, b, 1e-3)
        with pytest.raises(ValueError, match='train argument'):
            f(x, g, b, train=True)
        with pytest.raises(TypeError, match='unexpected'):
            f(x, g, b, epsilon=1e-3)


def test_batch_normalization_link_conversion_and_eval():
    with chainer.using_config('dtype', chainer.mixed16):
        chain = chainer.Sequential(L.BatchNormalization(4))
    apply_precision(chain, 'float32')
    assert type(chain[0]) is L.BatchNormalization
    apply_precision(chain, 'mixed16')
    assert type(chain[0]) is AL.BatchNormalization
    x, _ = _bn_inputs((8, 4, 5, 5), 'nchw')
    with chainer.using_config('train', False):
        y = chain(x)
        with native():
            ref = chain(x)
    assert_same(y, ref)


# -- gradient accumulation -------------------------------------------------
def test_gradients_of_a_reused_array_sum_like_chainer():
    """x feeds our nodes and Chainer's, one of them twice: Chainer's backward
    sums its gradients through GradAccumulation in the fast path, F.add in
    the native one; same bits, NaN payloads included."""
    rs = numpy.random.RandomState(0)
    x = rs.standard_normal((4, 8, 16, 16)).astype(F16)
    gs = [(rs.standard_normal(x.shape) * 10.0 ** -rs.uniform(3, 7, x.shape))
          .astype(F16) for _ in range(4)]
    gs[0].reshape(-1)[:3] = numpy.array([0x7E01, 0xFE00, 0x7C00],
                                        U16).view(F16)
    gs[2].reshape(-1)[:3] = numpy.array([0x7E05, 0x7E00, 0xFC00],
                                        U16).view(F16)
    # NaN + NaN keeps the second operand's payload: the order shows
    gs[3].reshape(-1)[:3] = numpy.array([0x7E07, 0xFE03, 0x7C00],
                                        U16).view(F16)
    grads = []
    for mode in ('emulated', 'native'):
        with chainer.using_config('fp16_elementwise', mode), \
                numpy.errstate(all='ignore'):
            v = chainer.Variable(x)
            ys = [AF.relu(v), F.tanh(v), AF.add(v, v),
                  AF.relu(AF.relu(v))]
            for y, g in zip(ys, gs):
                y.grad = g
            chainer.backward(ys)
            grads.append(v.grad_var)
    assert_same(grads[0], grads[1])
