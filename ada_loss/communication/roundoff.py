"""The average relative round-off error of APS's Eq. 5 (§4.2, Table 9).

    average_round_off_error = (1/N) Σ_i |(grad_h_i − grad_l_i) / grad_h_i|

``grad_h`` is the gradient reduced in high precision, ``grad_l`` the one
reduced in low precision, N the number of elements. Eq. 5 is undefined where
``grad_h_i = 0``; those elements are left out of the sum and of N (stated
choice). An element that is non-finite in ``grad_l`` makes the result
Inf/NaN (reported as such).
"""
import numpy


def exact_mean(worker_grads):
    """The high-precision reference: the float64 mean of the FP32 gradients
    (float64 sums of ≤ 2^29 float32 values are exact up to 2^-29 relative)."""
    stacked = numpy.stack([numpy.asarray(g, numpy.float64).ravel()
                           for g in worker_grads])
    return stacked.mean(axis=0).reshape(numpy.shape(worker_grads[0]))


def average_round_off_error(grad_h, grad_l):
    """Eq. 5, over the elements where ``grad_h`` is non-zero; a fraction
    (0.4183 = 41.83 %). NaN if every element of ``grad_h`` is zero."""
    h = numpy.asarray(grad_h, numpy.float64).ravel()
    low = numpy.asarray(grad_l, numpy.float64).ravel()
    if h.shape != low.shape:
        raise ValueError('grad_h and grad_l differ in size: {} vs {}'.format(
            h.size, low.size))
    keep = h != 0
    if not keep.any():
        return float('nan')
    with numpy.errstate(invalid='ignore', over='ignore'):
        return float(numpy.mean(numpy.abs((h[keep] - low[keep]) / h[keep])))
