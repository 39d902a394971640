"""The ``nvfp4`` and ``fp8:recipe=blockwise`` precisions on Chainer models.

* Parsing: canonical names, options, errors.
* Training steps of the small conv net of ``test_scaled_precision.py``: the
  forward of each step equals the operands cast by the ml_dtypes references
  of ``tests/scaled_reference.py`` (NVFP4: x in 1×16 blocks along C, W in
  16×16 tiles over (O, C) at each tap with the tensor's global amax;
  blockwise: 1×128 / 128×128) through Chainer's FP32 convolution and
  linear, bit for bit.
* The backward of a linear and a convolution under full NVFP4: dgrad =
  Chainer's FP32 gradient of gy (1×16 along the output channels,
  stochastically rounded with the layer's counter words, step 0) and the
  tiled W; wgrad = the FP32 product of gy and x (a convolution: its im2col
  matrix) zero-padded to 16 rows, transformed by the reference RHT along
  the rows and cast in 1×16 blocks along them (gy stochastically, step 1).
* BF16 layers, the step counter as serialized state.
"""
import contextlib
import io

import chainer
import chainer.functions as F
from chainer.utils import conv as conv_utils
import numpy as np
import pytest

from ada_loss.datasets import get_digits
from ada_loss.formats import get_format
from ada_loss.models import SmallCNN
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, apply_precision, dtype_config,
    parse_precision, setup_optimizer)

from scaled_reference import (reference_blockwise, reference_nvfp4,
                              reference_rht)
from test_scaled_precision import Net, _batches, _fp32_grads

F32 = np.float32


@pytest.mark.parametrize('text, name', [
    ('nvfp4', 'nvfp4'),
    ('NVFP4:rht=true,sr=true,tiles=2d', 'nvfp4'),
    ('nvfp4:tiles=1d,sr=false,rht=false', 'nvfp4:rht=false,sr=false,'
     'tiles=1d'),
    ('nvfp4:bf16=conv1+fc+conv1,out=bf16', 'nvfp4:bf16=conv1+fc,out=bf16'),
    ('nvfp4:bf16=fc+conv1', 'nvfp4:bf16=conv1+fc'),   # a set: one name
    ('fp8:recipe=blockwise', 'fp8:recipe=blockwise'),
    ('fp8:pow2=true,recipe=blockwise', 'fp8:recipe=blockwise,pow2=true'),
])
def test_parse(text, name):
    p = parse_precision(text)
    assert p.name == name and parse_precision(name) == p
    assert p.default_mode == 'none' and p.emulated
    r = p.recipe
    if name.startswith('nvfp4'):
        assert (str(p.fwd), str(p.bwd), r.kind) == ('fp4_e2m1', 'fp4_e2m1',
                                                    'nvfp4')
        assert r.rht == ('rht=false' not in name)
        assert r.sr == ('sr=false' not in name)
        assert r.tiles == ('1d' if 'tiles=1d' in name else '2d')
    else:
        assert (str(p.fwd), str(p.bwd), r.kind, r.block_size) == (
            'fp8_e4m3', 'fp8_e4m3', 'blockwise', 128)
        assert r.pow2 == ('pow2' in name)


@pytest.mark.parametrize('bad', [
    'nvfp4:tiles=3d', 'nvfp4:rht=no', 'nvfp4:block=8', 'nvfp4:recipe=mx',
    'fp8_e4m3:recipe=blockwise', 'fp8:recipe=blockwise,history=4',
    'mxfp8:sr=true', 'nvfp4:out=float16'])
def test_bad(bad):
    with pytest.raises(ValueError):
        parse_precision(bad)


def _nchw_blocks(a, cast):
    """a (N, C, H, W) cast in blocks along C by cast(matrix, axis=1)."""
    m = np.ascontiguousarray(a.transpose(0, 2, 3, 1))
    q = cast(m.reshape(-1, a.shape[1])).reshape(m.shape)
    return np.ascontiguousarray(q.transpose(0, 3, 1, 2))


def _conv_w_tiles(W, cast_tile):
    """W (O, C, kh, kw) in tiles over (O, C) at each tap."""
    out = np.empty_like(W)
    for i in range(W.shape[2]):
        for j in range(W.shape[3]):
            out[:, :, i, j] = cast_tile(np.ascontiguousarray(W[:, :, i, j]))
    return out


def _ref_forward(precision, net, x):
    r = parse_precision(precision).recipe
    if r.kind == 'nvfp4':
        tile = (16, 16) if r.tiles == '2d' else None

        def act(m):
            return reference_nvfp4(m, 1)

        def wt(w, amax):
            return reference_nvfp4(w, 1, tile=tile, amax=amax)
    else:
        def act(m):
            return reference_blockwise(m, 1, pow2=r.pow2)

        def wt(w, amax):
            return reference_blockwise(w, tile=(128, 128), pow2=r.pow2)
    W = net.conv.W.array
    wamax = F32(np.abs(W).max())
    xc = _nchw_blocks(x, act)
    wc = _conv_w_tiles(W, lambda m: wt(m, wamax))
    h = F.relu(F.convolution_2d(xc, wc, net.conv.b.array, pad=1)).array
    hc = act(h.reshape(len(h), -1))
    w2 = wt(net.fc.W.array, None)
    return F.linear(hc, w2, net.fc.b.array).array


@pytest.mark.parametrize('precision', [
    'nvfp4', 'nvfp4:tiles=1d,rht=false,sr=false', 'fp8:recipe=blockwise',
    'fp8:recipe=blockwise,pow2=true'])
def test_training_steps_forward_is_the_cast_operands_in_fp32(precision):
    np.random.seed(1)
    net = Net()
    apply_precision(net, precision)
    opt = chainer.optimizers.SGD(0.1)
    opt.setup(net)
    for x, t in _batches():
        want = _ref_forward(precision, net, x)
        y = net(x)
        assert np.array_equal(y.array.view(np.uint32), want.view(np.uint32))
        net.cleargrads()
        F.softmax_cross_entropy(y, t).backward()
        assert np.isfinite(net.conv.W.grad).all()
        opt.update()
    with chainer.using_config('train', False):
        plain = F.linear(F.relu(F.convolution_2d(
            x, net.conv.W, net.conv.b, pad=1)), net.fc.W, net.fc.b).array
    assert not np.array_equal(plain, _ref_forward(precision, net, x))


def _pad16(m):
    extra = -m.shape[1] % 16
    return np.concatenate([m, np.zeros((len(m), extra), F32)], axis=1)


def _wgrad_operands(g, a, seed, step, rht):
    """The reference casts of the wgrad GEMM's (gy, x) matrices given with
    rows = the reduction: cast as the recipe holds them, transposed (the
    reduction last, so the stochastic words run in that C order), (RHT,)
    1×16 blocks along the reduction, gy stochastic; returned transposed
    back (rows = the reduction, zero-padded)."""
    g, a = np.ascontiguousarray(g.T), np.ascontiguousarray(a.T)
    if rht:
        g, a = reference_rht(_pad16(g), 1), reference_rht(_pad16(a), 1)
        return (reference_nvfp4(g, 1, sr=(seed, step)).T,
                reference_nvfp4(a, 1).T)
    # without RHT the wgrad casts run on the operands' own layout
    return (reference_nvfp4(g.T, 0, sr=(seed, step)),
            reference_nvfp4(a.T, 0))


@pytest.mark.parametrize('rht', [True, False])
def test_nvfp4_linear_backward(rht):
    precision = 'nvfp4' if rht else 'nvfp4:rht=false'
    rng = np.random.RandomState(3)
    lin = chainer.links.Linear(70, 40)
    lin.W.array *= F32(2.0) ** rng.randint(-8, 8, (40, 1))
    apply_precision(lin, precision)
    seed = lin.gemm_scaling.sr_seed
    x = chainer.Variable((rng.standard_normal((45, 70)) * 3).astype(F32))
    y = lin(x)
    gy = (rng.standard_normal(y.shape) * 1e-3).astype(F32)
    lin.cleargrads()
    y.grad = gy
    y.backward()
    assert lin.gemm_scaling.sr_step == 2
    W = lin.W.array
    wq = reference_nvfp4(W, 1, tile=(16, 16))
    gx, _ = _fp32_grads(F.linear, x.array, wq,
                        reference_nvfp4(gy, 1, sr=(seed, 0)))
    gq, xq = _wgrad_operands(gy, x.array, seed, 1, rht)
    _, gW = _fp32_grads(F.linear, xq, W, gq)
    assert np.array_equal(x.grad, gx)
    assert np.array_equal(lin.W.grad, gW)
    assert np.array_equal(lin.b.grad, gy.sum(0))
    # the transform changed the cast: not the plain wgrad of the casts
    if rht:
        gq0, xq0 = _wgrad_operands(gy, x.array, seed, 1, False)
        assert not np.array_equal(_fp32_grads(F.linear, xq0, W, gq0)[1], gW)


def test_nvfp4_convolution_backward_with_rht():
    rng = np.random.RandomState(4)
    conv = chainer.links.Convolution2D(20, 18, 3, pad=1, stride=2,
                                       nobias=True)
    apply_precision(conv, 'nvfp4')
    seed = conv.gemm_scaling.sr_seed
    xc = chainer.Variable(rng.standard_normal((3, 20, 7, 7)).astype(F32))
    yc = conv(xc)
    g = (rng.standard_normal(yc.shape) * 1e-2).astype(F32)
    conv.cleargrads()
    yc.grad = g
    yc.backward()
    Wc = conv.W.array
    wamax = F32(np.abs(Wc).max())
    wq = _conv_w_tiles(Wc, lambda m: reference_nvfp4(m, 1, tile=(16, 16),
                                                     amax=wamax))

    def conv_fn(a, w):
        return F.convolution_2d(a, w, pad=1, stride=2)
    # dgrad: gy in 1×16 blocks along O (stochastic, step 0: its words are
    # indexed in gy's own C order, the cast runs on the (N, H, W, O)
    # arrangement of the reference)
    words = _words_nchw(g, seed, 0)
    gq = _nchw_blocks_words(g, words)
    gx, _ = _fp32_grads(conv_fn, xc.array, wq, gq)
    assert np.array_equal(xc.grad, gx)
    # wgrad: im2col rows (N, H', W'), transformed, cast, one FP32 product
    col = conv_utils.im2col_cpu(xc.array, 3, 3, 2, 2, 1, 1)
    n, c, kh, kw, ho, wo = col.shape
    xm = col.transpose(0, 4, 5, 1, 2, 3).reshape(n * ho * wo, -1)
    gm = g.transpose(0, 2, 3, 1).reshape(n * ho * wo, -1)
    gmq, xmq = _wgrad_operands(gm, xm, seed, 1, True)
    _, gW = _fp32_grads(F.linear, xmq, np.zeros((18, c * kh * kw), F32),
                        gmq)
    assert np.array_equal(conv.W.grad, gW.reshape(Wc.shape))


@pytest.mark.parametrize('stride,pad,dilate,cover_all', [
    (1, 1, 1, False), (2, 1, 1, False), (2, 0, 1, True), (1, 2, 2, False),
    ((1, 2), (0, 1), (2, 1), True)])
def test_im2col_rows_equals_chainers_im2col_transposed(stride, pad, dilate,
                                                       cover_all):
    """The RHT wgrad's im2col, written straight into (C, kh, kw, N, H',
    W'), is Chainer's im2col with N moved behind the taps, exactly."""
    from ada_loss.functions.convolution_2d import _im2col_rows_cpu
    def pair(v):
        return v if isinstance(v, tuple) else (v, v)
    (sy, sx), (ph, pw), (dy, dx) = pair(stride), pair(pad), pair(dilate)
    x = np.random.RandomState(0).standard_normal((3, 5, 9, 8)).astype(
        np.float32)
    want = conv_utils.im2col_cpu(x, 3, 2, sy, sx, ph, pw,
                                 cover_all=cover_all, dy=dy, dx=dx)
    got = _im2col_rows_cpu(x, 3, 2, sy, sx, ph, pw, cover_all, dy, dx)
    assert np.array_equal(got, want.transpose(1, 2, 3, 0, 4, 5))


def _words_nchw(g, seed, step):
    from scaled_reference import reference_words
    return np.array(reference_words(g.size, seed, step),
                    np.uint64).reshape(g.shape)


def _nchw_blocks_words(g, words):
    m = np.ascontiguousarray(g.transpose(0, 2, 3, 1)).reshape(-1, g.shape[1])
    w = np.ascontiguousarray(words.transpose(0, 2, 3, 1)).reshape(m.shape)
    q = reference_nvfp4(m, 1, words=w, amax=F32(np.abs(g).max()))
    q = q.reshape(g.shape[0], g.shape[2], g.shape[3], g.shape[1])
    return np.ascontiguousarray(q.transpose(0, 3, 1, 2))


def _model(precision, seed=0):
    np.random.seed(0)
    with dtype_config(precision):
        return Classifier(SmallCNN(10, 1, width=8), precision, seed)


def _train(precision, steps, seed=0):
    data = get_digits(size=16)[0][:64]
    model = _model(precision, seed)
    opt = setup_optimizer(chainer.optimizers.SGD(0.05), model, precision)
    it = chainer.iterators.SerialIterator(data, 32, shuffle=False)
    with contextlib.redirect_stdout(io.StringIO()):
        up = MixedPrecisionUpdater(it, opt, make_loss_scaling(
            'none', precision), 'none')
    for _ in range(steps):
        up.update()
    return model


def test_bf16_layers_and_sr_state_serialized(tmp_path):
    precision = 'nvfp4:bf16=conv1+fc'
    model = _train(precision, 2)
    p = model.predictor
    bf16 = get_format('bfloat16')
    assert p.conv1.gemm_scaling is None and p.fc.gemm_scaling is None
    assert p.conv1.gemm_formats == (bf16, bf16)
    assert p.conv2.gemm_scaling.recipe.kind == 'nvfp4'
    steps = {n: l.gemm_scaling.sr_step for n, l in p.namedlinks()
             if getattr(l, 'gemm_scaling', None) is not None}
    assert steps and set(steps.values()) == {4}     # 2 casts per step
    seeds = {l.gemm_scaling.sr_seed for n, l in p.namedlinks()
             if getattr(l, 'gemm_scaling', None) is not None}
    assert len(seeds) == len(steps)                 # one stream per layer
    path = str(tmp_path / 'm.npz')
    chainer.serializers.save_npz(path, model)
    other = _model(precision)
    chainer.serializers.load_npz(path, other)
    assert other.predictor.conv2.gemm_scaling.sr_step == 4
    with np.load(path) as npz:
        assert 'predictor/conv2/gemm_scaling/sr_step' in npz.files
    with pytest.raises(ValueError, match='not GEMM layers'):
        _model('nvfp4:bf16=conv9')


def _params(model):
    return {n: p.array.copy() for n, p in model.namedparams()}


def test_run_seed_seeds_stochastic_rounding():
    """The run's seed (Classifier's, from the training config) keys every
    layer's stochastic-rounding stream: the same seed repeats a run bit
    for bit, another seed draws other words (other weights after two
    steps, from the same initial weights and batches); with sr=false the
    seed changes nothing."""
    a, again, other = (_params(_train('nvfp4', 2, seed))
                       for seed in (5, 5, 6))
    assert a.keys() == other.keys()
    for n in a:
        assert np.array_equal(a[n], again[n]), n
    differ = [n for n in a if n.endswith('/W')
              and not np.array_equal(a[n], other[n])]
    assert differ, 'seeds 5 and 6 gave the same weights'
    seeds = {s: {n: l.gemm_scaling.sr_seed
                 for n, l in _model('nvfp4', s).predictor.namedlinks()
                 if getattr(l, 'gemm_scaling', None) is not None}
             for s in (5, 6)}
    assert seeds[5].keys() == seeds[6].keys()
    assert all(seeds[5][n] != seeds[6][n] for n in seeds[5])
    assert len(set(seeds[5].values())) == len(seeds[5])   # one per layer
    plain = [_params(_train('nvfp4:sr=false', 2, s)) for s in (5, 6)]
    for n in plain[0]:
        assert np.array_equal(plain[0][n], plain[1][n]), n
    with pytest.raises(ValueError, match='seed'):
        _model('nvfp4', -1)


def test_nvfp4_deconvolution_wgrad_with_rht():
    """A deconvolution's wgrad is Chainer's Convolution2DGradW on (gy, x):
    im2col of the gradient, which is then the stochastically cast side."""
    rng = np.random.RandomState(5)
    dec = chainer.links.Deconvolution2D(18, 20, 3, stride=1, pad=1,
                                        nobias=True)
    apply_precision(dec, 'nvfp4')
    seed = dec.gemm_scaling.sr_seed
    x = rng.standard_normal((2, 18, 6, 6)).astype(F32)
    y = dec(x)                        # x needs no gradient: wgrad is step 0
    g = (rng.standard_normal(y.shape) * 1e-2).astype(F32)
    dec.cleargrads()
    y.grad = g
    y.backward()
    col = conv_utils.im2col_cpu(g, 3, 3, 1, 1, 1, 1)
    n, o, kh, kw, h, w = col.shape
    gm = col.transpose(0, 4, 5, 1, 2, 3).reshape(n * h * w, -1)
    xm = x.transpose(0, 2, 3, 1).reshape(n * h * w, -1)
    gq, xq = _wgrad_operands(gm, xm, seed, 0, True)
    _, gW = _fp32_grads(F.linear, gq, np.zeros((18, o * kh * kw), F32), xq)
    assert dec.gemm_scaling.sr_step == 1
    assert np.array_equal(dec.W.grad, gW.reshape(dec.W.shape))


@pytest.mark.parametrize('precision', ['nvfp4', 'fp8:recipe=blockwise'])
def test_power_of_two_loss_scale_passes_through_exactly(precision):
    """The tensor scale of NVFP4 (and blockwise's per-block scales) absorb
    a power-of-two loss scale exactly: fixed:4 gives none's parameters."""
    from test_scaled_precision import _step
    ref, _ = _step(precision, 'none')
    model, up = _step(precision, 'fixed:4')
    assert up.skipped_steps == 0
    for (n, p), (_, q) in zip(sorted(ref.namedparams()),
                              sorted(model.namedparams())):
        assert np.array_equal(p.array, q.array), n


def test_nvfp4_bf16_outputs():
    bf16 = get_format('bfloat16')
    np.random.seed(2)
    net = Net()
    apply_precision(net, 'nvfp4:out=bf16')
    x, t = _batches(1)[0]
    net.cleargrads()
    h = net.conv(x)
    y = net.fc(F.relu(h))
    F.softmax_cross_entropy(y, t).backward()
    for a in (h.array, y.array, net.conv.W.grad, net.fc.W.grad):
        assert np.array_equal(bf16.quantize(a), a)
    assert not np.array_equal(get_format('fp8_e4m3').quantize(h.array),
                              h.array)


class _CasedNet(chainer.Chain):
    """Link names are case-sensitive: ``FC`` and ``fc`` are two layers."""

    def __init__(self):
        super(_CasedNet, self).__init__()
        with self.init_scope():
            self.Conv1 = Net().conv
            self.FC = Net().fc


def test_bf16_layer_names_keep_their_case():
    # the precision text was lower-cased whole: 'nvfp4:bf16=Conv1+FC'
    # named layers conv1 and fc, which this model lacks, and two spellings
    # of two layer sets printed one text
    p = parse_precision('NVFP4:BF16=FC+Conv1,Out=BF16')
    assert p.recipe.bf16_layers == ('Conv1', 'FC')
    assert p.name == 'nvfp4:bf16=Conv1+FC,out=bf16'
    assert parse_precision(p.name) == p
    assert parse_precision('nvfp4:bf16=conv1+fc').name != p.name
    model = _CasedNet()
    apply_precision(model, 'nvfp4:bf16=FC')
    bf16 = get_format('bfloat16')
    assert model.FC.gemm_formats == (bf16, bf16)
    assert model.Conv1.gemm_scaling is not None
    # a space inside a name is refused, not joined ('fc None' -> 'fcnone')
    with pytest.raises(ValueError, match="bf16 layer 'fc None'"):
        parse_precision('nvfp4:bf16=conv1+fc None')
    assert parse_precision('nvfp4:bf16= conv1 + fc ').name == \
        'nvfp4:bf16=conv1+fc'
