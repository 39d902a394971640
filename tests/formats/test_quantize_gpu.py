"""``FloatFormat.quantize`` on CuPy arrays equals the NumPy path (and so
ml_dtypes) bit for bit, for every named format and IEEE-style e<E>m<M>,
on the boundary values of each format and random values across its range;
float16 input is widened exactly there too."""
import numpy as np
import pytest

from ada_loss.formats import get_format

from gpu_helpers import requires_gpu, to_cpu, to_gpu
from test_formats import ML, NO_NAN, _all_values, _boundary_cases, \
    _random_cases

pytestmark = requires_gpu

F32 = np.float32
NAMES = sorted(set(ML) | {'e5m2', 'e4m3', 'e3m0', 'e8m7', 'e2m1'})


def _cases(name):
    if name in ML:
        x = np.concatenate([_boundary_cases(_all_values(ML[name])),
                            _random_cases()])
    else:
        x = _random_cases()
    if name not in NO_NAN:
        x = np.concatenate([x, F32([np.nan, -np.nan, np.inf, -np.inf])])
    return x.astype(F32)


@pytest.mark.parametrize('name', NAMES)
def test_quantize_on_cupy_equals_numpy(name):
    fmt = get_format(name)
    x = _cases(name)
    want = fmt.quantize(x)
    got = fmt.quantize(to_gpu(x))
    assert type(got).__module__.startswith('cupy')
    got = to_cpu(got)
    assert got.dtype == F32
    gn, wn = np.isnan(got), np.isnan(want)
    assert np.array_equal(gn, wn), name
    assert np.array_equal(got[~gn].view(np.uint32), want[~wn].view(np.uint32))


def test_float16_input_on_cupy():
    rng = np.random.RandomState(0)
    h = (rng.standard_normal(10000) * 2.0 ** rng.uniform(-26, 16, 10000)
         ).astype(np.float16)
    for name in ('fp8_e4m3', 'fp8_e5m2', 'bfloat16', 'float16'):
        fmt = get_format(name)
        want = fmt.quantize(h)
        got = to_cpu(fmt.quantize(to_gpu(h)))
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), \
            name
