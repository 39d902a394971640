"""``quantize_nvfp4`` (nearest and stochastic), ``quantize_blockwise``, the
RHT and the counter words on CuPy arrays equal the NumPy path bit for bit
(skipped without a GPU)."""
import numpy as np
import pytest

from ada_loss.formats import (
    quantize_blockwise, quantize_nvfp4, random_hadamard, random_words)

from gpu_helpers import requires_gpu, to_cpu, to_gpu
from test_mx import _bits_equal, _tensor
from test_nvfp4 import _moderate

pytestmark = requires_gpu


@pytest.mark.parametrize('rounding', ['nearest', 'stochastic'])
def test_nvfp4_on_cupy_equals_numpy(rounding):
    for x in (_moderate(0, (37, 50)), _tensor(1, (40, 75))):
        x[5, 3] = np.nan
        for kw in ({'axis': 0}, {'axis': 1}, {'tile': (16, 16)}):
            want = quantize_nvfp4(x, rounding=rounding, seed=2, step=5, **kw)
            got = quantize_nvfp4(to_gpu(x), rounding=rounding, seed=2,
                                 step=5, **kw)
            _bits_equal(to_cpu(got), want)


def test_blockwise_rht_words_on_cupy_equal_numpy():
    x = _tensor(3, (130, 200))
    for kw in ({'axis': 1}, {'axis': 0}, {'tile': (128, 128)},
               {'tile': (128, 128), 'pow2': True}):
        _bits_equal(to_cpu(quantize_blockwise(to_gpu(x), **kw)),
                    quantize_blockwise(x, **kw))
    m = _moderate(4, (64, 48))
    for axis in (0, 1):
        # a matrix product on each side (cuBLAS / OpenBLAS): the order of
        # the 16-term FP32 sums may differ, so equal to FP32 rounding
        want = random_hadamard(m, axis)
        got = to_cpu(random_hadamard(to_gpu(m), axis))
        assert np.allclose(got, want, rtol=1e-6,
                           atol=np.abs(m).max() * 1e-6)
    assert np.array_equal(to_cpu(random_words((5, 9), 3, 4, _cupy())),
                          random_words((5, 9), 3, 4))


def _cupy():
    import cupy
    return cupy
