"""The compiled NVFP4 cast (``ada_loss.formats.nvfp4_kernels``, what
``quantize_nvfp4`` runs on NumPy arrays) bit for bit against the
array-wide NumPy path it replaces (``nvfp4._quantize_arrays``, the CuPy
path and the definition; itself tested against the independent references
in ``test_nvfp4.py``).

Cases: every layout the kernels see — blocks along the last axis (``I =
1``), along a middle axis of an NCHW tensor (``I > 1``, no transpose),
transposed and padded blocks (the stochastic words then read from an
array, not hashed in the kernel), axis tuples, 16×16 and other tiles —
over blocks spread through 2^-130 … 2^60 (far below the tensor amax:
E4M3 scales underflow; float32 subnormals), exact E2M1 ties, zeros,
NaN/Inf blocks, float16 and non-contiguous inputs, both roundings, the
returned scales.
"""
import numpy as np
import pytest

from ada_loss.formats import nvfp4, quantize_nvfp4
from test_mx import _bits_equal, _tensor
from test_nvfp4 import _ties

F32 = np.float32
LAYOUTS = [(-1, None), (0, None), (1, None), ((0, 1), (16, 16)),
           ((0, 1), (4, 8)), ((0, 2), None)]


def _spread(seed, shape, low=-60, high=60):
    """Standard normals with each leading slice scaled by its own power of
    two in 2^low … 2^high."""
    rng = np.random.RandomState(seed)
    scale = 2.0 ** rng.randint(low, high, shape[:1] + (1,) * (len(shape)
                                                             - 1))
    return (rng.standard_normal(shape) * scale).astype(F32)


def _cases():
    for i, shape in enumerate([(37, 50), (8, 16, 5, 7), (3, 33, 4, 4),
                               (64, 256), (2, 3, 32, 32), (4, 32, 3, 5)]):
        x = _spread(i, shape)
        yield 'spread{}'.format(i), x
        bad = x.copy()
        bad.flat[5] = np.nan
        bad.flat[-3] = -np.inf
        yield 'nonfinite{}'.format(i), bad
        yield 'subnormal{}'.format(i), x * F32(2.0 ** -130)
    yield 'tensor', _tensor(1, (40, 75))
    yield 'ties', _ties()
    yield 'zeros', np.zeros((5, 20), F32)
    yield 'negzero', -np.zeros((4, 16), F32)


def _check(x, axis, tile, rounding, seed=3, step=7):
    if x.ndim == 2 and axis in (1, (0, 2)):
        return
    want = nvfp4._quantize_arrays(x, axis, 16, tile, rounding, seed, step,
                                  True)
    got = quantize_nvfp4(x, axis, 16, tile, rounding, seed, step,
                         return_scales=True)
    assert got[0].shape == x.shape and got[0].flags.c_contiguous
    assert got[0].dtype == np.float32
    _bits_equal(got[0], want[0])
    _bits_equal(got[1], want[1])
    assert got[1].shape == want[1].shape
    assert got[2] == want[2]


@pytest.mark.parametrize('rounding', ['nearest', 'stochastic'])
@pytest.mark.parametrize('axis,tile', LAYOUTS)
def test_compiled_cast_equals_the_array_path(axis, tile, rounding):
    for _, x in _cases():
        _check(x, axis, tile, rounding)


@pytest.mark.parametrize('rounding', ['nearest', 'stochastic'])
def test_compiled_cast_of_float16_and_strided_inputs(rounding):
    x = _spread(5, (16, 48), -8, 8)
    _check(x.astype(np.float16), -1, None, rounding)
    _check(np.asfortranarray(x), -1, None, rounding)
    _check(x[:, ::2], -1, None, rounding)
    _check(x.T, 0, None, rounding)


def test_compiled_stochastic_words_follow_seed_and_step():
    # the hashed words (blocks along the last axis) and the array words
    # (padded blocks) both change with the seed and with the step
    for x in (_spread(6, (32, 64), -4, 4), _spread(7, (20, 40), -4, 4)):
        a = quantize_nvfp4(x, rounding='stochastic', seed=1, step=0)
        assert np.array_equal(a, quantize_nvfp4(
            x, rounding='stochastic', seed=1, step=0))
        assert not np.array_equal(a, quantize_nvfp4(
            x, rounding='stochastic', seed=2, step=0))
        assert not np.array_equal(a, quantize_nvfp4(
            x, rounding='stochastic', seed=1, step=1))


def test_empty_tensor_uses_the_array_path():
    x = np.zeros((0, 16), F32)
    assert quantize_nvfp4(x).shape == (0, 16)
