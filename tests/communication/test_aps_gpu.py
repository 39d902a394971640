"""APS (Han et al., Algorithm 1) on CuPy arrays gives the NumPy path's bits:
the simulator's reduction (FINDMAXEXP, the power-of-two shift, the rounding
to the format, the sum in ring / hierarchical order, naive or Kahan, FP32
layers, × 1/p and the unshift), its pieces, the wire codec (encode, decode,
round_encode, pack, the ⊕ tables) and the wire mode's entry point; and the
simulator updater trains a small CNN on the GPU with finite parameters.
Inputs span float32's whole range — subnormals, zeros, all-zero layers,
Inf/NaN — where the GPU's float32 arithmetic would flush subnormals.
Skipped without a GPU."""
import numpy
import pytest

from ada_loss.communication import CommPolicy, StepReduction
from ada_loss.communication import exponents as X
from ada_loss.communication.codes import WireCodec
from ada_loss.communication.summation import low_precision_sum
from ada_loss.formats import get_format

from gpu_helpers import requires_gpu, to_cpu, to_gpu

pytestmark = requires_gpu

FORMATS = ['e5m2', 'e4m3', 'e3m0', 'fp8_e4m3', 'fp8_e5m2', 'fp6_e2m3',
           'fp4_e2m1', 'bfloat16', 'float16', 'float32']
SIZES = [[1], [7, 0, 130], [64, 3, 1000, 1, 17], [4096, 5, 33]]


def _bits(a):
    return numpy.ascontiguousarray(a, numpy.float32).view(numpy.uint32)


def assert_same(got, want):
    """Equal NaN positions, equal bits elsewhere (a NaN's payload is not
    specified: the GPU's Inf − Inf is another NaN than x86's)."""
    same_bits(to_cpu(got), want)


def same_bits(got, want):
    got, want = numpy.asarray(got), numpy.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    nan = numpy.isnan(want)
    assert numpy.array_equal(numpy.isnan(got), nan)
    bad = numpy.flatnonzero(_bits(got)[~nan] != _bits(want)[~nan])
    assert bad.size == 0, (bad[:5], got[~nan][bad[:5]], want[~nan][bad[:5]])


def gradients(rng, p, sizes, special=False):
    """``(p, n)`` float32: per layer a random binade from 2^-150 to 2^120
    (subnormal layers included), scattered zeros and subnormals, the middle
    layer all zeros on every worker; ``special``: an Inf on one worker in
    the first layer, a NaN in the last."""
    n = sum(sizes)
    g = numpy.empty((p, n), numpy.float32)
    at = 0
    for i, size in enumerate(sizes):
        e = rng.randint(-150, 121)
        with numpy.errstate(all='ignore'):
            seg = (rng.standard_normal((p, size)) * 2.0 ** e).astype(
                numpy.float32)
        seg[rng.random_sample((p, size)) < 0.1] = 0
        tiny = rng.random_sample((p, size)) < 0.05
        seg[tiny] = (rng.randint(-(1 << 23), 1 << 23, tiny.sum()) *
                     2.0 ** -149).astype(numpy.float32)
        if i == len(sizes) // 2 and len(sizes) > 1:
            seg[...] = 0
        g[:, at:at + size] = seg
        at += size
    if special and n > 1:
        g[p - 1, 0] = numpy.inf
        g[0, n - 1] = numpy.nan
    return g


def policies(fmt, p):
    out = [CommPolicy(fmt), CommPolicy(fmt, kahan=True),
           CommPolicy(fmt, aps=False),
           CommPolicy(fmt, fp32_layers=['l1', 'l3'])]
    if p % 2 == 0:
        out.append(CommPolicy(fmt, order='hierarchical', group_size=2,
                              kahan=True))
    return out


@pytest.mark.parametrize('fmt', FORMATS)
@pytest.mark.parametrize('p', [1, 2, 3, 8])
def test_simulator_reduction_equals_numpy(fmt, p):
    rng = numpy.random.RandomState(p * 101 + FORMATS.index(fmt))
    for sizes in SIZES:
        names = ['l{}'.format(i) for i in range(len(sizes))]
        for special in (False, True):
            g = gradients(rng, p, sizes, special)
            dev = to_gpu(g)
            for pol in policies(fmt, p):
                plan = StepReduction(pol, names, sizes, p)
                with numpy.errstate(all='ignore'):
                    want = plan.mean_of_stacked(g)
                    ref = plan.mean_of_stacked(g, reference=True)
                same_bits(ref, want)      # the two NumPy routes agree
                assert_same(plan.mean_of_stacked(dev), want)


@pytest.mark.parametrize('fmt', ['e5m2', 'e3m0', 'fp8_e4m3', 'bfloat16',
                                 'float32'])
def test_reduction_pieces_equal_numpy(fmt):
    """The exponent bytes, the payloads (shift + rounding), the sums in
    both orders and the finish, one at a time."""
    rng = numpy.random.RandomState(7)
    p, sizes = 4, [300, 1, 0, 2000, 9]
    names = ['a', 'b', 'c', 'd', 'e']
    g = gradients(rng, p, sizes, special=True)
    dev = to_gpu(g)
    plan = StepReduction(CommPolicy(fmt, fp32_layers=['e']), names, sizes, p)
    segs = plan.segments
    assert numpy.array_equal(
        X.stacked_layer_max_exps(dev, segs, p),
        X.stacked_layer_max_exps(g, segs, p))
    agreed = plan.stacked_max_exps(g)
    assert numpy.array_equal(plan.stacked_max_exps(dev), agreed)
    shift, bad = plan.shifts(agreed)
    with numpy.errstate(all='ignore'):
        payload = plan.encode(g, shift)
    payload_dev = plan.encode(dev, to_gpu(shift))
    assert_same(payload_dev, payload)
    f = get_format(fmt)
    for order, k in (('ring', None), ('hierarchical', 2)):
        for kahan in (False, True):
            with numpy.errstate(all='ignore'):
                want = low_precision_sum(payload, f, order, k, kahan)
            assert_same(low_precision_sum(payload_dev, f, order, k, kahan),
                        want)
    with numpy.errstate(all='ignore'):
        total = low_precision_sum(payload, f)
        want = plan.finish(total.copy(), shift, bad)
    assert_same(plan.finish(to_gpu(total), to_gpu(shift), to_gpu(bad)), want)


def test_fp32_sums_keep_subnormals():
    """The FP32 layers' ring sum of subnormals (flushed to 0 by plain
    float32 arithmetic on the GPU) and the mean."""
    rng = numpy.random.RandomState(3)
    g = (rng.randint(-(1 << 23), 1 << 23, (5, 1000)) * 2.0 ** -149).astype(
        numpy.float32)
    f32 = get_format('float32')
    assert_same(low_precision_sum(to_gpu(g), f32), low_precision_sum(g, f32))
    plan = StepReduction(CommPolicy('float32', aps=False), ['w'], [1000], 5)
    mean = plan.mean_of_stacked(g)
    assert (mean != 0).sum() > 900
    assert_same(plan.mean_of_stacked(to_gpu(g)), mean)


def _format_values(fmt, rng, n=20000):
    """Values of the format (quantize's outputs) over its whole range,
    zeros, ±Inf / NaN where the format has them."""
    f = get_format(fmt)
    with numpy.errstate(all='ignore'):
        x = (rng.standard_normal(n) * 2.0 ** rng.randint(
            f.emin - f.man_bits - 3, f.emax + 2, n)).astype(numpy.float32)
        x[:4] = [0, -0.0, numpy.inf, -numpy.inf]
        return f.quantize(x)


@pytest.mark.parametrize('fmt', FORMATS)
def test_codec_equals_numpy(fmt):
    rng = numpy.random.RandomState(11)
    c = WireCodec(fmt)
    for n in (1, 2, 7, 20000):
        q = _format_values(fmt, rng)[:n]
        finite_or_inf = ~numpy.isnan(q)
        q = q[finite_or_inf]    # float16's NaN bytes: ml cast vs table
        n = q.size
        wire = c.encode(q)
        wire_dev = c.encode(to_gpu(q))
        assert numpy.array_equal(to_cpu(wire_dev), wire), fmt
        assert_same(c.decode(wire_dev, n), c.decode(wire, n))
        out = to_gpu(numpy.full(n, 5, numpy.float32))
        assert c.decode(wire_dev, n, out) is out
        assert_same(out, c.decode(wire, n))
    if not c.fast:
        return
    # rounding by arithmetic (any float32, shifts), packing, ⊕ tables
    y = gradients(rng, 1, [5000], special=True)[0]
    for shift in (0, 20, -30, 140, -140):
        with numpy.errstate(all='ignore'):
            want = c.round_encode(y, shift=shift)
        got = c.round_encode(to_gpu(y), shift=shift)
        assert numpy.array_equal(to_cpu(got), want), (fmt, shift)
        assert numpy.array_equal(to_cpu(c.pack(got)), c.pack(want))
    a = rng.randint(0, 256, 10001).astype(numpy.uint8)
    b = rng.randint(0, 256, 10001).astype(numpy.uint8)
    # (the tables cover every pair of bytes, codes the format lacks too)
    assert numpy.array_equal(to_cpu(c.add_codes(to_gpu(a), to_gpu(b))),
                             c.add_codes(a, b))
    assert numpy.array_equal(to_cpu(c.sub_codes(to_gpu(a), to_gpu(b))),
                             c.sub_codes(a, b))


def test_wire_mean_takes_cupy_buffers():
    MPI = pytest.importorskip('mpi4py.MPI')
    from ada_loss.communication.wire import wire_mean
    rng = numpy.random.RandomState(5)
    g = gradients(rng, 1, [100, 0, 33])[0]
    plan = StepReduction(CommPolicy('fp8_e5m2'), ['a', 'b', 'c'],
                         [100, 0, 33], 1)
    want, agreed = wire_mean(MPI.COMM_SELF, plan, g)
    got, agreed_dev = wire_mean(MPI.COMM_SELF, plan, to_gpu(g))
    assert numpy.array_equal(agreed_dev, agreed)
    assert_same(got, want)


def test_simulator_trains_on_the_gpu():
    """A few steps of the simulator updater with the model on the GPU:
    finite parameters that moved (cuBLAS vs OpenBLAS: not NumPy's bits;
    the reduction's bits are the tests above)."""
    import chainer
    from ada_loss.communication.simulator import \
        SimulatedDataParallelUpdater
    from ada_loss.datasets import get_digits
    from ada_loss.experiment.optimization import build_optimizer
    from ada_loss.models import build_model
    from ada_loss.scaling import make_loss_scaling
    from ada_loss.training import Classifier
    train, _ = get_digits(size=8)
    data = [train[i] for i in range(64)]
    for policy in (CommPolicy('e3m0'), CommPolicy('e5m2', kahan=True,
                                                  fp32_layers=['*/fc*'])):
        numpy.random.seed(0)
        model = Classifier(build_model('small_cnn', 10, in_channels=1,
                                       width=4))
        model.to_device('@cupy:0')
        opt = build_optimizer(model, 'float32', lr=0.05, momentum=0.9,
                              weight_decay=1e-4)
        before = {n: to_cpu(p.array).copy() for n, p in model.namedparams()}
        it = chainer.iterators.SerialIterator(data, 16, shuffle=False)
        up = SimulatedDataParallelUpdater(
            it, opt, make_loss_scaling('fp32', 'float32'), 4, policy,
            mode='fp32', device='@cupy:0')
        for _ in range(3):
            up.update()
        after = {n: to_cpu(p.array) for n, p in model.namedparams()}
        assert all(numpy.isfinite(v).all() for v in after.values())
        assert any(not numpy.array_equal(before[k], after[k])
                   for k in after)
