"""Verdicts with confidence intervals for the comparison tables (issue 32).

A comparison of two methods on the same seeds is read from the *paired*
differences (one per seed): their mean and the 95 % interval of that mean,
Student's t with n − 1 degrees of freedom (SciPy's ``t.ppf``), and a
verdict — **ahead** (the interval lies above 0), **behind** (below 0) or
**level** (it contains 0). A rate (the share of a method's runs that
collapse) gets Wilson's 95 % score interval, which stays inside [0, 1] and
is usable at 0 of n.

A table of several such comparisons makes several tests at once; reading
each at 95 % finds "ahead" or "behind" by chance more often than 1 in 20
(issue 47: ~48 intervals in one edition). :func:`holm` adjusts a family's
p-values by Holm's step-down procedure (Holm 1979: the i-th smallest of m
p-values is compared with α / (m − i + 1), stopping at the first that is
not rejected), which controls the family-wise error rate at α under any
dependence between the tests; the tables print its verdict beside the
raw one.
"""
import collections
import math

#: a paired comparison: n seeds, the mean difference, the half-width of its
#: 95 % interval (None for fewer than 2 seeds) and the verdict
Paired = collections.namedtuple('Paired',
                                ('n', 'mean', 'half_width', 'verdict',
                                 'p_value'))
Paired.__new__.__defaults__ = (None,)

#: two-sided confidence level of every interval here
LEVEL = 0.95


def _t_quantile(df):
    from scipy import stats
    return float(stats.t.ppf(0.5 + LEVEL / 2, df))


def paired(differences):
    """:data:`Paired` of the per-seed ``differences`` (finite numbers)."""
    d = [float(x) for x in differences]
    if any(not math.isfinite(x) for x in d):
        raise ValueError('paired differences must be finite, got {!r}'
                         .format(d))
    n = len(d)
    if n == 0:
        return Paired(0, None, None, None)
    mean = sum(d) / n
    if n < 2:
        return Paired(n, mean, None, 'n < 2')
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = _t_quantile(n - 1) * sd / math.sqrt(n)
    p_value = _two_sided_p(mean, sd, n)
    if mean - half > 0:
        verdict = 'ahead'
    elif mean + half < 0:
        verdict = 'behind'
    else:
        verdict = 'level'
    return Paired(n, mean, half, verdict, p_value)


def _two_sided_p(mean, sd, n):
    """The two-sided p-value of the one-sample t test of mean 0 (the test
    whose 95 % acceptance region is the interval :func:`paired` prints):
    1 where every difference is 0, 0 where they are equal and nonzero."""
    from scipy import stats
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    t = mean / (sd / math.sqrt(n))
    return float(2 * stats.t.sf(abs(t), n - 1))


def holm(p_values, alpha=1 - LEVEL):
    """Holm's step-down rejections of a family of p-values: a list of
    booleans in the order given (None entries, tests not made, are never
    rejected and do not count in the family's size)."""
    family = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(family)
    out = [False] * len(p_values)
    for rank, (p, i) in enumerate(family):
        if p > alpha / (m - rank):
            break
        out[i] = True
    return out


def holm_verdicts(tests):
    """The Holm-adjusted verdict of each :data:`Paired` of a family
    (``tests``, one table's rows): 'ahead' / 'behind' where Holm rejects
    a zero mean, by its sign, else 'level'; None where the row made no
    test (fewer than 2 seeds)."""
    rejected = holm([p.p_value for p in tests])
    return [None if p.p_value is None else
            ('ahead' if p.mean > 0 else 'behind') if r else 'level'
            for p, r in zip(tests, rejected)]


def wilson(k, n):
    """Wilson's 95 % score interval (low, high) of a rate of ``k`` in
    ``n``; (None, None) for n = 0."""
    if n == 0:
        return None, None
    if not 0 <= k <= n:
        raise ValueError('need 0 <= k <= n, got k={} n={}'.format(k, n))
    from scipy import stats
    z = float(stats.norm.ppf(0.5 + LEVEL / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n
                                           + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_text(p):
    """'+1.23 ± 0.45 (n=8)' (points; ± the 95 % half-width)."""
    if p.n == 0:
        return '–'
    if p.half_width is None:
        return '{:+.2f} (n={})'.format(p.mean, p.n)
    return '{:+.2f} ± {:.2f} (n={})'.format(p.mean, p.half_width, p.n)


def rate_text(k, n):
    """'1/8 (2–47 %)': a count and its Wilson interval in percent."""
    if n == 0:
        return '–'
    lo, hi = wilson(k, n)
    return '{}/{} ({:.0f}–{:.0f} %)'.format(k, n, 100 * lo, 100 * hi)
