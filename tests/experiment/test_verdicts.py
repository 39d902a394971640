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


@pytest.mark.parametrize('seed', range(20))
def test_p_value_agrees_with_the_interval(seed):
    """The interval excludes 0 exactly when the two-sided t test's p-value
    is below 5 %, and that p-value is SciPy's ttest_1samp's."""
    rng = np.random.RandomState(seed)
    d = rng.randn(2 + seed % 7) + rng.uniform(-1.5, 1.5)
    p = paired(d)
    assert p.p_value == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue,
                                      rel=1e-9)
    assert (p.verdict != 'level') == (p.p_value < 0.05)


def test_holm_by_its_definition():
    """Holm (1979): sort the p-values; reject while p_(i) ≤ α/(m − i + 1)
    (i from 1), stop at the first that is not; untested rows (None) are
    outside the family."""
    from ada_loss.experiment.verdicts import holm
    # m = 4: thresholds .0125, .0167, .025, .05 for the sorted p-values
    # .01 (rejected), .015 (rejected), .03 (> .025: stop), .04 (kept)
    assert holm([0.04, 0.01, None, 0.03, 0.015]) == \
        [False, True, False, False, True]
    assert holm([0.2, 0.001]) == [False, True]
    assert holm([0.049]) == [True]
    assert holm([]) == []


@pytest.mark.parametrize('seed', range(30))
def test_holm_lies_between_bonferroni_and_unadjusted(seed):
    from ada_loss.experiment.verdicts import holm
    rng = np.random.RandomState(seed)
    ps = list(rng.uniform(0, 0.1, size=1 + seed % 9))
    m = len(ps)
    r = holm(ps)
    for p, rejected in zip(ps, r):
        if p <= 0.05 / m:
            assert rejected        # Bonferroni's rejections are Holm's
        if rejected:
            assert p <= 0.05       # never more than the raw tests


def test_holm_verdicts_keep_the_sign():
    from ada_loss.experiment.verdicts import holm_verdicts
    rows = [paired([5.0, 5.1, 4.9, 5.2]), paired([-5.0, -5.1, -4.9, -5.2]),
            paired([1.0, -1.0, 0.5]), paired([2.0])]
    assert holm_verdicts(rows) == ['ahead', 'behind', 'level', None]
