"""Per-GEMM diagnosis of layer-wise loss scaling in an emulated format.

Not in the paper: a tool to find out *what limits* adaptive loss scaling
(Algorithm 4 + the §3.2.3 post-processing) in a narrow gradient format such
as FP8 E4M3, where u = 2^-9 and u_max = 448 leave ~2^18 of range.

:class:`GemmProbe` is a Chainer ``FunctionHook``. For every GEMM node of an
emulated precision it sees, in the backward pass, the gradient entering the
GEMM and recomputes the input gradient the GEMM produces with FP32
accumulation and *no* rounding (one extra GEMM per layer), so that for each
layer and step it can report:

* ``uf_in``: the fraction of the nonzero entering gradient (as carried, α·δ)
  that rounds to 0 in the format (underflow of the gradient entering);
* ``of_in``: the fraction of the entering gradient beyond u_max (or not
  finite) — overflow *between* GEMMs (batch normalization's backward, branch
  sums), which no bound on a GEMM's output sees; ``headroom_in_log2`` =
  log2(u_max / max|entering gradient|);
* ``uf_out`` / ``of_out``: the fraction of the nonzero produced gradient
  β·gx that rounds to 0 / exceeds u_max;
* ``beta`` and which term of §3.2.3 set it (``set_by``: ``lower``,
  ``upper`` or ``one``), for the bound the run uses;
* ``peak``: the observed max|β·gx|, and for each bound b of
  :data:`ada_loss.loss_scale.gemm.BOUNDS` ``pred_<b>``: the max|β·gx| that
  bound assumes (β times its denominator), so ``pred_<b> / peak`` is how
  pessimistic (> 1) or optimistic (< 1) it is;
* ``k``: the weight-gradient shift, log2 of the factor by which the weight
  gradient had to be scaled down to fit the format (0 when it fit);
* ``uf_w``: the fraction of the nonzero weight gradient (FP32 GEMM of the
  unrounded entering gradient, at the scale the layer produces it) that is 0
  as stored;
* ``err_x``, ``err_w``: relative L2 errors of the produced input and
  weight gradients (as stored, unscaled) against FP32 GEMMs of the
  unrounded entering gradient: what the rounding of this layer costs;
* ``alpha``: the scale the entering gradient carries (filled in after the
  pass by :class:`ProbingLossScaling`);
* ``uf_mass_in``: the share of the entering gradient's magnitude (its L1
  norm, in FP64) carried by the entries that flush to 0 -- ``uf_in``
  counts entries, and a softmax's gradient has many whose magnitude is
  negligible beside the rest; this says what the flushed entries weighed;
* ``uf_floor`` (not a CSV column): the ``uf_in`` the entering gradient
  would have with its largest entry put into the format's top binade by a
  power of two (:func:`~ada_loss.loss_scale.fit.top_binade_scale`): the
  least share that any one scale of the tensor could flush — what is left
  above it is the scaling's, what is below it the format's range;
* ``log2_hist`` (not a CSV column): {e: count} of the nonzero entries of
  the unrounded entering gradient with |g| in [2^(e-1), 2^e), shifted by
  log2 α to the true gradient by :class:`ProbingLossScaling`
  (TensorBoard's histograms of log2|g|).

The gradient *before* the GEMM rounds it is needed for ``uf_in``. Chainer's
ordinary backward hands it to the hook unrounded; the ⟨α, δ⟩ backward
rounds it first, so while installed the probe wraps
``GemmFunction.quantize_grad_output`` to keep the unrounded array of the
node it rounds (restored on exit).
"""
import collections
import contextlib
import csv
import math

import chainer
import numpy

from ada_loss import atomic
from ada_loss.adaptive.backward import slice_ratio
from ada_loss.analysis import grad_stats
from ada_loss.analysis.observing import (
    ObservationsWriter, ObservingLossScaling)
from ada_loss.analysis.recorder import GradientRecorder
from ada_loss.functions.gemm import GemmFunction, GemmSettings
from ada_loss.functions.matmul import MatMulFunction
from ada_loss.loss_scale import gemm as G
from ada_loss.loss_scale.fit import top_binade_scale

#: Column order of the probe's CSV.
FIELDS = ('mode', 'iteration', 'layer_id', 'layer', 'alpha', 'beta',
          'set_by', 'lower', 'upper', 'uf_in', 'uf_mass_in', 'of_in',
          'headroom_in_log2',
          'uf_out', 'of_out', 'peak',
          'headroom_log2') + tuple('pred_' + b for b in G.BOUNDS) + (
          'k', 'uf_w', 'err_x', 'err_w', 'skipped')


def _nonzero_lost(before, after):
    """Fraction of the nonzero entries of ``before`` that are 0 in
    ``after``; NaN if ``before`` has none."""
    nz = before != 0
    n = int(nz.sum())
    return float((nz & (after == 0)).sum()) / n if n else float('nan')


def _mass_lost(before, after):
    """Share of the L1 norm of ``before`` (FP64) carried by its nonzero
    entries that are 0 in ``after``; NaN if ``before`` is all zero."""
    mag = numpy.abs(numpy.asarray(before, numpy.float64))
    total = float(mag.sum())
    if not total > 0:
        return float('nan')
    return float(mag[(mag != 0) & (after == 0)].sum()) / total


def _flush_floor(raw, fmt):
    """The share of the nonzero entries of ``raw`` that round to zero in
    ``fmt`` once its peak is put into the top binade (``uf_floor``)."""
    peak = float(numpy.abs(raw).max()) if raw.size else 0.0
    if not (peak > 0 and math.isfinite(peak)):
        return float('nan')
    scale = numpy.float32(top_binade_scale(peak, fmt))
    return _nonzero_lost(raw, fmt.quantize(raw * scale))


@contextlib.contextmanager
def _without_grad_rounding(func):
    """The node's backward GEMMs accumulate in FP32 and do not round."""
    saved = func.formats
    func.formats = (saved[0], None)
    try:
        yield
    finally:
        func.formats = saved


class GemmProbe(chainer.FunctionHook):
    """FunctionHook recording the quantities of the module docstring.

    Args:
        t_uf (float): T_uf used to recompute the lower bound.
        bound (str): the bound the run uses (for ``set_by``); None for
            modes other than adaptive.
    """

    name = 'GemmProbe'

    def __init__(self, t_uf=1e-3, bound=None):
        self.t_uf = t_uf
        self.bound = bound
        self.layer_ids = collections.OrderedDict()
        self.pending = []
        self._raw = {}
        self._saved_q = None

    # -- seeing the unrounded gradient ------------------------------------
    def __enter__(self):
        probe = self
        # every scale-aware GEMM node: the layer GEMMs and attention's
        original = GemmSettings.quantize_grad_output
        self._saved_q = original

        def quantize_grad_output(func, gy):
            if gy is not None and getattr(gy, '_ada_quantized', None) is None:
                # with its slice ratios (split_scales): the GEMM rounds the
                # slices at their own scales, then applies the ratios
                probe._raw[id(func)] = (gy.array, slice_ratio(gy))
            return original(func, gy)
        GemmSettings.quantize_grad_output = quantize_grad_output
        return super(GemmProbe, self).__enter__()

    def __exit__(self, *args):
        GemmSettings.quantize_grad_output = self._saved_q
        self._raw = {}
        return super(GemmProbe, self).__exit__(*args)

    # -- the hook ---------------------------------------------------------
    def backward_preprocess(self, function, in_data, out_grad):
        # Chainer's own backward: every input gradient at scale 1, no fit
        self.scaled_backward_preprocess(function, in_data, out_grad, 1,
                                        fits=False)

    def scaled_backward_preprocess(self, function, in_data, out_grad,
                                   input_scale, fits=True):
        """What the ⟨α, δ⟩ backward calls for a GEMM node, with the β its
        input gradient is computed at (and whose weight gradient it fits
        into the format: ``fits``). For a GEMM of two activations
        (attention's) ``input_scale`` is {input index: β}, and each input
        gradient gets its own row (:meth:`_matmul_rows`)."""
        if isinstance(function, MatMulFunction) and out_grad[0] is not None \
                and function.grad_format is not None:
            self._matmul_rows(function, out_grad[0], input_scale)
            return
        if not isinstance(function, GemmFunction) or out_grad[0] is None \
                or function.grad_format is None:
            return
        fmt = function.grad_format
        raw, ratio = self._raw.pop(id(function), (out_grad[0], None))
        gy = fmt.quantize(raw)
        uf_in = _nonzero_lost(raw, gy)
        floor = _flush_floor(raw, fmt)
        peak_in = float(numpy.abs(raw).max()) if raw.size else 0.0
        if ratio is not None:
            # every slice at the common scale (exact: powers of two)
            raw, gy = raw * ratio, gy * ratio
        key = function.scale_key or function.label
        lid = self.layer_ids.setdefault(key, len(self.layer_ids))
        x, W = in_data[0], in_data[1]
        Wv = function.get_retained_inputs()[1]   # grad_weight reads W.layout
        beta = float(input_scale)
        with _without_grad_rounding(function), chainer.no_backprop_mode():
            gx = function.grad_input(x, W, gy, 1)[0].array
        bgx = gx * numpy.float32(beta)
        q = fmt.quantize(bgx)
        peak = float(numpy.abs(bgx).max()) if bgx.size else 0.0
        row = {'layer_id': lid, 'layer': key, 'beta': beta,
               'uf_in': uf_in, 'uf_mass_in': _mass_lost(raw, gy),
               'uf_floor': floor,
               'of_in': float((~(numpy.abs(raw) <= fmt.u_max)).mean()),
               'headroom_in_log2': (math.log2(fmt.u_max / peak_in)
                                    if peak_in > 0 else float('nan')),
               'uf_out': _nonzero_lost(bgx, q),
               'of_out': float((numpy.abs(bgx) > fmt.u_max).mean()),
               'peak': peak,
               'headroom_log2': (math.log2(fmt.u_max / peak) if peak > 0
                                 else float('nan')),
               'log2_hist': grad_stats.exponent_histogram(raw)}
        row.update(self._bounds(function, W, gy, fmt, beta))
        # end to end: the produced gradients against FP32 GEMMs of the
        # unrounded entering gradient (same carried scale)
        with _without_grad_rounding(function), chainer.no_backprop_mode():
            gx_ref = function.grad_input(x, W, raw, 1)[0].array
            gw_ref = function.grad_weight(x, Wv, raw)[0].array
        with chainer.no_backprop_mode():
            gw, applied = function.grad_weight(x, Wv, gy, 1, True)
        row['err_x'] = _relative_error(q / numpy.float32(beta), gx_ref)
        row['err_w'] = _relative_error(
            gw.array / numpy.float32(applied), gw_ref)
        row['uf_w'] = _nonzero_lost(gw_ref * numpy.float32(applied),
                                    gw.array)
        # the shift that fits the weight gradient into the format (the
        # ⟨α, δ⟩ backward's weight-gradient fit at γ = 1; Chainer's backward
        # does not fit)
        # (0.0 - x, not -x: a shift of 0 is written 0, not -0)
        row['k'] = 0.0 - math.log2(float(applied)) if fits else 0.0
        self.pending.append(row)

    def _matmul_rows(self, function, gy_in, scales):
        """One row per input gradient of an activation × activation GEMM,
        named by its operand's key (``<layer>:a``, ``<layer>:b``): the
        entering gradient's ``uf_in`` (shared by both), and for each
        gradient β, ``uf_out``/``of_out``/``peak``, the bounds'
        predictions and ``err_x``; no weight gradient (``k``, ``uf_w``,
        ``err_w`` NaN)."""
        fmt = function.grad_format
        raw = self._raw.pop(id(function), (gy_in, None))[0]
        gy = fmt.quantize(raw)
        if not isinstance(scales, dict):     # Chainer's backward: all 1
            scales = {0: scales, 1: scales}
        peak_in = float(numpy.abs(raw).max()) if raw.size else 0.0
        shared = {'uf_in': _nonzero_lost(raw, gy),
                  'uf_mass_in': _mass_lost(raw, gy),
                  'uf_floor': _flush_floor(raw, fmt),
                  'of_in': float((~(numpy.abs(raw) <= fmt.u_max)).mean()),
                  'headroom_in_log2': (math.log2(fmt.u_max / peak_in)
                                       if peak_in > 0 else float('nan')),
                  'log2_hist': grad_stats.exponent_histogram(raw),
                  'k': float('nan'), 'uf_w': float('nan'),
                  'err_w': float('nan')}
        for i in sorted(scales):
            view = function.operand_gradient(i)
            key = view.scale_key
            lid = self.layer_ids.setdefault(key, len(self.layer_ids))
            W = view.gemm_weight()
            beta = float(scales[i])
            with _without_grad_rounding(function), \
                    chainer.no_backprop_mode():
                (gx,), _ = function.backward_scaled(
                    (i,), (chainer.Variable(gy),))
                (gx_ref,), _ = function.backward_scaled(
                    (i,), (chainer.Variable(raw),))
            gx = gx.array
            bgx = gx * numpy.float32(beta)
            q = fmt.quantize(bgx)
            peak = float(numpy.abs(bgx).max()) if bgx.size else 0.0
            row = dict(shared, layer_id=lid, layer=key, beta=beta,
                       uf_out=_nonzero_lost(bgx, q),
                       of_out=float((numpy.abs(bgx) > fmt.u_max).mean()),
                       peak=peak,
                       headroom_log2=(math.log2(fmt.u_max / peak)
                                      if peak > 0 else float('nan')),
                       err_x=_relative_error(q / numpy.float32(beta),
                                             gx_ref.array))
            row.update(self._bounds(view, W, gy, fmt, beta))
            self.pending.append(row)

    def _bounds(self, node, W, gy, fmt, beta):
        """The row's bound columns of a GEMM ``node`` (or an operand view)
        with weight-role operand ``W`` and entering gradient ``gy``: the β
        each overflow bound would predict (``pred_<bound>``), and the
        configured bound's lower/upper limits and which one set β."""
        cols = {}
        for b in G.BOUNDS:
            _, upper = G.gemm_scale_bounds(W, gy, self.t_uf, fmt, b,
                                           G.bound_gain(node, W, b))
            cols['pred_' + b] = (beta * fmt.u_max / upper
                                 if upper else float('nan'))
        if self.bound is None:
            cols.update(lower=float('nan'), upper=float('nan'), set_by='')
            return cols
        lower, upper = G.gemm_scale_bounds(
            W, gy, self.t_uf, fmt, self.bound,
            G.bound_gain(node, W, self.bound))
        cols.update(lower=lower, upper=upper, set_by=set_by(lower, upper))
        return cols

    def backward_postprocess(self, function, in_data, out_grad):
        self._raw.pop(id(function), None)   # Chainer's backward rounds late


def _relative_error(a, ref):
    """||a - ref|| / ||ref|| in float64 (NaN when ref is 0)."""
    ref = ref.astype(numpy.float64)
    n = float(numpy.linalg.norm(ref))
    return float(numpy.linalg.norm(a.astype(numpy.float64) - ref)) / n \
        if n > 0 else float('nan')


def set_by(lower, upper):
    """Which term of §3.2.3 decides β = min(max(lower, 1), upper):
    ``'upper'``, ``'lower'`` or ``'one'``."""
    beta = 1.0 if lower is None or not math.isfinite(lower) \
        else max(lower, 1.0)
    if upper is not None and upper < beta:
        return 'upper'
    return 'lower' if beta > 1.0 else 'one'


class ProbingLossScaling(ObservingLossScaling):
    """Wraps a loss-scaling method and probes every ``every``-th backward
    pass (and the first) with a :class:`GemmProbe`; rows go to
    ``self.records`` with the mode name, the iteration, α, and ``skipped``.
    An :class:`ada_loss.analysis.observing.ObservingLossScaling`.
    """

    count_key = 'probe_iteration'

    def __init__(self, inner, mode, every=1, t_uf=1e-3, bound=None):
        super(ProbingLossScaling, self).__init__(inner, every)
        self.mode = mode
        self.t_uf = t_uf
        self.bound = bound
        self.records = []
        self._last = []     # the rows of the last backward pass
        self._ids = collections.OrderedDict()

    def bind(self, model):
        # name every GEMM layer by its path in every mode (as AdaLossScaled)
        GradientRecorder().bind(model)
        super(ProbingLossScaling, self).bind(model)

    def backward(self, loss):
        self._last = []
        return super(ProbingLossScaling, self).backward(loss)

    def _observe(self, loss):
        probe = GemmProbe(self.t_uf, self.bound)
        probe.layer_ids = self._ids
        scale, alphas = self._backward_with(probe, loss)
        for row in probe.pending:
            row.pop('_func', None)
            row.setdefault('k', 0.0)
            row.update(mode=self.mode, iteration=self.iteration, skipped=0,
                       alpha=float((alphas or {}).get(row['layer'], scale)))
            shift = math.log2(row['alpha']) if row['alpha'] > 0 else 0.0
            row['log2_hist'] = {e - shift: c
                                for e, c in row['log2_hist'].items()}
            self.records.append(row)
            self._last.append(row)

    def _mark_skipped(self):
        for row in self._last:
            row['skipped'] = 1

    def writer(self):
        return ProbeRecorder(self)


def _short(v):
    return '{:.6g}'.format(v) if isinstance(v, float) else v


class ProbeRecorder(ObservationsWriter):
    """Writes the rows of a :class:`ProbingLossScaling` to ``probe.csv``
    (columns :data:`FIELDS`) after every step (an
    :class:`~ada_loss.analysis.observing.ObservationsWriter`)."""

    header = FIELDS
    filename = 'probe.csv'
    format = staticmethod(_short)

    def take(self):
        records, self.scaling.records = self.scaling.records, []
        return records


def load_csv(path):
    """The rows of a probe CSV (:data:`FIELDS`) as dicts of typed values
    (NaN where a value is missing)."""
    rows = []
    with open(path, newline='') as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if k in ('mode', 'layer', 'set_by'):
                    row[k] = v
                elif k in ('iteration', 'layer_id', 'skipped'):
                    row[k] = int(v)
                else:
                    row[k] = float(v) if v not in ('', 'None') else math.nan
            rows.append(row)
    return rows


def save_csv(records, path):
    def write(f):
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for r in records:
            w.writerow({k: _short(r.get(k)) for k in FIELDS})
    atomic.replace_with(path, write)
    return path
