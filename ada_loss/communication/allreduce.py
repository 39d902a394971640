"""APS (Algorithm 1 of Han et al.) for one step's gradients, with the
low-precision sum emulated as CPD does (§5.1).

One step, for the gradients of ``p`` workers packed into flat FP32 buffers
(one segment per parameter, "layer"):

1. every worker: ``max_exp`` of each low-precision layer (FINDMAXEXP of
   grad · p, :mod:`~ada_loss.communication.exponents`), one byte per layer;
2. all-reduce (MAX) of that vector: one message for all layers (line 4);
3. every worker: shift by ``2^(upper_exp − max_exp)`` (exact; ``ldexp``),
   cast to the format (lines 5–7): the *payload*;
4. the sum of the payloads accumulated in the format in the stated order
   (line 8; :mod:`~ada_loss.communication.summation`), cast back to FP32
   (line 10, exact), × 1/p and unshift (line 11) rounded once to float32
   (exact in float64; rounding twice would differ where the mean is a
   float32 subnormal): the mean, as ChainerMN's ``allreduce_grad`` (which
   averages) returns.

Layers kept in FP32 (policy) skip 1–3 and are summed in FP32 in the same
order. Without APS (``aps=False``) step 3 is a plain cast, steps 1–2 vanish.

Steps 1, 3 are per worker and elementwise; step 4 is a function of the
gathered payloads only. The ChainerMN communicator
(:mod:`~ada_loss.communication.communicator`) and the N-worker simulator
(:mod:`~ada_loss.communication.simulator`) both call these same functions,
which is why they agree bit for bit.

**On CuPy arrays** (the simulator on a GPU) the same steps run on the
device, dispatched on the array module, and give NumPy's bits: the route
is the NumPy emulation (``reference=True``; the compiled code route of
:mod:`~ada_loss.communication.stacked` is CPU-only), with every float32
operation whose operands or result can be subnormal — the shift, the
sums, × 1/p and the unshift — done by :mod:`ada_loss.formats.exact`
(the GPU's float32 arithmetic flushes subnormals to zero), the rounding
to the format by ``quantize``'s integer kernel, and FINDMAXEXP from the
bits (:mod:`~ada_loss.communication.exponents`). The per-layer exponent
codes are computed on the host (one small copy per step).
"""
import numpy

from ada_loss.communication import exponents as X
from ada_loss.communication import stacked
from ada_loss.communication.policy import CommPolicy
from ada_loss.communication.summation import check_order, low_precision_sum
from ada_loss.formats import exact, get_format
from ada_loss.formats.quantize import array_module

_F32 = numpy.float32


def scale_pow2(x, exps):
    """``x · 2^exps`` in float32, correctly rounded (= ``ldexp``): one
    multiplication by the float32 power of two where every exponent is
    one (−126..127; exact, or rounded once on under/overflow, as ``ldexp``
    rounds; ~10x faster), else ``ldexp``. On CuPy: ``exact.ldexp`` (the
    same correctly rounded product; subnormals kept)."""
    if array_module(x) is not numpy:
        return exact.ldexp(x, exps)
    if exps.size and -126 <= int(exps.min()) and int(exps.max()) <= 127:
        factors = ((exps + 127).astype(numpy.uint32) << numpy.uint32(23)) \
            .view(_F32)
        return x * factors
    return numpy.ldexp(x, exps).astype(_F32, copy=False)


def scale_layer(x, e, out):
    """``out = x · 2^e`` (scalar ``e``) in float32, bit for bit
    :func:`scale_pow2` with ``e`` everywhere: one multiplication by the
    power of two where it is a float32 (−126 ≤ e ≤ 127), else ``ldexp``
    (both correctly rounded)."""
    if -126 <= e <= 127:
        return numpy.multiply(x, _F32(2.0 ** e), out=out)
    out[...] = numpy.ldexp(x, numpy.int32(e)).astype(_F32, copy=False)
    return out


class StepReduction(object):
    """The plan of one step's reduction: which elements go in the format.

    Args:
        policy (CommPolicy): formats and order.
        names (list of str): parameter names, in buffer order.
        sizes (list of int): their sizes (segments are contiguous).
        n_workers (int): p.
        epoch (float): for the hybrid schedule.
    """

    def __init__(self, policy, names, sizes, n_workers, epoch=0.0):
        policy.check(n_workers)
        self.policy = policy
        self.n_workers = int(n_workers)
        self.names = list(names)
        self.sizes = [int(s) for s in sizes]
        self.offsets = numpy.concatenate(
            [[0], numpy.cumsum(self.sizes, dtype=numpy.int64)]).astype(
            numpy.int64)
        self.size = int(self.offsets[-1])
        self.lp_layers = numpy.array(
            policy.low_precision_mask(self.names, epoch), bool)
        self.lp_elements = numpy.repeat(self.lp_layers, self.sizes)
        self.any_lp = bool(self.lp_layers.any())
        self._device_index = {}
        self.uses_exponents = policy.aps and self.any_lp

    def _index(self, xp, mask):
        """``mask`` (a NumPy bool vector over the elements) as an index for
        arrays of module ``xp``: itself for NumPy, the positions on the
        device for CuPy (cached per plan; masks are the plan's own)."""
        if xp is numpy:
            return mask
        key = id(mask)
        if key not in self._device_index:
            self._device_index[key] = (mask, xp.asarray(
                numpy.flatnonzero(mask)))
        return self._device_index[key][1]

    @property
    def segments(self):
        """``(offset, size)`` of the low-precision layers (the exponent
        message covers these, in order)."""
        return [(int(self.offsets[i]), self.sizes[i])
                for i in numpy.flatnonzero(self.lp_layers)]

    # -- 1. per worker -----------------------------------------------------
    def local_max_exps(self, buffer):
        """The worker's exponent message: one byte (``uint8`` code, see
        :mod:`~ada_loss.communication.exponents`) per low-precision layer
        (empty without APS)."""
        if not self.uses_exponents:
            return numpy.empty(0, X.CODE_DTYPE)
        return X.layer_max_exps(buffer, self.segments, self.n_workers)

    def stacked_max_exps(self, buffers):
        """``local_max_exps`` of every row of ``buffers`` (``(p, n)``),
        maximum over the rows: what the MAX all-reduce gives."""
        if not self.uses_exponents:
            return numpy.empty(0, X.CODE_DTYPE)
        return X.stacked_layer_max_exps(buffers, self.segments,
                                        self.n_workers).max(axis=0)

    # -- 2./3. shift and cast ---------------------------------------------
    def layer_shifts(self, global_max_exps):
        """Per layer ``factor_exp`` (int32; 0 for FP32 layers) and whether
        the layer was reported non-finite."""
        layer_shift = numpy.zeros(len(self.sizes), numpy.int32)
        bad = numpy.zeros(len(self.sizes), bool)
        if self.uses_exponents:
            codes = numpy.asarray(global_max_exps)
            idx = numpy.flatnonzero(self.lp_layers)
            layer_shift[idx] = X.shift_exponents(codes, self.policy.format,
                                                  self.n_workers)
            bad[idx] = codes == X.NONFINITE
        return layer_shift, bad

    def shifts(self, global_max_exps):
        """Per element ``factor_exp`` (int32; 0 for FP32 layers) and the
        per-element mask of layers reported non-finite."""
        layer_shift, bad = self.layer_shifts(global_max_exps)
        return (numpy.repeat(layer_shift, self.sizes),
                numpy.repeat(bad, self.sizes))

    def encode(self, buffer, shift):
        """The payload of one worker (or of stacked workers, ``(..., n)``):
        low-precision layers shifted and cast to the format (their values
        stored in FP32), FP32 layers as they are."""
        xp = array_module(buffer)
        buffer = xp.asarray(buffer, _F32)
        if not self.any_lp:
            return buffer.copy()
        shifted = scale_pow2(buffer, xp.asarray(shift)) \
            if self.uses_exponents else buffer.copy()
        lp = self.lp_elements
        if lp.all():
            return self.policy.format.quantize(shifted)
        if xp is not numpy:
            # integer positions (CuPy: no boolean mask beside a slice)
            rows = shifted.reshape(-1, self.size)
            idx = self._index(xp, lp)
            rows[:, idx] = self.policy.format.quantize(
                xp.ascontiguousarray(rows[:, idx]))
            return shifted
        shifted[..., lp] = self.policy.format.quantize(
            numpy.ascontiguousarray(shifted[..., lp]))
        return shifted

    # -- 4. the sum, cast back, unshift, mean ------------------------------
    def reduce(self, payloads, shift, nonfinite=None, reference=False):
        """The FP32 mean over workers from the gathered payloads
        (``(p, n)``): the same on every worker that calls it. On format
        codes with the compiled kernels where they apply
        (:mod:`~ada_loss.communication.stacked`); ``reference=True``: the
        NumPy emulation, the definition (the tests' oracle; also the
        route of CuPy payloads, module docstring)."""
        xp = array_module(payloads)
        payloads = xp.asarray(payloads, _F32)
        if xp is not numpy:
            reference = True
        p = payloads.shape[0]
        if p != self.n_workers:
            raise ValueError('expected {} payloads, got {}'.format(
                self.n_workers, p))
        if not reference and stacked.applies(self):
            # the payloads hold shifted format values: encoded unshifted,
            # the layer's shift undone at the end
            starts = self.offsets[:-1]
            present = numpy.array(self.sizes) > 0
            layer_shift = numpy.zeros(len(self.sizes), numpy.int32)
            layer_bad = numpy.zeros(len(self.sizes), bool)
            shift = numpy.broadcast_to(shift, (self.size,))
            layer_shift[present] = shift[starts[present]]
            if nonfinite is not None:
                layer_bad[present] = numpy.broadcast_to(
                    nonfinite, (self.size,))[starts[present]]
            return stacked.mean(self, payloads, layer_shift, layer_bad,
                                encoded_shift=False)
        pol = self.policy
        total = xp.empty(self.size, _F32)
        lp = self.lp_elements
        for mask, fmt, kahan in ((lp, pol.format, pol.kahan),
                                 (self._fp32_mask(), get_format('float32'),
                                  False)):
            if not mask.any():
                continue
            if mask.all():
                total[...] = low_precision_sum(payloads, fmt, pol.order,
                                               pol.group_size, kahan)
                continue
            idx = self._index(xp, mask)
            total[idx] = low_precision_sum(
                xp.ascontiguousarray(payloads[:, idx]), fmt, pol.order,
                pol.group_size, kahan)
        return self.finish(total, shift, nonfinite)

    def _fp32_mask(self):
        """``~lp_elements``, one array per plan (its device index is
        cached by identity)."""
        if getattr(self, '_fp32_elements', None) is None:
            self._fp32_elements = ~self.lp_elements
        return self._fp32_elements

    def finish(self, total, shift, nonfinite=None):
        """The mean from the sum ``total`` (float32, modified in place):
        × 1/p and the unshift in one rounding, layers reported
        non-finite → NaN. The wire mode
        (:mod:`~ada_loss.communication.wire`) computes the same.

        ``sum · fl32(1/p) · 2^−shift`` is exact in float64 (24 × 24
        significand bits, a power of two) and rounded once to float32:
        rounding after × 1/p and again after the unshift would round
        twice where the mean is a float32 subnormal (and p is not a power
        of two). Nothing can overflow on the way, even where the FP32
        *sum* of gradients near FP32's maximum would."""
        inv_p = _F32(1.0 / self.n_workers)
        xp = array_module(total)
        if xp is not numpy:
            # float64 factors (no flush on the GPU), the product rounded
            # once by hand where it is a float32 subnormal (exact)
            if self.uses_exponents:
                shift = xp.asarray(shift, numpy.int32)
                factor = xp.ldexp(xp.full(shift.shape, float(inv_p),
                                          numpy.float64), -shift)
                total = exact.multiply_f64(total, factor)
            else:
                total = exact.multiply(total, inv_p)
            if nonfinite is not None:
                # a select, not ``if nonfinite.any()``: no wait for the
                # device
                total = xp.where(xp.asarray(nonfinite), _F32(numpy.nan),
                                 total)
            return total
        if self.uses_exponents:
            factor = numpy.float64(inv_p) * numpy.ldexp(
                1.0, -numpy.asarray(shift, numpy.int32))
            total = (total.astype(numpy.float64) * factor).astype(_F32)
        else:
            total *= inv_p
        if nonfinite is not None and nonfinite.any():
            total[nonfinite] = numpy.nan
        return total

    def finish_layers(self, total, layer_shift, layer_bad):
        """:meth:`finish` with the shifts per layer (:meth:`layer_shifts`),
        bit for bit: the same two roundings (× 1/p, then × 2^−shift), one
        layer at a time with a scalar factor, no per-element arrays."""
        return self.finish_range(total, 0, self.size, layer_shift,
                                 layer_bad)

    def finish_range(self, total, a, b, layer_shift, layer_bad):
        """:meth:`finish_layers` of the elements [a, b) of ``total`` only
        (the wire mode's value path finishes chunk by chunk)."""
        inv_p = _F32(1.0 / self.n_workers)
        ends = self.offsets[1:]
        i = int(numpy.searchsorted(ends, a, 'right'))
        while i < len(self.sizes) and self.offsets[i] < b:
            lo, hi = max(int(self.offsets[i]), a), min(int(ends[i]), b)
            if lo < hi:
                seg = total[lo:hi]
                if layer_bad[i]:
                    seg[...] = numpy.nan
                elif self.uses_exponents and layer_shift[i]:
                    # × 1/p and the unshift in one rounding (finish)
                    factor = numpy.float64(inv_p) * 2.0 ** -int(
                        layer_shift[i])
                    seg[...] = seg.astype(numpy.float64) * factor
                else:
                    seg *= inv_p
            i += 1
        return total

    # -- everything at once (one process holds all workers) -----------------
    def mean_of_stacked(self, buffers, reference=False):
        """Steps 1–4 for stacked worker buffers ``(p, n)``: exactly what p
        ranks compute (the simulator and :func:`allreduce_low_precision`).
        Shift, rounding and sum on format codes by the compiled kernels
        where they apply (:mod:`~ada_loss.communication.stacked`);
        ``reference=True``: the NumPy emulation (the tests' oracle).
        CuPy buffers: the emulation on the device, NumPy's bits (module
        docstring)."""
        xp = array_module(buffers)
        if xp is not numpy:
            if buffers.dtype != _F32:
                raise TypeError('APS on CuPy expects float32 buffers, got '
                                '{}'.format(buffers.dtype))
            buffers = xp.ascontiguousarray(buffers)
            shift, bad = self.shifts(self.stacked_max_exps(buffers))
            shift, bad = xp.asarray(shift), xp.asarray(bad)
            return self.reduce(self.encode(buffers, shift), shift, bad,
                               reference=True)
        buffers = numpy.asarray(buffers, _F32)
        agreed = self.stacked_max_exps(buffers)
        if not reference and stacked.applies(self):
            layer_shift, layer_bad = self.layer_shifts(agreed)
            return stacked.mean(self, buffers, layer_shift, layer_bad)
        shift, bad = self.shifts(agreed)
        return self.reduce(self.encode(buffers, shift), shift, bad,
                           reference=True)


def allreduce_low_precision(worker_grads, fmt, aps=True, order='ring',
                            group_size=None, kahan=False):
    """One layer's gradients from each worker → their FP32 mean, reduced in
    the format ``fmt`` as APS/CPD do (module docstring).

    Args:
        worker_grads (list of array): one array per worker, same shape
            (FP32; FP16 is widened exactly).
        fmt (str): a format name (``'e5m2'``, ``'e4m3'``, ``'e3m0'``,
            ``'float32'``, ...).
        aps (bool): Algorithm 1's shift; ``False``: plain cast.
        order (str): ``'ring'`` or ``'hierarchical'`` (with ``group_size``).
        group_size (int): k for the hierarchical order (p % k == 0).
        kahan (bool): Kahan summation in the format.

    Returns:
        numpy.ndarray: float32, the shape of one gradient.

    Raises:
        ValueError: unknown format, bad order/group size, no gradients or
            shapes that differ.
    """
    policy = CommPolicy(fmt, aps, order, group_size, kahan)
    grads = list(worker_grads)
    if not grads:
        raise ValueError('worker_grads is empty: give one gradient per '
                         'worker')
    shape = numpy.shape(grads[0])
    if any(numpy.shape(g) != shape for g in grads):
        raise ValueError('all workers must give gradients of one shape, got '
                         '{}'.format(sorted({numpy.shape(g) for g in grads})))
    check_order(order, group_size, len(grads))
    stacked = numpy.stack([numpy.asarray(g, _F32).ravel() for g in grads])
    n = stacked.shape[1]
    plan = StepReduction(policy, ['grad'], [n], len(grads))
    return plan.mean_of_stacked(stacked).reshape(shape)


def plain_mean(worker_grads, order='ring', group_size=None):
    """The FP32 mean with the FP32 sum in the same order (no formats): what
    FP32 communication computes."""
    return allreduce_low_precision(worker_grads, 'float32', aps=False,
                                   order=order, group_size=group_size)
