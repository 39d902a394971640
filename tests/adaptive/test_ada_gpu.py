"""The ⟨α, δ⟩ backward on a GPU: in float32 it changes nothing (bit-identical
updates to plain backprop, as tests/adaptive/test_ada_exactness.py checks on
the CPU), its scales stay on the device, and one backward pass makes no
host synchronization at all."""
import copy

import chainer
import numpy as np
import pytest

from ada_loss.adaptive import AdaLossScaled
from ada_loss.models import build_model
from ada_loss.training import Classifier, dtype_config
from ada_loss.training.updater import all_grads_finite

from ada_test_helpers import is_pow2
from gpu_helpers import (
    count_synchronizations, requires_gpu, to_cpu, waits_for_device)
from test_ada_exactness import (
    MLP, MultiHeadNet, ResBlockNet, _mlp_loss, _multihead_loss)

pytestmark = requires_gpu

DEVICE = '@cupy:0'


def _params(model):
    return {n: to_cpu(p.array).copy() for n, p in sorted(model.namedparams())}


def _run_both_on_gpu(make_model, batches, loss_of, seed, init_scale=1.0):
    import cupy
    np.random.seed(seed)
    plain = make_model()
    loss_of(*batches[0])(plain)
    plain.cleargrads()
    ada_model = copy.deepcopy(plain)
    plain.to_device(DEVICE)
    ada_model.to_device(DEVICE)
    ada = AdaLossScaled(ada_model, init_scale=init_scale, verbose=False)
    opts = []
    for m in (plain, ada_model):
        opt = chainer.optimizers.MomentumSGD(lr=0.1, momentum=0.9)
        opt.setup(m)
        opts.append(opt)
    for batch in batches:
        batch = tuple(cupy.asarray(b) for b in batch)
        before = _params(plain)
        for model, opt, a in ((plain, opts[0], None),
                              (ada_model, opts[1], ada)):
            model.cleargrads()
            loss = loss_of(*batch)(model)
            if a is None:
                loss.backward()
            else:
                a.backward(loss)
                # the scales are device arrays until read
                rec = next(iter(a._records.values()))
                assert isinstance(rec[0], cupy.ndarray)
            opt.update()
        after_p, after_a = _params(plain), _params(ada_model)
        assert all(not np.array_equal(before[n], after_p[n]) for n in before)
        bad = [n for n in after_p if not np.array_equal(after_p[n],
                                                         after_a[n])]
        assert not bad, 'parameters differ on the GPU: {}'.format(bad)
        alphas, betas = ada.loss_scales(), ada.layer_scales()
        assert all(is_pow2(v) for v in list(alphas.values())
                   + list(betas.values()))
        assert max(betas.values()) > 1
    return ada


def test_mlp_bit_exact_on_gpu():
    rng = np.random.RandomState(0)
    batches = [(rng.randn(16, 20).astype(np.float32),
                rng.randint(0, 5, 16).astype(np.int32)) for _ in range(2)]
    ada = _run_both_on_gpu(MLP, batches, _mlp_loss, 0, init_scale=8.0)
    alphas, betas = ada.loss_scales(), ada.layer_scales()
    assert alphas['l3'] == 8.0
    assert alphas['l2'] == alphas['l3'] * betas['l3']


def test_resblock_bit_exact_on_gpu():
    rng = np.random.RandomState(2)
    batches = [(rng.randn(4, 3, 6, 6).astype(np.float32),
                rng.randint(0, 5, 4).astype(np.int32)) for _ in range(2)]
    ada = _run_both_on_gpu(ResBlockNet, batches, _mlp_loss, 2)
    alphas, betas = ada.loss_scales(), ada.layer_scales()
    branch = alphas['conv1'] * betas['conv1']
    assert branch != alphas['conv2']           # Algorithm 5 really ran
    assert alphas['conv0'] == max(branch, alphas['conv2'])


def test_multihead_bit_exact_on_gpu():
    rng = np.random.RandomState(3)
    batches = [(rng.randn(2, 3, 8, 8).astype(np.float32),)
               for _ in range(2)]
    ada = _run_both_on_gpu(MultiHeadNet, batches, _multihead_loss, 3)
    alphas, betas = ada.loss_scales(), ada.layer_scales()
    arriving = {h: alphas[h] * betas[h]
                for h in ('head0', 'head1', 'head2', 'extra')}
    assert alphas['base'] == max(arriving.values())


def test_gpu_scales_equal_cpu_scales_in_float32():
    """Same model, same data: the α and β the GPU computes equal the CPU's
    (float32 GEMMs of cuBLAS and OpenBLAS differ in rounding only, which a
    power of two rounded down absorbs on these data)."""
    rng = np.random.RandomState(2)
    x = rng.randn(4, 3, 6, 6).astype(np.float32)
    t = rng.randint(0, 5, 4).astype(np.int32)
    np.random.seed(2)
    cpu = ResBlockNet()
    _mlp_loss(x, t)(cpu)
    gpu = copy.deepcopy(cpu)
    gpu.to_device(DEVICE)
    a_cpu = AdaLossScaled(cpu, verbose=False)
    a_gpu = AdaLossScaled(gpu, verbose=False)
    import cupy
    a_cpu.backward(_mlp_loss(x, t)(cpu))
    a_gpu.backward(_mlp_loss(cupy.asarray(x), cupy.asarray(t))(gpu))
    assert a_cpu.loss_scales() == a_gpu.loss_scales()
    assert a_cpu.layer_scales() == a_gpu.layer_scales()


@pytest.mark.parametrize('precision', ['float32', 'mixed16', 'fp8_e4m3'])
@pytest.mark.parametrize('interval', [1, 100])
def test_backward_makes_no_host_synchronization(precision, interval):
    """ResNet-20, adaptive with its overflow guard: the whole ⟨α, δ⟩
    backward (statistics, β, Algorithm 5, rescaling, the fits of the guard
    and of the weight and bias gradients, the α of every leaf) runs without
    the host waiting for the device once (the fits are decided on the
    device: issue 35 item 2). The finite check after it is the step's one
    synchronization."""
    import cupy
    np.random.seed(0)
    with dtype_config(precision):
        model = Classifier(build_model('resnet20', 10), precision)
    model.to_device(DEVICE)
    fmt = 'fp8_e4m3' if precision == 'fp8_e4m3' else 'float16'
    ada = AdaLossScaled(model, update_interval=interval, fmt=fmt,
                        verbose=False)
    rng = np.random.RandomState(0)
    x = cupy.asarray(rng.standard_normal((32, 3, 32, 32)).astype(np.float32))
    t = cupy.asarray(rng.randint(0, 10, 32).astype(np.int32))

    def one_backward():
        model.cleargrads()
        loss = model(x, t)
        cupy.cuda.Device().synchronize()
        return lambda: ada.backward(loss)

    with chainer.using_config('train', True):
        one_backward()()            # compiles the kernels, fills the pool
        assert count_synchronizations(one_backward()) == 0
        if precision != 'fp8_e4m3':
            # (the emulated format's pass launches more kernels than the
            # launch queue holds behind a spinning kernel)
            assert not waits_for_device(one_backward())
    scales = ada.loss_scales()
    assert len(scales) == 20 and all(is_pow2(v) for v in scales.values())
    assert count_synchronizations(
        lambda: all_grads_finite(model)) == 1


@pytest.mark.parametrize('precision', ['float32', 'mixed16'])
def test_batched_weight_statistics_change_no_bit(precision, monkeypatch):
    """ResNet-20: the weight statistics of all layers in one launch before
    the backward (issue 35 item 1) give the same β's and the same scaled
    gradients, bit for bit, as one launch per layer; with batching on, the
    one-layer kernel is not launched at all during the backward."""
    import cupy
    from ada_loss.loss_scale import device
    calls = []
    one_layer = device.weight_statistics

    def counted(W, axes):
        calls.append(W.shape)
        return one_layer(W, axes)
    monkeypatch.setattr(device, 'weight_statistics', counted)
    rng = np.random.RandomState(3)
    x = cupy.asarray(rng.standard_normal((16, 3, 32, 32)).astype(np.float32))
    t = cupy.asarray(rng.randint(0, 10, 16).astype(np.int32))
    results = []
    for batched in (True, False):
        np.random.seed(0)
        with dtype_config(precision):
            model = Classifier(build_model('resnet20', 10), precision)
        model.to_device(DEVICE)
        ada = AdaLossScaled(model, verbose=False)
        ada.uses_weight_statistics = batched
        del calls[:]
        with chainer.using_config('train', True):
            model.cleargrads()
            ada.backward(model(x, t))
        assert (len(calls) == 0) == batched, len(calls)
        results.append((ada.layer_scales(), ada.loss_scales(),
                        {n: to_cpu(p.grad) for n, p in model.namedparams()}))
    (b1, a1, g1), (b2, a2, g2) = results
    assert b1 == b2 and a1 == a2 and len(b1) >= 19
    for n in g1:
        np.testing.assert_array_equal(g1[n], g2[n], err_msg=n)
