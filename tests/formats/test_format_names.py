"""ml_dtypes' names in get_format: canonical, checked against ml_dtypes
itself (finfo and casts); the project's older names are aliases of the same
format objects, so configs and result labels keep working."""
import ml_dtypes
import numpy as np
import pytest

from ada_loss.formats import get_format
from ada_loss.formats.float_format import ML_DTYPES_NAMES

ALIASES = [('float8_e4m3fn', 'fp8_e4m3'), ('float8_e5m2', 'fp8_e5m2'),
           ('float8_e4m3', 'e4m3'), ('float8_e3m4', 'e3m4'),
           ('float6_e3m2fn', 'fp6_e3m2'), ('float6_e2m3fn', 'fp6_e2m3'),
           ('float4_e2m1fn', 'fp4_e2m1'), ('bfloat16', 'e8m7'),
           ('float16', 'e5m10'), ('float32', 'e8m23')]


def _ml_type(name):
    return np.float32 if name == 'float32' else np.float16 \
        if name == 'float16' else getattr(ml_dtypes, name)


@pytest.mark.parametrize('canonical, alias', ALIASES,
                         ids=[a[0] for a in ALIASES])
def test_alias_is_the_same_format(canonical, alias):
    f = get_format(canonical)
    assert get_format(alias) is f
    assert get_format(canonical.upper()) is f
    assert f.canonical_name == canonical
    assert get_format(f.name) is f       # the label results are stored by


@pytest.mark.parametrize('name', sorted(ML_DTYPES_NAMES))
def test_range_matches_ml_dtypes_finfo(name):
    f, info = get_format(name), ml_dtypes.finfo(_ml_type(name))
    assert f.u_max == float(info.max)
    assert f.u_min == float(info.smallest_subnormal)
    assert f.man_bits == info.nmant
    assert f.emin == info.minexp and f.emax == info.maxexp - 1


@pytest.mark.parametrize('name', sorted(ML_DTYPES_NAMES))
def test_quantize_matches_ml_dtypes_cast(name):
    """Every value in range (and beyond it, by the format's overflow rule)
    rounds as ml_dtypes' cast does, NaN/Inf included."""
    f, t = get_format(name), _ml_type(name)
    rng = np.random.RandomState(0)
    mags = np.exp2(rng.uniform(np.log2(f.u_min) - 2, np.log2(f.u_max) + 1,
                               20000))
    with np.errstate(over='ignore'):      # beyond float16's range: inf
        x = (mags * rng.choice([-1, 1], mags.size)).astype(np.float32)
    x = np.concatenate([x, np.float32([0, -0.0, np.inf, -np.inf, np.nan,
                                       f.u_max, -f.u_max])])
    with np.errstate(over='ignore'):
        want = x.astype(t).astype(np.float32)
    got = f.quantize(x)
    assert got.dtype == np.float32
    if f.saturates:
        # ml_dtypes' FP6/FP4 have no NaN and cast it to -0; here NaN stays
        # NaN (documented: a NaN gradient must stay visible)
        nan = np.isnan(x)
        assert np.isnan(got[nan]).all() and not np.isnan(got[~nan]).any()
        got, want = got[~nan], want[~nan]
    np.testing.assert_array_equal(got, want)


def test_the_two_e4m3_differ_as_their_names_say():
    fn, ieee = get_format('float8_e4m3fn'), get_format('float8_e4m3')
    assert fn is not ieee
    assert (fn.u_max, fn.overflow) == (448.0, 'nan')
    assert (ieee.u_max, ieee.overflow) == (240.0, 'inf')
    big = np.float32([1000.0])
    assert np.isnan(fn.quantize(big)[0])
    assert np.isinf(ieee.quantize(big)[0])


@pytest.mark.parametrize('name', ['float8_e4m3fnuz', 'float8_e5m2fnuz',
                                  'float8_e8m0fnu', 'fp8_e4m3fn'])
def test_unsupported_names_list_the_accepted_ones(name):
    with pytest.raises(ValueError) as e:
        get_format(name)
    msg = str(e.value)
    assert repr(name) in msg
    assert 'float8_e4m3fn' in msg and 'fp8_e4m3' in msg
