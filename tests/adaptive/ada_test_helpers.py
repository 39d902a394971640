"""Shared helpers of the tests in tests/adaptive (imported by name)."""
import math

import numpy as np


def is_pow2(x):
    return isinstance(x, float) and x > 0 and math.isfinite(x) and \
        math.frexp(x)[0] == 0.5


def params_dict(model):
    return {name: p.array.copy() for name, p in sorted(model.namedparams())}


def assert_params_bit_equal(model_a, model_b):
    pa, pb = params_dict(model_a), params_dict(model_b)
    assert sorted(pa) == sorted(pb)
    bad = [n for n in pa
           if pa[n].dtype != pb[n].dtype or not np.array_equal(pa[n], pb[n])]
    assert not bad, 'parameters differ: {}'.format(bad)
    return len(pa)


def assert_params_changed(before, model):
    after = params_dict(model)
    unchanged = [n for n in before if np.array_equal(before[n], after[n])]
    assert not unchanged, 'parameters not updated: {}'.format(unchanged)
