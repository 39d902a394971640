"""Statistics of one activation gradient, as defined for the paper's figures.

Definitions (N = number of entries of the gradient):

* **underflow rate** (Fig. 1a): share of entries with 0 < |g| < 2^-24 (the
  smallest positive FP16 number), i.e. the nonzero values an FP16 copy would
  flush to zero, over all N entries. Exact zeros (ReLU masks, max-pooling)
  are not underflow.
* **expected loss scale** (Fig. 1b): 1 / |g|_(k), the k-th smallest *nonzero*
  magnitude with k = max(1, ceil(0.01 N_nz)), N_nz the number of nonzero
  entries; 0.01 is "the largest underflow rate permitted". The paper says
  "N is the size of each gradient"; we count nonzeros only because a
  ReLU-gated gradient usually has far more than 1 % exact zeros, which
  would make the 0.01N-th smallest magnitude 0 and the scale infinite.
  NaN when the gradient is all zero.
* **FP16 underflow of a GEMM** (Fig. 4b): share of zeros in the layer's input
  gradient computed in FP16 (FP32 accumulation, rounded to FP16, as run)
  minus the share of zeros of the same GEMM computed from the same operands
  cast to FP32 -- the entries zeroed by FP16 alone.
* **std** (for σ_max, §4.2): population standard deviation of the gradient
  *as stored*, i.e. scaled by its loss scale, accumulated in float64.

Because loss scales are powers of two, statistics of the true gradient
``g / alpha`` follow exactly from those of the carried ``g``: dividing by
2^a subtracts a from every binary exponent. :func:`exponent_histogram`
keeps the exponent counts so the underflow rate can be computed once alpha is
known (after the backward pass, for adaptive scaling).
"""
import math

import numpy

#: Smallest positive FP16 number (subnormal): u_min of §2.1.
FP16_TINY = 2.0 ** -24
#: "The largest underflow rate permitted" of Fig. 1b.
PERMITTED_UNDERFLOW = 0.01


def _abs64(g):
    return numpy.abs(numpy.asarray(g, dtype=numpy.float64)).ravel()


def underflow_rate(g, tiny=FP16_TINY):
    """Share of entries with 0 < |g| < tiny (Fig. 1a)."""
    a = _abs64(g)
    return float(numpy.count_nonzero((a > 0) & (a < tiny))) / max(a.size, 1)


def kth_smallest_nonzero(g, rate=PERMITTED_UNDERFLOW):
    """|g|_(k) with k = max(1, ceil(rate * N_nz)); NaN if all zero."""
    a = _abs64(g)
    a = a[a > 0]
    if a.size == 0:
        return float('nan')
    k = max(1, int(math.ceil(rate * a.size)))
    return float(numpy.partition(a, k - 1)[k - 1])


def expected_loss_scale(g, rate=PERMITTED_UNDERFLOW):
    """1 / the k-th smallest nonzero |g| (Fig. 1b); see module docstring."""
    kth = kth_smallest_nonzero(g, rate)
    return 1.0 / kth if kth > 0 else float('nan')


def exponent_histogram(g):
    """{e: count} over nonzero finite entries, |g| in [2^(e-1), 2^e)."""
    a = _abs64(g)
    a = a[(a > 0) & numpy.isfinite(a)]
    if a.size == 0:
        return {}
    _, e = numpy.frexp(a)
    values, counts = numpy.unique(e, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts)}


def underflow_count_from_histogram(hist, alpha=1.0, tiny=FP16_TINY):
    """Entries with 0 < |g / alpha| < tiny, alpha and tiny powers of two."""
    limit = math.frexp(tiny * alpha)[1] - 1    # |g| < 2^limit
    return sum(c for e, c in hist.items() if e <= limit)


def zero_fraction(a):
    a = numpy.asarray(a)
    return float(a.size - numpy.count_nonzero(a)) / max(a.size, 1)


def std(g):
    """Population std in float64 (NaN if not finite)."""
    a = numpy.asarray(g, dtype=numpy.float64)
    return float(a.std()) if a.size else float('nan')


def max_abs(g):
    a = _abs64(g)
    return float(a.max()) if a.size else 0.0
