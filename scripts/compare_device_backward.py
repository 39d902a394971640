"""The same model, data and steps on the CPU and on a GPU, compared: a
diagnostic of the device path of a loss-scaling mode in a precision (issue
35). The CPU side is saved to a file, so the two can run on different
machines (the GPU machine has no network):

    python scripts/compare_device_backward.py --device @numpy --save ref.npz \\
        --precision fp8_e4m3 --mode adaptive
    python scripts/compare_device_backward.py --device @cupy:0 --compare ref.npz

Per parameter, the unscaled gradient of the first step (``grad / α``): the
relative error of the device's against the CPU's (‖Δ‖/‖g_cpu‖), its
non-finite entries, and the α each parameter was unscaled by; then the loss
of every step on both. The error is not small even where both paths are
right: summation order (cuBLAS vs OpenBLAS, CuPy's batch-norm reductions)
gave up to 3e-2 in FP32, 8e-2 in mixed16 and 0.5–0.8 in the FP8 precisions
on ResNet-20 (benchmarks/gpu_h200/round4/cmp_*.txt), as much under Chainer's
own backward as under the adaptive one; judge a device path against such a
control (the same precision with mode none), not against a fixed threshold:
NaN, a different skip count or a loss curve that parts at once are the
signs of a device path that computes something else.
"""
import argparse
import json
import sys

import numpy

sys.path.insert(0, __file__.rsplit('/scripts/', 1)[0])
import chainer  # NOQA: E402

from ada_loss.datasets.fashion_mnist import get_fashion_mnist  # NOQA: E402
from ada_loss.models import build_model  # NOQA: E402
from ada_loss.precision import dtype_config  # NOQA: E402
from ada_loss.scaling.modes import make_loss_scaling  # NOQA: E402
from ada_loss.training import Classifier  # NOQA: E402
from ada_loss.training.precision_setup import setup_optimizer  # NOQA: E402
from ada_loss.training.safe_npz import open_npz  # NOQA: E402
from ada_loss.training.updater import all_grads_finite  # NOQA: E402


def host(a):
    return chainer.backend.CpuDevice().send(a)


def run(args):
    """(losses per step, {param: unscaled gradient of step 0}, {param: α},
    skipped steps)."""
    numpy.random.seed(args.seed)
    with dtype_config(args.precision):
        model = Classifier(build_model(args.model, 10, width=args.width,
                                       in_channels=1),
                           args.precision, args.seed)
    device = chainer.get_device(args.device)
    device.use()
    model.to_device(device)
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(lr=args.lr),
                          model, args.precision)
    scaling = make_loss_scaling(args.mode, args.precision)
    scaling.bind(model)
    train, _ = get_fashion_mnist(args.root)
    n = args.steps * args.batch
    x_all = (train.images[:n].astype(numpy.float32) / 255.0)
    t_all = numpy.asarray([train[i][1] for i in range(n)], numpy.int32)
    losses, grads, alphas, skipped = [], {}, {}, 0
    with chainer.using_config('train', True):
        for step in range(args.steps):
            sl = slice(step * args.batch, (step + 1) * args.batch)
            x, t = device.send(x_all[sl]), device.send(t_all[sl])
            model.cleargrads()
            loss = model(x, t)
            scaling.backward(loss)
            losses.append(float(host(loss.array)))
            if step == 0:
                for name, p in sorted(model.namedparams()):
                    s = p._loss_scale
                    s = 1.0 if s is None else float(host(s))
                    grads[name] = host(p.grad).astype(numpy.float64) / s
                    alphas[name] = s
            finite = all_grads_finite(model)
            if finite:
                opt.update()
            else:
                skipped += 1
            scaling.update(not finite)
    return losses, grads, alphas, skipped


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--device', default='@numpy')
    p.add_argument('--model', default='resnet20')
    p.add_argument('--width', type=int, default=16)
    p.add_argument('--precision', default='fp8_e4m3')
    p.add_argument('--mode', default='adaptive')
    p.add_argument('--steps', type=int, default=20)
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--lr', type=float, default=0.05)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--root', default='/usr/share/datasets/fashion-mnist')
    p.add_argument('--save', help='write this run to an .npz file')
    p.add_argument('--compare', help='compare this run with a saved one '
                   '(its settings are used)')
    args = p.parse_args(argv)
    if args.compare:
        ref = open_npz(args.compare)        # no pickles
        saved = json.loads(str(ref['settings']))
        for key in ('model', 'width', 'precision', 'mode', 'steps', 'batch',
                    'lr', 'seed'):
            setattr(args, key, saved[key])
    losses, grads, alphas, skipped = run(args)
    print('{} {} {} width {} on {}: {} steps, {} skipped'.format(
        args.model, args.precision, args.mode, args.width, args.device,
        args.steps, skipped))
    if args.save:
        settings = {k: getattr(args, k) for k in (
            'model', 'width', 'precision', 'mode', 'steps', 'batch', 'lr',
            'seed')}
        arrays = {'g/' + k: v for k, v in grads.items()}
        arrays.update({'a/' + k: numpy.float64(v) for k, v in alphas.items()})
        numpy.savez(args.save, settings=json.dumps(settings),
                    losses=numpy.array(losses), skipped=skipped, **arrays)
        print('saved', args.save)
    if not args.compare:
        print('losses', ' '.join('{:.4f}'.format(v) for v in losses))
        return 0
    print('{:<40} {:>10} {:>8} {:>12} {:>12}'.format(
        'parameter', 'rel. err', 'nonfin.', 'α cpu', 'α device'))
    worst = 0.0
    for name in sorted(grads):
        g_ref = ref['g/' + name]
        g = grads[name]
        bad = int((~numpy.isfinite(g)).sum())
        norm = numpy.linalg.norm(g_ref)
        err = numpy.linalg.norm(numpy.nan_to_num(g - g_ref)) / norm \
            if norm > 0 else float(numpy.abs(g).max())
        worst = max(worst, err)
        print('{:<40} {:>10.3e} {:>8} {:>12g} {:>12g}'.format(
            name, err, bad, float(ref['a/' + name]), alphas[name]))
    print('largest relative error: {:.3e}'.format(worst))
    print('step  loss cpu  loss device')
    for i, (a, b) in enumerate(zip(ref['losses'], losses)):
        print('{:>4}  {:8.4f}  {:8.4f}'.format(i, a, b))
    print('skipped: cpu {} device {}'.format(int(ref['skipped']), skipped))
    return 0


if __name__ == '__main__':
    sys.exit(main())
