"""Verdicts with confidence intervals for the comparison tables (issue 32).

A comparison of two methods on the same seeds is read from the *paired*
differences (one per seed): their mean and the 95 % interval of that mean,
Student's t with n − 1 degrees of freedom (SciPy's ``t.ppf``), and a
verdict — **ahead** (the interval lies above 0), **behind** (below 0) or
**level** (it contains 0). A rate (the share of a method's runs that
collapse) gets Wilson's 95 % score interval, which stays inside [0, 1] and
is usable at 0 of n.
"""
import collections
import math

#: a paired comparison: n seeds, the mean difference, the half-width of its
#: 95 % interval (None for fewer than 2 seeds) and the verdict
Paired = collections.namedtuple('Paired',
                                ('n', 'mean', 'half_width', 'verdict'))

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
    if mean - half > 0:
        verdict = 'ahead'
    elif mean + half < 0:
        verdict = 'behind'
    else:
        verdict = 'level'
    return Paired(n, mean, half, verdict)


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
