"""How much of the loss gradient survives its cast into a gradient format.

The ⟨α, δ⟩ backward starts at the loss gradient with α_{N+1} = init_scale
(default 1, as the paper's code). Softmax cross-entropy averaged over a
batch of B gives entries (p_k − y_k)/B: every one is at most 1/B in
magnitude, and the wrong classes' entries p_k/B are far smaller. In a
format whose smallest normal is above 1/B (FP8 E4M3: 2^-6; at B = 128 the
largest entry is ≤ 2^-7) the whole tensor is subnormal or flushed at α = 1.
This script measures that on real batches of a CIFAR ResNet (the FP32
forward in training mode, as a step sees it), at α = 1 and at the
top-binade α of ``adaptive:init_scale=amax``
(:func:`ada_loss.loss_scale.fit.top_binade_scale`), per batch size and
format, for the model at initialization or from a run's snapshot (issue 32
item 2; docs/depth_study.md).

    python scripts/loss_gradient_in_format.py --root .data/fashion-mnist \
        [--snapshot RUN/snapshot_latest] [--batches 64,128] \
        [--formats fp8_e4m3,fp8_e5m2,float16] [--steps 8]

A depth-study model (14x14 images, width 4, the 2000 training images it
trains on): ``--model resnet56 --width 4 --downsample 2 --train-size 2000``
(the study's average pooling after the normalization; its subset).
"""
import argparse
import os
import sys

import numpy

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402

from ada_loss import datasets as D  # NOQA: E402
from ada_loss.experiment import models  # NOQA: E402
from ada_loss.experiment.data import subset_indices  # NOQA: E402
from ada_loss.experiment.studies.depth import Downsample  # NOQA: E402
from ada_loss.formats import get_format  # NOQA: E402
from ada_loss.loss_scale.fit import top_binade_scale  # NOQA: E402
from ada_loss.training.safe_npz import load_npz  # NOQA: E402


def loss_gradient(model, x, t):
    """∂L/∂logits of the batch-mean softmax cross-entropy, in float32."""
    with chainer.using_config('train', True), \
            chainer.using_config('enable_backprop', False):
        y = model(x).array
    p = F.softmax(y).array
    g = p.copy()
    g[numpy.arange(len(t)), t] -= 1
    return (g / len(t)).astype(numpy.float32)


def cast_report(g, t, fmt, alpha):
    """Shares (in %) of the loss gradient lost in ``fmt`` at scale α."""
    q = fmt.quantize((g * numpy.float32(alpha)).astype(numpy.float32))
    q = q.astype(numpy.float64) / alpha
    true = numpy.zeros(g.shape, bool)
    true[numpy.arange(len(t)), t] = True
    nz = g != 0
    normal_min = 2.0 ** fmt.emin
    scaled = numpy.abs(g.astype(numpy.float64)) * alpha
    off = ~true
    return {
        'flushed': 100.0 * numpy.mean((q == 0)[nz]),
        'flushed_true': 100.0 * numpy.mean((q == 0)[true & nz]),
        'subnormal': 100.0 * numpy.mean((scaled < normal_min)[nz]),
        'off_mass_kept': 100.0 * numpy.abs(q[off]).sum()
        / numpy.abs(g[off].astype(numpy.float64)).sum(),
        'rel_error': 100.0 * numpy.linalg.norm(q - g) / numpy.linalg.norm(g),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--root', required=True,
                    help='Fashion-MNIST folder (the four .gz files)')
    ap.add_argument('--snapshot', default=None,
                    help="a run's snapshot (trainer NPZ); default: the "
                         'model at initialization')
    ap.add_argument('--model', default='resnet20')
    ap.add_argument('--width', type=int, default=16)
    ap.add_argument('--downsample', type=int, default=1,
                    help="average pooling factor (the depth study's 2)")
    ap.add_argument('--train-size', type=int, default=None,
                    help='draw batches from the training subset of this '
                         "size (data.train_size, split seed 0; the depth "
                         "study's 2000); default: all images")
    ap.add_argument('--batches', default='64,128')
    ap.add_argument('--formats', default='fp8_e4m3,fp8_e5m2,float16')
    ap.add_argument('--steps', type=int, default=8,
                    help='batches averaged per batch size')
    ap.add_argument('--seed', type=int, default=0)
    a = ap.parse_args(argv)
    numpy.random.seed(a.seed)
    train, _ = D.get_fashion_mnist(a.root)
    mean, std = D.channel_stats(train.images)
    model = models.build(a.model, 10, 1, width=a.width)
    if a.snapshot:
        # no pickles, every array checked: one error line naming the file
        try:
            load_npz(a.snapshot, model,
                     path='updater/model:main/predictor/')
        except (OSError, ValueError) as e:
            ap.error('--snapshot {}'.format(e))
    rng = numpy.random.RandomState(a.seed)
    pool = subset_indices(len(train.images), a.train_size, 0)
    down = Downsample(a.downsample)
    print('model {} width {}, {}x{} images, {}; FP32 forward in training '
          'mode; means over {} batches{}'.format(
              a.model, a.width, 28 // a.downsample, 28 // a.downsample,
              a.snapshot or 'at initialization', a.steps,
              ' of {} training images'.format(len(pool))
              if a.train_size else ''))
    print('| format | B | α | entries flushed % | true-class entries '
          'flushed % | subnormal % | wrong-class mass kept % | '
          'rel. error % |')
    print('|---|---|---|---|---|---|---|---|')
    for b in [int(v) for v in a.batches.split(',')]:
        grads = []
        for _ in range(a.steps):
            idx = rng.choice(pool, b, replace=False)
            # each image as training reads it: the dataset's scaling, then
            # the per-channel normalization of the classification runs
            x = numpy.stack([down((D.normalize(train[int(i)][0], mean, std),
                                   0))[0] for i in idx])
            t = train.labels[idx].astype(numpy.int32)
            grads.append((loss_gradient(model, x, t), t))
        for name in a.formats.split(','):
            fmt = get_format(name)
            for rule in ('1', 'amax'):
                rows = []
                alphas = []
                for g, t in grads:
                    alpha = (1.0 if rule == '1' else top_binade_scale(
                        float(numpy.abs(g).max()), fmt))
                    alphas.append(alpha)
                    rows.append(cast_report(g, t, fmt, alpha))
                m = {k: numpy.mean([r[k] for r in rows]) for k in rows[0]}
                al = ('1' if rule == '1' else '2^{:g}'.format(
                    numpy.median(numpy.log2(alphas))))
                print('| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | '
                      '{:.1f} |'.format(name, b, al, m['flushed'],
                                        m['flushed_true'], m['subnormal'],
                                        m['off_mass_kept'], m['rel_error']))


if __name__ == '__main__':
    main()
