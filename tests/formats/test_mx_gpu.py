"""``quantize_mx`` and the per-tensor cast on CuPy arrays equal the NumPy
path bit for bit (skipped without a GPU)."""
import numpy as np
import pytest

from ada_loss.formats import quantize_mx, quantize_per_tensor

from gpu_helpers import requires_gpu, to_cpu, to_gpu
from scaled_reference import ELEMENTS
from test_mx import _bits_equal, _tensor

pytestmark = requires_gpu


@pytest.mark.parametrize('element', sorted(ELEMENTS))
@pytest.mark.parametrize('rule', ['up', 'floor'])
def test_quantize_mx_on_cupy_equals_numpy(element, rule):
    x = _tensor(7)
    x[5, 3] = np.nan
    for axis in (0, 1):
        want, we = quantize_mx(x, element, axis=axis, scale_rounding=rule,
                               return_exponents=True)
        got, ge = quantize_mx(to_gpu(x), element, axis=axis,
                              scale_rounding=rule, return_exponents=True)
        _bits_equal(to_cpu(got), want)
        assert np.array_equal(to_cpu(ge), we)


def test_per_tensor_on_cupy_equals_numpy():
    x = _tensor(8)
    for element in ('float8_e4m3fn', 'float8_e5m2'):
        want, ws = quantize_per_tensor(x, element)
        got, gs = quantize_per_tensor(to_gpu(x), element)
        assert gs == ws
        _bits_equal(to_cpu(got), want)
