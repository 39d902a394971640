"""Max-based layer-wise loss scaling (mode ``amax``) on the ⟨α, δ⟩ backward.

The same backward as adaptive loss scaling (Algorithm 3 and 5: β per GEMM on
its input gradient, α carried, rescaling where gradients meet, each weight
gradient unscaled by its own α), with β from the largest magnitude of the
layer's input gradient instead of the paper's statistical model
(:mod:`ada_loss.loss_scale.amax`): the per-tensor recipe of Transformer
Engine's delayed scaling, over a history of ``history`` steps.
"""
import collections

import chainer
import numpy

from ada_loss.adaptive.ada_loss_scaled import AdaLossScaled
from ada_loss.loss_scale.amax import amax_loss_scale, check_margin
from ada_loss.loss_scale.checks import positive_int
from ada_loss.loss_scale.gemm import max_abs


class AmaxLossScaled(AdaLossScaled):
    """Like :class:`AdaLossScaled`, with β from amax histories.

    Args:
        model, init_scale, fmt, max_accum_scale, verbose: as AdaLossScaled.
        margin (int): β maps the amax to u_max / 2^margin (default 8: the
            gradient also passes non-GEMM ops, e.g. batch norm's backward,
            which can grow it; measured on a small CNN, margins 0 and 4
            overflow in mixed16, 8 does not).
        max_accum_scale (float): cap on α·β (default 2^24, as the dynamic
            mode's cap): a format as wide as float32 (bfloat16) would
            otherwise drive scales past float32's range, where unscaling
            in FP32 fails.
        history (int): amax history length in steps (default 16); the max
            over it is used.
        guard, backoff_window: the overflow guard and the backoff after
            skipped steps, as :class:`AdaLossScaled` (not in any recipe).
        nonlinear_scale, split_scales: as :class:`AdaLossScaled` (the scale
            a softmax's input gradient and a split's slices carry; on by
            default).

    The weight and bias gradients of each GEMM, which sum over the batch
    and can be far larger than the input gradient, get their own scale
    α·γ with γ ≤ 1 from their own amax history (each parameter is unscaled
    by its own scale, as in adaptive loss scaling). With no history yet,
    deterministic bounds from the incoming gradient are used (the output
    bound for gx; max|g|·Σ|x| for gW), so the first step cannot overflow.
    A gradient that overflowed (Inf/NaN) is recorded as twice the largest
    value its scale could hold, so the next scale is at least halved.
    """

    uses_weight_statistics = False     # the amax rule reads no W

    def __init__(self, model, init_scale=1.0, margin=8, history=16,
                 fmt='float16', max_accum_scale=2.0 ** 24, guard=True,
                 backoff_window=100, nonlinear_scale=True, split_scales=True,
                 verbose=True):
        if isinstance(init_scale, str):
            raise ValueError("amax: init_scale must be a positive number "
                             "('auto' is an option of adaptive), got {!r}"
                             .format(init_scale))
        positive_int('history', history)
        self.margin = check_margin(margin)
        self.history = int(history)
        self._amax = {}
        super(AmaxLossScaled, self).__init__(
            model, init_scale=init_scale, fmt=fmt,
            max_accum_scale=max_accum_scale, guard=guard,
            backoff_window=backoff_window, nonlinear_scale=nonlinear_scale,
            split_scales=split_scales, verbose=verbose)

    def _key(self, func, what):
        key = func.scale_key if func.scale_key is not None else \
            'unnamed{}'.format(id(func.inputs[1]))
        return '{}#{}'.format(key, what)

    def _layer_scale(self, func, key, W, g, alpha):
        hist = self._amax.get(self._key(func, 'x'))
        if hist:
            amax = max(hist)
        else:
            amax = max_abs(g) / alpha * func.grad_input_gain(W)
        return amax_loss_scale(amax, alpha, self.fmt, self.margin)

    def _weight_scale(self, func, W, x, g, alpha):
        hist = self._amax.get(self._key(func, 'W'))
        if hist:
            amax = max(hist)
        else:
            amax = max_abs(g) / alpha * func.grad_weight_gain(x, g)
        return min(1.0, amax_loss_scale(amax, alpha, self.fmt, self.margin))

    def _observe(self, func, grads, scales):
        peaks = {}
        for i, g in grads.items():
            what = 'x' if i == 0 else 'W'
            peak = max_abs(g)
            if not numpy.isfinite(peak):
                peak = 2.0 * self.fmt.u_max
            elif peak == 0:
                continue    # all zero (or all underflowed): no information
            peaks[what] = max(peaks.get(what, 0.0), peak / scales[i])
        for what, peak in peaks.items():
            self._amax.setdefault(
                self._key(func, what),
                collections.deque(maxlen=self.history)).append(peak)

    def serialize(self, serializer):
        """Saves/loads the iteration count, the backoff state and the amax
        histories."""
        self.iteration = int(serializer('iteration', self.iteration))
        if self.guard:
            self._serialize_backoff(serializer)
        if isinstance(serializer, chainer.serializer.Deserializer):
            keys = [k for k in str(serializer('amax_keys', '')).split('\n')
                    if k]
            lengths = serializer('amax_lengths', None)
            values = serializer('amax_values', None)
            self._amax, start = {}, 0
            for k, n in zip(keys, lengths):
                self._amax[k] = collections.deque(
                    (float(v) for v in values[start:start + int(n)]),
                    maxlen=self.history)
                start += int(n)
        else:
            keys = sorted(self._amax)
            serializer('amax_keys', '\n'.join(keys))
            serializer('amax_lengths', numpy.array(
                [len(self._amax[k]) for k in keys], dtype=numpy.int64))
            serializer('amax_values', numpy.array(
                [v for k in keys for v in self._amax[k]],
                dtype=numpy.float64))
