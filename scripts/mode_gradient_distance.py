"""How far apart the gradients of loss-scaling modes are, from the same
weights and the same batch (issue 32 item 2; docs/depth_study.md).

In a wide gradient format a power-of-two loss scale is exact: scaling the
loss by 4 or by 16 gives the same unscaled gradient except where a value
falls into the format's subnormal range or overflows. So in mixed16 (FP16
storage, 2^-24 to 65504) fixed:4, fixed:16 and adaptive's per-layer scales
may compute gradients far closer to each other than any of them is to
FP32's — and then no precision mechanism can make one of them train
systematically better, and a gap between their accuracies is the
trajectory's sensitivity to small perturbations, not a loss to underflow.
This measures that, on a depth-study model (Fashion-MNIST average-pooled by
``--downsample``, the study's normalization) at initialization or from a
run's snapshot: per mode, the unscaled gradient of every parameter (one
backward in training mode, batch normalization included), and the relative
distance ‖g_a − g_b‖ / ‖g_b‖ over all parameters as one vector between
every pair of modes, FP32's backward (precision float32, mode none) among
them; means over ``--steps`` batches. Beside it, per mode, the share of the
nonzero FP16 gradient entries every node of the backward receives (as
carried, at the mode's scale) that lie in FP16's subnormal range (below
2^-14, fewer significant bits: where two modes' gradients can differ at
all), over all nodes and at the node with the most.

    python scripts/mode_gradient_distance.py --root .data/fashion-mnist \\
        --model resnet56 --precision mixed16 \\
        --modes none,fixed:4,fixed:16,fixed:256,adaptive \\
        [--snapshot RUN/snapshot_latest] [--steps 4]
"""
import argparse
import contextlib
import os
import sys
import types

import numpy

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

import chainer  # NOQA: E402

from ada_loss.experiment.data import load_datasets  # NOQA: E402
from ada_loss.experiment.models import build  # NOQA: E402
from ada_loss.experiment.studies.depth import Downsample  # NOQA: E402
from ada_loss.scaling.modes import make_loss_scaling  # NOQA: E402
from ada_loss.training import Classifier, dtype_config  # NOQA: E402
from ada_loss.training.safe_npz import open_npz  # NOQA: E402

#: The reference column: FP32's own backward.
FP32 = 'float32'


def _build(a, precision):
    with dtype_config(precision):
        return Classifier(build(a.model, 10, 1, a.width, None), precision,
                          a.seed)


def _state(model):
    s = chainer.serializers.DictionarySerializer()
    s.save(model)
    return s.target


def make_model(a, precision, state):
    """The model in ``precision`` with the weights of ``state`` (every
    model of the comparison starts from the same values)."""
    model = _build(a, precision)
    chainer.serializers.NpzDeserializer(state).load(model)
    return model


def initial_state(a, precision='mixed16'):
    """The weights compared: a snapshot's, or one initialization's as
    ``precision`` stores them (its FP16 weights rounded once), so that the
    FP32 model starts from exactly the values the low-precision ones hold
    (a snapshot of a low-precision run holds them already)."""
    if a.snapshot:
        with open_npz(a.snapshot) as z:     # no pickles
            prefix = 'updater/model:main/'
            return {k[len(prefix):]: z[k] for k in z.files
                    if k.startswith(prefix)}
    numpy.random.seed(a.seed)
    return _state(make_model(a, precision, _state(_build(a, 'float32'))))


class SubnormalCounter(chainer.FunctionHook):
    """Counts the nonzero entries of the FP16 gradients each backward node
    receives, and those below FP16's smallest normal (2^-14) — the
    activation gradients as carried; the weight gradients the nodes
    produce are not among them."""

    name = 'SubnormalCounter'

    def __init__(self):
        self.nonzero = 0
        self.subnormal = 0
        self.worst = 0.0

    def backward_preprocess(self, function, in_data, out_grad):
        for g in out_grad:
            if g is None or g.dtype != numpy.float16:
                continue
            a = numpy.abs(g[g != 0])
            sub = int((a < numpy.finfo(numpy.float16).tiny).sum())
            self.nonzero += a.size
            self.subnormal += sub
            if a.size:
                self.worst = max(self.worst, sub / a.size)


def unscaled_gradients(model, scaling, x, t, counter=None):
    """{parameter: gradient / the scale it was carried at} (float64) of
    one backward of ``model`` on (x, t) under ``scaling`` (observed by the
    FunctionHook ``counter`` if given)."""
    model.cleargrads()
    with chainer.using_config('train', True):
        loss = model(x, t)
    with counter if counter is not None else contextlib.nullcontext():
        scaling.backward(loss)
    out = {}
    for name, p in model.namedparams():
        s = p._loss_scale
        s = 1.0 if s is None else float(s)
        out[name] = p.grad.astype(numpy.float64) / s
    return out


def distance(a, b):
    """‖a − b‖ / ‖b‖ over all parameters as one vector (inf where a has a
    non-finite entry)."""
    num = sum(float(numpy.sum((a[k] - b[k]) ** 2)) for k in b)
    den = sum(float(numpy.sum(b[k] ** 2)) for k in b)
    return float(numpy.sqrt(num / den)) if numpy.isfinite(num) \
        else float('inf')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--root', required=True,
                    help='Fashion-MNIST folder (the four .gz files)')
    ap.add_argument('--snapshot', default=None,
                    help="a depth-study run's snapshot (trainer NPZ); "
                         'default: the model at initialization')
    ap.add_argument('--model', default='resnet56')
    ap.add_argument('--width', type=int, default=4)
    ap.add_argument('--downsample', type=int, default=2)
    ap.add_argument('--precision', default='mixed16')
    ap.add_argument('--modes', default='none,fixed:4,fixed:16,fixed:256,'
                    'adaptive')
    ap.add_argument('--train-size', type=int, default=2000,
                    help="the training subset batches are drawn from (the "
                         "depth study's data.train_size, split seed 0)")
    ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--steps', type=int, default=4,
                    help='batches averaged')
    ap.add_argument('--seed', type=int, default=0)
    a = ap.parse_args(argv)
    modes = a.modes.split(',')
    data_cfg = types.SimpleNamespace(
        fashion_mnist_root=a.root, split_seed=0, train_size=a.train_size,
        test_size=None, augment=False)
    train, _ = load_datasets('fashion_mnist', data_cfg)
    train = chainer.datasets.TransformDataset(train, Downsample(a.downsample))
    rng = numpy.random.RandomState(a.seed)
    columns = [FP32] + modes
    state = initial_state(a, a.precision)
    runs = {FP32: (make_model(a, 'float32', state),
                   make_loss_scaling('none', 'float32'))}
    for mode in modes:
        model = make_model(a, a.precision, state)
        scaling = make_loss_scaling(mode, a.precision)
        scaling.bind(model)
        runs[mode] = (model, scaling)
    sums = numpy.zeros((len(columns), len(columns)))
    counters = {c: SubnormalCounter() for c in modes}
    for _ in range(a.steps):
        idx = rng.choice(len(train), a.batch, replace=False)
        x = numpy.stack([train[int(i)][0] for i in idx])
        t = numpy.asarray([train[int(i)][1] for i in idx], numpy.int32)
        grads = {c: unscaled_gradients(runs[c][0], runs[c][1], x, t,
                                       counters.get(c))
                 for c in columns}
        for i, ci in enumerate(columns):
            for j, cj in enumerate(columns):
                if i != j:
                    sums[i, j] += distance(grads[ci], grads[cj])
    print('{} width {}, {}x{} images, {} ({}); batch {} of {} training '
          'images, means over {} batches'.format(
              a.model, a.width, 28 // a.downsample, 28 // a.downsample,
              a.snapshot or 'at initialization', a.precision, a.batch,
              len(train), a.steps))
    print('relative distance ‖g_row − g_col‖ / ‖g_col‖ of the unscaled '
          'gradient, all parameters as one vector')
    print('| | ' + ' | '.join(columns) + ' |')
    print('|---|' + '---|' * len(columns))
    for i, ci in enumerate(columns):
        cells = ['—' if i == j else '{:.2e}'.format(sums[i, j] / a.steps)
                 for j in range(len(columns))]
        print('| {} | {} |'.format(ci, ' | '.join(cells)))
    print()
    print('| mode | FP16 gradient entries subnormal, all nodes | at the '
          'node with the most |')
    print('|---|---|---|')
    for c in modes:
        k = counters[c]
        if k.nonzero:
            print('| {} | {:.2f} % | {:.1f} % |'.format(
                c, 100.0 * k.subnormal / k.nonzero, 100.0 * k.worst))
        else:
            print('| {} | no FP16 gradients | — |'.format(c))


if __name__ == '__main__':
    main()
