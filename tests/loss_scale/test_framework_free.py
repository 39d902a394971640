"""ada_loss.formats and ada_loss.loss_scale need NumPy only: they import and
give the same results with Chainer and SciPy made unimportable (the GPU
machine has CuPy and NumPy 2 but no Chainer); SciPy's erfinv is replaced by
a standard-library one within a few ulp."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import special

from ada_loss.loss_scale import gemm_loss_scale, gemm_scale_bounds
from ada_loss.loss_scale.gemm import _erfinv_newton

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

_CHILD = r'''
import json, sys
for name in ('chainer', 'scipy', 'cupy'):
    sys.modules[name] = None        # import of these now raises ImportError
import numpy as np
import ada_loss
from ada_loss.formats import get_format
from ada_loss.loss_scale import (common_scale, gemm_loss_scale,
                                 gemm_scale_bounds, grad_input_gain)
from ada_loss.loss_scale.amax import amax_loss_scale
assert not hasattr(ada_loss, 'AdaLossScaled')
rng = np.random.RandomState(0)
out = []
for scale in (1e-8, 1e-5, 1e-2):
    W = (rng.randn(64, 32) * 0.05).astype(np.float32)
    g = (rng.randn(16, 64) * scale).astype(np.float32)
    out.append([gemm_scale_bounds(W, g), gemm_loss_scale(W, g),
                gemm_loss_scale(W, g, fmt='fp8_e4m3', bound='output',
                                gain=grad_input_gain(W, (0,)))])
out.append(get_format('e4m3').quantize(
    np.float32([0.3, 1000, 1e-4])).tolist())
out.append(amax_loss_scale(0.01, 1.0, 'fp8_e5m2', 2))
print(json.dumps(out))
'''


def test_import_and_results_without_chainer_and_scipy():
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, '-c', _CHILD], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    child = json.loads(res.stdout.strip().splitlines()[-1])
    rng = np.random.RandomState(0)
    from ada_loss.formats import get_format
    from ada_loss.loss_scale import grad_input_gain
    from ada_loss.loss_scale.amax import amax_loss_scale
    for i, scale in enumerate((1e-8, 1e-5, 1e-2)):
        W = (rng.randn(64, 32) * 0.05).astype(np.float32)
        g = (rng.randn(16, 64) * scale).astype(np.float32)
        lower, upper = gemm_scale_bounds(W, g)
        c_bounds, c_beta, c_beta8 = child[i]
        # erfinv differs from SciPy's by a few ulp at most
        assert c_bounds[0] == pytest.approx(lower, rel=1e-14)
        assert c_bounds[1] == upper
        assert c_beta == gemm_loss_scale(W, g)
        assert c_beta8 == gemm_loss_scale(
            W, g, fmt='fp8_e4m3', bound='output',
            gain=grad_input_gain(W, (0,)))
    assert child[3] == get_format('e4m3').quantize(
        np.float32([0.3, 1000, 1e-4])).tolist()
    assert child[4] == amax_loss_scale(0.01, 1.0, 'fp8_e5m2', 2)


def test_erfinv_without_scipy_matches_scipy():
    rng = np.random.RandomState(0)
    ys = np.concatenate([10 ** rng.uniform(-12, -1e-4, 3000),
                         rng.uniform(0, 1, 3000),
                         1 - 10 ** rng.uniform(-12, -1, 500),
                         [1e-3, 1e-4, 0.5, 0.999999]])
    worst = 0.0
    for y in ys:
        a, b = _erfinv_newton(float(y)), float(special.erfinv(y))
        worst = max(worst, abs(a - b) / math.ulp(b))
    assert worst <= 4, worst
