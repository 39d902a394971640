#!/usr/bin/env python
"""How fast are FP16 GEMMs on this CPU: float32 vs emulated vs native FP16.

NumPy has no BLAS path for float16, so ``ada_loss`` *emulates* FP16 GEMMs on
CPU (``chainer.config.fp16_gemm = 'emulated'``, the default): the float16
inputs are widened to float32, the product is accumulated in float32 by BLAS,
and the result is rounded once to float16 -- the numerics of GPU tensor cores.
``'native'`` runs NumPy's own float16 arithmetic instead.

Measured, in one run, wall-clock medians over ``--repeats`` timed repetitions
after warm-up:

(a) one 3x3 convolution, 16 -> 16 channels, pad 1, no bias, on
    x(batch, 16, 32, 32): forward + backward (gx and gW), through
    ``ada_loss.functions.convolution_2d`` (``--conv-repeats`` repetitions,
    float32 and emulated interleaved), in
    * float32,
    * float16, emulated,
    * float16, native (``--native-repeats`` repetitions; ~7 s each).

(b) one CIFAR ResNet-20 training step, batch ``--batch`` of 32x32x3 random
    images: ``Classifier`` forward, backward, finite check and MomentumSGD
    update through ``MixedPrecisionUpdater`` (``setup_optimizer``: FP32 master
    weights in mixed16), in
    * ``fp32`` (float32 everywhere),
    * ``mixed16`` with ``fixed:128`` loss scaling, emulated FP16 GEMMs,
    * the same with native FP16 GEMMs (``--native-steps`` steps; minutes
      each, so it can be left out with ``--skip-native-resnet``).
    The native model is warmed up with one emulated step (same model, same
    optimizer state; only the GEMM kernels differ), so its first timed step
    pays no one-time cost.

Printed: a table of medians (wall clock; process CPU time beside it, which
is less disturbed by other processes on a shared machine) and the ratios
emulated/float32 (target <= 1.5) and native/emulated (target > 10).

Run:  .venv/bin/python scripts/bench_fp16.py [--repeats 5] [--batch 128]
      [--conv-repeats 20] [--native-repeats 2] [--native-steps 1]
      [--skip-native-resnet]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as bc  # NOQA: E402  (puts the repository on sys.path)

import numpy  # NOQA: E402

import chainer  # NOQA: E402

import ada_loss  # NOQA: E402,F401
from ada_loss.functions import convolution_2d  # NOQA: E402


def measure(fn, repeats, warmup):
    """[(wall s, cpu s)] of ``repeats`` calls of ``fn`` after ``warmup``."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - w0, time.process_time() - c0))
    return out


def conv_case(dtype, fp16_gemm, batch, seed=0):
    rng = numpy.random.RandomState(seed)
    x0 = rng.standard_normal((batch, 16, 32, 32)).astype(dtype)
    W0 = (rng.standard_normal((16, 16, 3, 3)) * (2.0 / 144) ** 0.5).astype(
        dtype)
    gy0 = rng.standard_normal((batch, 16, 32, 32)).astype(dtype)

    def run():
        with chainer.using_config('fp16_gemm', fp16_gemm), \
                chainer.using_config('train', True):
            x = chainer.Variable(x0)
            W = chainer.Variable(W0)
            y = convolution_2d(x, W, pad=1)
            y.grad = gy0
            y.backward()
            assert x.grad is not None and W.grad is not None
            assert x.grad.dtype == dtype and W.grad.dtype == dtype
    return run


def summarize(rows):
    wall = bc.median([w for w, _ in rows])
    cpu = bc.median([c for _, c in rows])
    return wall, cpu


def print_table(title, results, order):
    print()
    print(title)
    print('  {:<34} {:>5} {:>10} {:>10}   {}'.format(
        'case', 'n', 'wall [s]', 'cpu [s]', 'wall times [s] (first 10)'))
    for key in order:
        if key not in results:
            continue
        label, rows = results[key]
        wall, cpu = summarize(rows)
        print('  {:<34} {:>5} {:>10.3f} {:>10.3f}   {}'.format(
            label, len(rows), wall, cpu,
            ' '.join('{:.3f}'.format(w) for w, _ in rows[:10])
            + (' ...' if len(rows) > 10 else '')))


def print_ratios(results, f32, emu, nat):
    def ratio(a, b):
        if a not in results or b not in results:
            return None
        wa, ca = summarize(results[a][1])
        wb, cb = summarize(results[b][1])
        return wa / wb, ca / cb
    r = ratio(emu, f32)
    if r:
        print('  emulated / float32 : {:6.2f}x wall  {:6.2f}x cpu   '
              '(target <= 1.5x: {})'.format(r[0], r[1],
                                            'met' if r[0] <= 1.5 else
                                            'MISSED'))
    r = ratio(nat, emu)
    if r:
        print('  native / emulated  : {:6.1f}x wall  {:6.1f}x cpu   '
              '(target > 10x: {})'.format(r[0], r[1],
                                          'met' if r[0] > 10 else 'MISSED'))
    else:
        print('  native / emulated  : (native not run)')


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--repeats', type=int, default=5,
                   help='timed ResNet-20 steps of float32 and of emulated '
                   'mixed16 (interleaved)')
    p.add_argument('--batch', type=int, default=128, help='batch size')
    p.add_argument('--warmup', type=int, default=1,
                   help='untimed repetitions before timing')
    p.add_argument('--native-repeats', type=int, default=2,
                   help='timed repetitions of the native FP16 convolution')
    p.add_argument('--native-steps', type=int, default=1,
                   help='timed native-FP16 ResNet-20 steps')
    p.add_argument('--skip-native-resnet', action='store_true',
                   help='do not run the (minutes long) native ResNet-20 step')
    p.add_argument('--skip-resnet', action='store_true',
                   help='only the convolution benchmark (a)')
    p.add_argument('--conv-repeats', type=int, default=None,
                   help='timed repetitions of the float32 and emulated '
                   'convolution (interleaved); None: 4 x --repeats')
    args = p.parse_args()
    if args.conv_repeats is None:
        args.conv_repeats = 4 * args.repeats

    print('bench_fp16: FP16 GEMMs on CPU, float32 vs emulated vs native')
    bc.print_machine_info()
    print('settings: batch {} | ResNet repeats {}, conv repeats {} (native '
          'conv {}, native ResNet steps {}) | warm-up {}'.format(
              args.batch, args.repeats, args.conv_repeats,
              args.native_repeats,
              0 if args.skip_native_resnet or args.skip_resnet
              else args.native_steps, args.warmup))
    sys.stdout.flush()

    # (a) convolution -----------------------------------------------------
    conv = {}
    cases = (('f32', 'float32', conv_case(numpy.float32, 'emulated',
                                          args.batch)),
             ('emu', 'float16 emulated', conv_case(numpy.float16, 'emulated',
                                                   args.batch)))
    for _ in range(args.warmup):
        for _, _, fn in cases:
            fn()
    rows = {key: [] for key, _, _ in cases}
    for _ in range(args.conv_repeats):    # interleaved, against drift
        for key, _, fn in cases:
            rows[key].extend(measure(fn, 1, 0))
    for key, label, _ in cases:
        conv[key] = (label, rows[key])
    if args.native_repeats > 0:
        conv['nat'] = ('float16 native', measure(
            conv_case(numpy.float16, 'native', args.batch),
            args.native_repeats, min(args.warmup, 1)))
    print_table('(a) conv 3x3 16->16 pad 1, x({},16,32,32), forward+backward'
                .format(args.batch), conv, ['f32', 'emu', 'nat'])
    print_ratios(conv, 'f32', 'emu', 'nat')
    sys.stdout.flush()

    if args.skip_resnet:
        print('load avg at end: {}'.format(bc.load_average()))
        return

    # (b) ResNet-20 training step -----------------------------------------
    res = {}
    f32 = bc.ResNetStep('fp32', args.batch)
    emu = bc.ResNetStep('fixed:128', args.batch, fp16_gemm='emulated')
    for _ in range(args.warmup):
        f32.step()
        emu.step()
    rows = {'f32': [], 'emu': []}
    for _ in range(args.repeats):     # interleaved, against drift
        for key, s in (('f32', f32), ('emu', emu)):
            w0, c0 = time.perf_counter(), time.process_time()
            s.step()
            rows[key].append((time.perf_counter() - w0,
                              time.process_time() - c0))
    res['f32'] = ('fp32 (float32)', rows['f32'])
    res['emu'] = ('mixed16 fixed:128, emulated', rows['emu'])
    if not args.skip_native_resnet and args.native_steps > 0:
        nat = bc.ResNetStep('fixed:128', args.batch, fp16_gemm='native')
        nat.fp16_gemm = 'emulated'
        nat.step()                    # warm-up (optimizer state, caches)
        nat.fp16_gemm = 'native'
        res['nat'] = ('mixed16 fixed:128, native', measure(
            nat.step, args.native_steps, 0))
    print_table('(b) CIFAR ResNet-20 training step, batch {} (MomentumSGD, '
                'MixedPrecisionUpdater)'.format(args.batch), res,
                ['f32', 'emu', 'nat'])
    print_ratios(res, 'f32', 'emu', 'nat')
    print('  (emulated: also the float16 element-wise ops -- ReLU, add, '
          'batch norm -- through ada_loss.functions, bit for bit Chainer\'s; '
          'native: GEMMs in NumPy float16)')
    print('load avg at end: {}'.format(bc.load_average()))


if __name__ == '__main__':
    bc.run_with_output(main, 'bench_fp16')
