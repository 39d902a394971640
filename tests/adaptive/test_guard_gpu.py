"""The overflow guard, the skip report and the backoff of the adaptive mode
on a GPU (issue 35 item 2): decided on the device, with no host read, and
the same decisions as the NumPy path, bit for bit.

* the fit by 2^-k (:func:`ada_loss.loss_scale.device.fit_ratio`) equals
  :func:`ada_loss.loss_scale.fit.fit_ratio` on peaks around every format's
  overflow threshold, across the float32 range, Inf and NaN;
* the backoff's lowering (:func:`ada_loss.loss_scale.device.backed_off`)
  equals the host's, its floor included;
* a network whose arithmetic is exact (small integers times powers of two:
  cuBLAS and OpenBLAS sum them to the same bits) gives the same gradients,
  α's, β's, guarded layers, non-finite report and backoff on the GPU as on
  the CPU, with the guard acting on the way in and on the way out.
"""
import copy
import math

import chainer
import chainer.functions as F
import numpy as np
import pytest

import ada_loss
from ada_loss import links as AL
from ada_loss.adaptive.ada_loss_scaled import MIN_BACKOFF_SCALE, _backed_off
from ada_loss.formats import get_format
from ada_loss.loss_scale.fit import fit_ratio
from ada_loss.training import apply_precision

from gpu_helpers import count_synchronizations, requires_gpu, to_cpu

pytestmark = requires_gpu

DEVICE = '@cupy:0'
FORMATS = ['float16', 'bfloat16', 'fp8_e4m3', 'fp8_e5m2', 'fp6_e3m2',
           'fp6_e2m3', 'fp4_e2m1', 'e5m7', 'float32']


def _host_fit(peak, scale, fmt):
    """gemm._fit_ratio's host rule: 1 for a non-finite product."""
    p = float(peak) * float(scale)
    return 1.0 if not math.isfinite(p) else fit_ratio(p, fmt)


def _peaks(fmt):
    u = fmt.u_max
    rel = [0.0, 2.0 ** -149, 1e-30, 0.25, 0.5, 0.99, 0.999, 1.0, 1.0001,
           1.01, 1.02, 1.03, 1.04, 1.06, 1.1, 1.5, 1.9999, 2.0, 2.0001, 3.0,
           3.99, 4.0, 4.01, 7.9, 1e3, 1e10, 1e30]
    vals = [u * r for r in rel]
    # around the rounding boundaries just above u_max and its halves
    for k in range(-3, 5):
        base = np.float32(u * 2.0 ** k)
        vals += [float(np.nextafter(base, np.float32(np.inf))),
                 float(np.nextafter(base, np.float32(0)))]
    rng = np.random.RandomState(0)
    vals += list(np.exp2(rng.uniform(-149, 128, 300)))
    vals += [float(np.finfo(np.float32).max), np.inf, np.nan]
    # peaks are float32 maxima of arrays
    with np.errstate(over='ignore'):
        return [float(np.float32(v)) for v in vals]


@pytest.mark.parametrize('name', FORMATS)
def test_device_fit_ratio_equals_host(name):
    from ada_loss.loss_scale import device
    fmt = get_format(name)
    peaks = _peaks(fmt)
    for scale in (1.0, 2.0 ** -3, 2.0 ** 5, 2.0 ** 40):
        dev = device.to_floats([device.fit_ratio(device.scalar(p), fmt,
                                                 scale) for p in peaks])
        host = [_host_fit(p, scale, fmt) for p in peaks]
        bad = [(p, h, d) for p, h, d in zip(peaks, host, dev) if h != d]
        assert not bad, (name, scale, bad[:5])


def test_device_backoff_equals_host():
    from ada_loss.loss_scale import device
    cases = []
    for beta in (2.0 ** -30, 2.0 ** -3, 1.0, 8.0, 2.0 ** 20):
        for alpha in (2.0 ** -40, 2.0 ** -24, 2.0 ** -10, 1.0, 2.0 ** 12):
            for k in (1, 3, 6, 20, 40):
                cases.append((beta, k, alpha))
    dev = device.to_floats([device.backed_off(b, k, a, MIN_BACKOFF_SCALE)
                            for b, k, a in cases])
    host = [_backed_off(b, k, a) for b, k, a in cases]
    assert dev == host


class ExactNet(chainer.Chain):
    """Two Linear layers whose weights, inputs and products are small
    integers times powers of two: every sum is exact, in any order."""

    def __init__(self):
        super(ExactNet, self).__init__()
        rng = np.random.RandomState(1)
        w1 = rng.randint(-3, 4, (8, 6)).astype(np.float32) / 8
        w2 = rng.randint(-3, 4, (4, 8)).astype(np.float32) / 8
        with self.init_scope():
            self.l1 = AL.Linear(6, 8, initialW=w1, initial_bias=0.0)
            self.l2 = AL.Linear(8, 4, initialW=w2, initial_bias=0.0)

    def forward(self, x):
        return self.l2(F.relu(self.l1(x)))


def _batch(rng, bad=False):
    x = rng.randint(-3, 4, (16, 6)).astype(np.float32) / 4
    if bad:
        x[0, 0] = np.nan
    c = rng.randint(-4, 5, (16, 4)).astype(np.float32)
    return x, c


def _pass(model, ada, x, c, xp):
    model.cleargrads()
    loss = F.sum(model(xp.asarray(x)) * xp.asarray(c))
    ada.backward(loss)
    grads = {n: (to_cpu(p.grad) if xp is not np else p.grad.copy(),
                 1.0 if p._loss_scale is None else float(p._loss_scale))
             for n, p in model.namedparams()}
    nf = ada.last_nonfinite()
    if nf is not None:
        nf = (nf.layer, float(nf.alpha), repr(float(nf.max_abs)),
              tuple(sorted(nf.origins)))
    return (grads, ada.loss_scales(), ada.layer_scales(), ada.guarded(), nf)


#: (mode, loss multiplier of the first step and of the others, what the
#: host run shows: checked on the CPU, see each case)
CASES = {
    # the gradient entering l2 (4096·c) overflows E4M3: guarded on the way in
    'in': (dict(init_scale=2.0 ** 12), 1.0, 1.0),
    # β kept from a first step of small gradients meets large ones: the
    # input gradient l2 produces is guarded on the way out
    'out': (dict(init_scale=1.0, update_interval=100), 2.0 ** -6, 16.0),
    # no guard: the overflowing rounding is noted (the skip report)
    'noted': (dict(init_scale=2.0 ** 12, guard=False), 1.0, 1.0),
    # repeated skips back α down to the floor MIN_BACKOFF_SCALE
    'floor': (dict(init_scale=2.0 ** -20), 1.0, 1.0),
}


@pytest.mark.parametrize('case', sorted(CASES))
def test_guarded_backward_on_device_equals_host(case):
    import cupy
    mode, first, rest = CASES[case]
    cpu = ExactNet()
    apply_precision(cpu, 'fp8_e4m3')
    gpu = copy.deepcopy(cpu)
    gpu.to_device(DEVICE)
    adas = [ada_loss.AdaLossScaled(m, fmt='fp8_e4m3', verbose=False, **mode)
            for m in (cpu, gpu)]
    rng = np.random.RandomState(0)
    seen = []
    for i in range(8):
        x, c = _batch(rng, bad=i == 2)      # step 2: a NaN input (bad batch)
        c = c * np.float32(first if i == 0 else rest)
        host = _pass(cpu, adas[0], x, c, np)
        dev = _pass(gpu, adas[1], x, c, cupy)
        for n in host[0]:
            np.testing.assert_array_equal(host[0][n][0], dev[0][n][0],
                                          err_msg='step {} {}'.format(i, n))
            assert host[0][n][1] == dev[0][n][1], (i, n)
        assert host[1:] == dev[1:], i
        seen.append(host)
        # skipped steps: the bad batch (no backoff: the loss is NaN) and
        # clean ones declared skipped (every layer and α_{N+1} back off)
        for a in adas:
            a.step_done(i in (2, 3, 5, 6, 7))
        assert adas[0].backoff() == adas[1].backoff(), i
    guarded = [k for h in seen for k in h[3]]
    if case == 'in':
        assert ('l2', 'in') in guarded
    elif case == 'out':
        assert ('l2', 'out') in guarded
    elif case == 'noted':
        assert all(h[4] is not None for h in seen)
    else:
        assert min(min(h[1].values()) for h in seen) == MIN_BACKOFF_SCALE


@pytest.mark.parametrize('precision,fmt,gain', [
    ('fwd=float32,bwd=fp8_e4m3', 'fp8_e4m3', 64.0),
    ('mixed16', 'float16', 8192.0)])
def test_bias_gradient_is_fitted_on_the_device(precision, fmt, gain):
    """tests/adaptive/test_guard_defects.py's bias case on the GPU: the
    bias sum's fit is decided on the device, with no synchronization."""
    import cupy
    from test_guard_defects import OneLinear
    dtype = np.float16 if precision == 'mixed16' else np.float32
    with chainer.using_config('dtype', chainer.mixed16 if dtype ==
                              np.float16 else np.float32):
        model = OneLinear()
    apply_precision(model, precision)
    model.to_device(DEVICE)
    ada = ada_loss.AdaLossScaled(model, fmt=fmt, verbose=False)
    x = cupy.full((16, 4), 2.0 ** -6, dtype)
    for i in range(2):      # the first pass compiles and allocates
        model.cleargrads()
        loss = F.sum(model(x) * dtype(gain))
        cupy.cuda.Device().synchronize()
        syncs = count_synchronizations(lambda: ada.backward(loss))
    assert syncs == 0
    gW = to_cpu(model.l.W.grad).astype(np.float64) / float(
        model.l.W._loss_scale)
    gb = to_cpu(model.l.b.grad).astype(np.float64) / float(
        model.l.b._loss_scale)
    assert np.all(gb == 16 * gain) and np.all(gW == 16 * gain * 2.0 ** -6)
    assert float(model.l.W._loss_scale) == float(model.l.b._loss_scale) < 1


@pytest.mark.parametrize('rule', ['auto', 'amax'])
@pytest.mark.parametrize('interval', [1, 2])
def test_loss_gradient_scale_on_device_equals_host(rule, interval):
    """``init_scale='auto'`` (Eq. 1 on the loss gradient) and ``'amax'``
    (its peak in the top binade) decided on the device, without a read:
    α_{N+1} step after step equals the host's (the loss gradient here is
    small integers: its moments are exact in any order), the old value kept
    after the NaN batch; and the pass makes no synchronization."""
    import cupy
    cpu = ExactNet()
    apply_precision(cpu, 'fp8_e4m3')
    gpu = copy.deepcopy(cpu)
    gpu.to_device(DEVICE)
    adas = [ada_loss.AdaLossScaled(m, fmt='fp8_e4m3', init_scale=rule,
                                   update_interval=interval, verbose=False)
            for m in (cpu, gpu)]
    rng = np.random.RandomState(5)
    seen = set()
    for i in range(7):
        x, c = _batch(rng, bad=i == 2)
        c = c * np.float32(2.0 ** (-3 * i))     # a new scale every step
        host = _pass(cpu, adas[0], x, c, np)
        dev = _pass(gpu, adas[1], x, c, cupy)
        for n in host[0]:
            np.testing.assert_array_equal(host[0][n][0], dev[0][n][0],
                                          err_msg='step {} {}'.format(i, n))
        assert host[1:] == dev[1:], i
        assert float(adas[1].init_scale) == adas[0].init_scale, i
        seen.add(adas[0].init_scale)
        for a in adas:
            a.step_done(i == 2)
    assert len(seen) >= 3
    model = gpu
    x, c = _batch(rng)
    model.cleargrads()
    loss = F.sum(model(cupy.asarray(x)) * cupy.asarray(c))
    cupy.cuda.Device().synchronize()
    assert count_synchronizations(lambda: adas[1].backward(loss)) == 0
