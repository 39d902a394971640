"""Recording per-layer activation-gradient statistics during training.

:class:`GradientRecorder` is a Chainer ``FunctionHook``: its
``backward_preprocess`` sees every GEMM node (:class:`ada_loss.functions.
GemmFunction`: the forward node of a Linear/Convolution/Deconvolution layer)
with the gradient arriving at its output -- the activation gradient the layer
back-propagates -- and summarizes it with :mod:`ada_loss.analysis.grad_stats`.
Layer IDs are assigned in the order the layers are first met in the backward
pass, i.e. in the topological order of backpropagation: ID 0 is the layer
nearest the loss, higher IDs are closer to the input (paper Fig. 1).

:class:`RecordingLossScaling` wraps any loss-scaling method and installs the
hook only for the backward passes of every ``every``-th iteration, so that
recording costs nothing otherwise (the hook is not registered at all).
After the pass it learns the scale alpha each layer's gradient was carried at
(the run's loss scale, or the per-layer alpha of adaptive scaling) and
derives the true gradient's statistics exactly (alpha is a power of two).

Each record (one per iteration and layer) holds: ``iteration``,
``layer_id``, ``layer``, ``dtype``, ``size``, ``nonzero``, ``alpha`` and
``beta`` (1 outside adaptive scaling), ``underflow_rate`` and
``expected_loss_scale`` of the true gradient (Fig. 1), ``std`` and
``max_abs`` of the carried gradient (σ_max, §4.2), and, in FP16 runs,
``zeros_fp16``, ``zeros_fp32`` and ``fp16_underflow`` of the layer's input
gradient GEMM (Fig. 4b). ``skipped`` marks iterations whose update was
skipped for non-finite gradients. Not a CSV column: ``log2_hist``, {e:
count} of the true gradient's nonzero entries with |g| in [2^(e-1), 2^e)
(TensorBoard's histograms of log2|g|).
"""
import collections
import csv
import math

import chainer
import numpy

from ada_loss import atomic
from ada_loss.analysis import grad_stats
from ada_loss.analysis.observing import (
    ObservationsWriter, ObservingLossScaling)
from ada_loss.functions.gemm import GemmFunction
from ada_loss.links import is_gemm_link

#: Column order of the CSV records.
FIELDS = ('iteration', 'layer_id', 'layer', 'dtype', 'size', 'nonzero',
          'alpha', 'beta', 'underflow_rate', 'expected_loss_scale', 'std',
          'max_abs', 'zeros_fp16', 'zeros_fp32', 'fp16_underflow', 'skipped')


def _key_of(func):
    return func.scale_key or '{}#{}'.format(func.label, id(func))


class GradientRecorder(chainer.FunctionHook):
    """FunctionHook collecting per-GEMM gradient statistics (see module).

    Args:
        fp16_underflow (bool): also compute each layer's input-gradient GEMM
            in FP32 to measure FP16 underflow (Fig. 4b; FP16 runs only; one
            extra GEMM per layer on recorded iterations).
    """

    name = 'GradientRecorder'

    def __init__(self, fp16_underflow=True):
        self.fp16_underflow = fp16_underflow
        self.layer_ids = collections.OrderedDict()
        self.records = []
        self._pending = []

    # -- naming -----------------------------------------------------------
    def bind(self, model):
        """Names every ada_loss GEMM link of ``model`` by its path (as
        :class:`ada_loss.AdaLossScaled` does): the layers' GEMMs, the tied
        readout and attention's GEMMs, so that a mode on Chainer's own
        backward names them as adaptive does."""
        for path, link in model.namedlinks():
            if is_gemm_link(link):
                link.scale_key = path.lstrip('/')

    # -- the hook ---------------------------------------------------------
    def backward_preprocess(self, function, in_data, out_grad):
        # Chainer's backward: every GEMM's input gradient at scale 1
        self.scaled_backward_preprocess(function, in_data, out_grad, 1)

    def scaled_backward_preprocess(self, function, in_data, out_grad,
                                   input_scale):
        """What the ⟨α, δ⟩ backward (:class:`ada_loss.adaptive.
        ScaledBackprop`) calls for a GEMM node instead of
        ``backward_preprocess``, with the β its input gradient is computed
        at."""
        if not isinstance(function, GemmFunction) or out_grad[0] is None:
            return
        gy = chainer.backend.CpuDevice().send(out_grad[0])
        key = _key_of(function)
        if key not in self.layer_ids:
            self.layer_ids[key] = len(self.layer_ids)
        row = {
            'layer_id': self.layer_ids[key], 'layer': key,
            'dtype': str(gy.dtype), 'size': int(gy.size),
            'nonzero': int(numpy.count_nonzero(gy)),
            'beta': float(input_scale),
            'std': grad_stats.std(gy), 'max_abs': grad_stats.max_abs(gy),
            '_kth': grad_stats.kth_smallest_nonzero(gy),
            '_hist': grad_stats.exponent_histogram(gy),
        }
        row.update(self._fp16_underflow(function, in_data, out_grad[0],
                                        input_scale))
        self._pending.append(row)

    def _fp16_underflow(self, function, in_data, gy, scale):
        nan = float('nan')
        out = {'zeros_fp16': nan, 'zeros_fp32': nan, 'fp16_underflow': nan}
        if not (self.fp16_underflow and gy.dtype == numpy.float16
                and function.inputs[0].requires_grad):
            return out
        x, W = in_data[0], in_data[1]
        if x is None or W is None:
            return out
        f32 = numpy.float32
        with chainer.no_backprop_mode():
            gx16 = function.grad_input(x, W, gy, scale)[0].array
            gx32 = function.grad_input(
                x.astype(f32), W.astype(f32), gy.astype(f32), scale)[0].array
        z16, z32 = (grad_stats.zero_fraction(chainer.backend.CpuDevice()
                                             .send(a)) for a in (gx16, gx32))
        out.update(zeros_fp16=z16, zeros_fp32=z32, fp16_underflow=z16 - z32)
        return out

    # -- completing a pass ------------------------------------------------
    def finish(self, iteration, alphas):
        """Completes the pending rows of one backward pass.

        Args:
            iteration (int): the training iteration (1-based).
            alphas: a float (one scale for the whole pass) or {layer: alpha}.
        """
        for row in self._pending:
            alpha = (alphas.get(row['layer'], 1.0) if isinstance(alphas, dict)
                     else float(alphas))
            hist, kth = row.pop('_hist'), row.pop('_kth')
            row['iteration'] = int(iteration)
            row['alpha'] = float(alpha)
            row['underflow_rate'] = grad_stats.underflow_count_from_histogram(
                hist, alpha) / max(row['size'], 1)
            row['expected_loss_scale'] = (alpha / kth if kth > 0
                                          else float('nan'))
            # log2|g| of the true gradient by binary exponent (for
            # TensorBoard's histograms; not a CSV column)
            shift = math.log2(alpha) if alpha > 0 else 0.0
            row['log2_hist'] = {e - shift: c for e, c in hist.items()}
            row['skipped'] = 0
            self.records.append(row)
        self._pending = []

    def mark_skipped(self, iteration):
        for row in self.records:
            if row['iteration'] == iteration:
                row['skipped'] = 1

    def discard_pending(self):
        self._pending = []

    # -- output -----------------------------------------------------------
    def save_csv(self, path):
        def write(f):
            writer = csv.DictWriter(f, FIELDS)
            writer.writeheader()
            for row in self.records:
                writer.writerow({k: row.get(k) for k in FIELDS})
        atomic.replace_with(path, write)
        return path

    def summary(self):
        """σ_max per iteration and overall, mean alpha per layer."""
        return summarize(self.records)


def summarize(records):
    """{'sigma_max', 'sigma_max_per_iteration', 'alpha_per_layer', ...}.

    σ_max of an iteration is the largest std over the layers' (scaled)
    activation gradients; the run's σ_max is the largest over iterations
    whose update was not skipped (§4.2).
    """
    per_it = collections.OrderedDict()
    alphas = collections.OrderedDict()
    for r in records:
        if not r.get('skipped') and math.isfinite(r['std']):
            per_it[r['iteration']] = max(per_it.get(r['iteration'], 0.0),
                                         r['std'])
        alphas.setdefault((r['layer_id'], r['layer']), []).append(r['alpha'])
    return {
        'sigma_max': max(per_it.values()) if per_it else float('nan'),
        'sigma_max_per_iteration': {str(k): v for k, v in per_it.items()},
        'iterations': sorted({r['iteration'] for r in records}),
        'alpha_per_layer': [
            {'layer_id': i, 'layer': name,
             'mean_log2_alpha': float(numpy.mean(numpy.log2(a)))}
            for (i, name), a in sorted(alphas.items())],
    }


def load_csv(path):
    """Records of :meth:`GradientRecorder.save_csv`, with numbers parsed."""
    ints = {'iteration', 'layer_id', 'size', 'nonzero', 'skipped'}
    rows = []
    with open(path, newline='') as f:
        for row in csv.DictReader(f):
            rows.append({k: (v if k in ('layer', 'dtype') else
                             int(v) if k in ints else float(v))
                         for k, v in row.items()})
    return rows


class RecordingLossScaling(ObservingLossScaling):
    """A loss-scaling method that records gradients every ``every`` steps.

    An :class:`ada_loss.analysis.observing.ObservingLossScaling`: it
    delegates everything to ``inner`` (any :class:`ada_loss.scaling.
    LossScaling`) and records, with ``recorder``, iteration 1 and every
    ``every``-th one (counted by backward passes, 1-based).
    """

    count_key = 'recorder_iteration'

    def __init__(self, inner, recorder=None, every=100):
        super(RecordingLossScaling, self).__init__(inner, every)
        self.recorder = recorder or GradientRecorder()

    def bind(self, model):
        self.recorder.bind(model)
        super(RecordingLossScaling, self).bind(model)

    def _observe(self, loss):
        try:
            scale, alphas = self._backward_with(self.recorder, loss)
        except Exception:
            self.recorder.discard_pending()
            raise
        self.recorder.finish(self.iteration,
                             scale if alphas is None else alphas)

    def _mark_skipped(self):
        self.recorder.mark_skipped(self.iteration)

    def writer(self):
        return RecordsWriter(self)


class RecordsWriter(ObservationsWriter):
    """Writes the records of a :class:`RecordingLossScaling` to
    ``records.csv`` (columns :data:`FIELDS`) after every step (an
    :class:`~ada_loss.analysis.observing.ObservationsWriter`)."""

    header = FIELDS
    filename = 'records.csv'

    def take(self):
        recorder = self.scaling.recorder
        records, recorder.records = recorder.records, []
        return records
