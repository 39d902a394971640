"""The ``nvfp4`` and ``fp8:recipe=blockwise`` precisions on CuPy: a step of
the small conv net gives the NumPy step's output and gradients bit for bit
(without the RHT; with it, the transform's FP32 matrix products on cuBLAS
and OpenBLAS may sum in different orders: equal to FP32 rounding, and the
stochastic-rounding counters advance alike). Skipped without a GPU."""
import chainer
import chainer.functions as F
import numpy as np
import pytest

from ada_loss.training import apply_precision

from gpu_helpers import requires_gpu, to_cpu
from test_scaled_precision import Net, _batches

pytestmark = requires_gpu


def _step(precision, device):
    np.random.seed(1)
    net = Net()
    apply_precision(net, precision)
    if device:
        net.to_device('@cupy:0')
    x, t = _batches(1)[0]
    xp = net.xp
    y = net(xp.asarray(x))
    net.cleargrads()
    F.softmax_cross_entropy(y, xp.asarray(t)).backward()
    return (to_cpu(y.array), to_cpu(net.conv.W.grad), to_cpu(net.fc.W.grad),
            net.fc.gemm_scaling.sr_step)


@pytest.mark.parametrize('precision', [
    'nvfp4:rht=false', 'nvfp4:rht=false,sr=false,tiles=1d',
    'fp8:recipe=blockwise', 'fp8:recipe=blockwise,pow2=true'])
def test_cupy_step_equals_numpy(precision):
    want, got = _step(precision, False), _step(precision, True)
    for a, b in zip(want[:3], got[:3]):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert want[3] == got[3]


def test_cupy_step_with_rht_close_to_numpy():
    want, got = _step('nvfp4', False), _step('nvfp4', True)
    assert np.array_equal(want[0], got[0])      # the forward has no RHT
    for a, b in zip(want[1:3], got[1:3]):
        assert np.allclose(a, b, rtol=0.25, atol=np.abs(a).max() * 0.05)
    assert want[3] == got[3] == 2
