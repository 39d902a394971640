"""Paired verdicts and rate intervals (ada_loss/experiment/verdicts.py),
against independent computations: the t interval from its definition with
SciPy's distribution integrated numerically, Wilson's interval by solving
its quadratic directly."""
import math

import numpy as np
import pytest
from scipy import integrate, stats

from ada_loss.experiment.verdicts import (
    paired, paired_text, rate_text, wilson)


def _t_coverage(q, df):
    """P(|T| ≤ q) for Student's t by integrating its density."""
    return integrate.quad(lambda x: stats.t.pdf(x, df), -q, q)[0]


@pytest.mark.parametrize('seed', range(5))
def test_paired_interval_has_95_percent_coverage_by_its_definition(seed):
    rng = np.random.RandomState(seed)
    d = rng.randn(3 + seed * 2) * 3 + 0.5
    p = paired(d)
    n = len(d)
    se = d.std(ddof=1) / math.sqrt(n)
    q = p.half_width / se
    assert abs(_t_coverage(q, n - 1) - 0.95) < 1e-6
    assert p.mean == pytest.approx(d.mean())


def test_verdicts():
    assert paired([1.0, 2.0, 1.5, 1.2]).verdict == 'ahead'
    assert paired([-1.0, -2.0, -1.5, -1.2]).verdict == 'behind'
    assert paired([-1.0, 2.0, 0.5]).verdict == 'level'
    assert paired([3.0]).verdict == 'n < 2'
    assert paired([]).n == 0
    with pytest.raises(ValueError):
        paired([1.0, float('nan')])
    assert paired_text(paired([1.0, 2.0])).endswith('(n=2)')


@pytest.mark.parametrize('k,n', [(0, 8), (1, 8), (4, 8), (8, 8), (3, 27)])
def test_wilson_interval_solves_its_quadratic(k, n):
    """The Wilson bounds are the p0 with |k/n − p0| = z·√(p0(1−p0)/n)."""
    z = stats.norm.ppf(0.975)
    lo, hi = wilson(k, n)
    for p0 in (lo, hi):
        if 0 < p0 < 1:
            assert abs(abs(k / n - p0) - z * math.sqrt(p0 * (1 - p0) / n)) \
                < 1e-9
    assert 0 <= lo <= k / n <= hi <= 1
    assert rate_text(k, n).startswith('{}/{}'.format(k, n))
