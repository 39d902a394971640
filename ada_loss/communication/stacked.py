"""The emulated low-precision sum of p workers held in one process (the
simulator, the emulated communicator) on format codes, with the compiled
kernels of the wire mode (:mod:`~ada_loss.communication.kernels`).

``StepReduction``'s NumPy route (``quantize`` after every FP32 operation,
:mod:`~ada_loss.communication.summation`) is the definition and the tests'
oracle (``reference=True``). Where the wire mode's fast path applies — a
format of at most 8 bits whose NaN, if any, has a code (so: with APS, or
with a NaN code) — the same sum is computed here on codes, bit for bit:

1. each worker's low-precision values → codes in one pass (APS's shift
   folded into the pass, as the wire's own values);
2. the sum in the emulation's order (ring chunks starting at worker
   j + 1; hierarchical groups in rank order, then the ring of the group
   sums), every ⊕ one lookup in the format's table (four with Kahan);
3. one pass decoding the sums with × 1/p and the unshift fused.

FP32 layers (Table 7's classifier, the hybrid FP32-first epochs) are summed
by the NumPy route as before (FP32 additions, the same order).
"""
import numpy

from ada_loss.communication import codes as _codes
from ada_loss.communication import kernels
from ada_loss.communication.codes import codec_for
from ada_loss.communication.summation import check_order, \
    low_precision_sum
from ada_loss.formats import get_format

_F32 = numpy.float32
_U8 = numpy.uint8
_EMPTY = numpy.empty(0, _U8)


def applies(plan):
    """Whether the code route computes ``plan``'s sum: some low-precision
    layer, a format of at most 8 bits, and no NaN to track apart (APS on,
    or a format with a NaN code)."""
    if not plan.any_lp:
        return False
    codec = codec_for(plan.policy.format)
    return codec.fast and (plan.uses_exponents or codec.has_nan)


def _lp_layout(plan):
    """The low-precision layers (indices) and their offsets in their
    concatenation."""
    idx = numpy.flatnonzero(plan.lp_layers)
    sizes = numpy.array([plan.sizes[i] for i in idx], numpy.int64)
    offsets = numpy.concatenate([[0], numpy.cumsum(sizes)]).astype(
        numpy.int64)
    return idx, offsets


def _encode_rows(codec, values, offsets, shifts):
    """Unpacked codes ``(p, n)`` of every row of ``values`` (each layer
    ``[offsets[l], offsets[l+1])`` times ``2^shifts[l]``)."""
    t = codec.tables()
    keep = shifts != 0
    seg_lo = numpy.ascontiguousarray(offsets[:-1][keep])
    seg_hi = numpy.ascontiguousarray(offsets[1:][keep])
    scale = numpy.ldexp(1.0, shifts[keep].astype(numpy.int32))
    out = numpy.empty(values.shape, _U8)
    n = values.shape[1]
    for row, dest in zip(values, out):
        kernels.encode(numpy.ascontiguousarray(row), 0, n, seg_lo, seg_hi,
                       scale, t.prm, t.sub_scale, False,
                       _codes.block_size(), _codes.scratch(0),
                       _codes.work(), dest)
    return out


def _ring(codec, rows, kahan):
    """The emulation's ring sum (``summation.ring_sum``) of code rows."""
    t = codec.tables()
    p, n = rows.shape
    if p == 1:
        return rows[0].copy()
    starts = (numpy.arange(p + 1) * n) // p
    total = numpy.empty(n, _U8)
    for j in range(p):
        a, b = int(starts[j]), int(starts[j + 1])
        s = total[a:b]
        s[...] = rows[(j + 1) % p, a:b]
        c = numpy.zeros(b - a, _U8) if kahan else _EMPTY
        for step in range(2, p + 1):
            kernels.combine(s, c, rows[(j + step) % p, a:b], t.add, t.sub,
                            kahan)
    return total


def _sum(codec, rows, order, group_size, kahan):
    """``summation.low_precision_sum`` on code rows (unpacked: for nibble
    formats the high nibble stays 0, as 0 ⊕ 0 = 0)."""
    k = check_order(order, group_size, rows.shape[0])
    if k is None:
        return _ring(codec, rows, kahan)
    t = codec.tables()
    groups = numpy.empty((rows.shape[0] // k, rows.shape[1]), _U8)
    for g in range(groups.shape[0]):
        s = groups[g]
        s[...] = rows[g * k]
        c = numpy.zeros_like(s) if kahan else _EMPTY
        for m in range(1, k):
            kernels.combine(s, c, rows[g * k + m], t.add, t.sub, kahan)
    return _ring(codec, groups, kahan)


def mean(plan, values, layer_shift, layer_bad, encoded_shift=True):
    """The mean of the rows of ``values`` (``(p, n)`` float32) as
    ``StepReduction.reduce`` computes it, bit for bit (module docstring):
    gradients shifted by ``layer_shift`` in the encoding, or, with
    ``encoded_shift=False``, payloads already shifted and rounded (the
    emulated communicator's; encoded as they are). Either way the end
    undoes ``layer_shift``."""
    pol = plan.policy
    codec = codec_for(pol.format)
    idx, offsets = _lp_layout(plan)
    lp = plan.lp_elements
    every = bool(plan.lp_layers.all())
    x = values if every else values[:, lp]
    rows = _encode_rows(codec, x, offsets, layer_shift[idx] if encoded_shift
                        else numpy.zeros(idx.size, numpy.int32))
    sums = _sum(codec, rows, pol.order, pol.group_size, pol.kahan)
    total = numpy.empty(plan.size, _F32)
    t = codec.tables()
    factor = numpy.ldexp(1.0, -layer_shift.astype(numpy.int32))
    if not plan.uses_exponents:
        factor[...] = 1.0
    bad = numpy.ascontiguousarray(layer_bad, numpy.bool_)
    if every:
        kernels.decode(sums, 0, plan.size, t.values, False, True,
                       1.0 / plan.n_workers, plan.offsets, factor, bad,
                       total)
        return total
    out = numpy.empty(sums.size, _F32)
    kernels.decode(sums, 0, sums.size, t.values, False, True,
                   1.0 / plan.n_workers, offsets,
                   numpy.ascontiguousarray(factor[idx]),
                   numpy.ascontiguousarray(bad[idx]), out)
    total[lp] = out
    # FP32 layers: the FP32 sum in the same order, × 1/p (as finish does
    # for a layer without shift)
    total[~lp] = low_precision_sum(values[:, ~lp], get_format('float32'),
                                   pol.order, pol.group_size, False) * \
        _F32(1.0 / plan.n_workers)
    return total
