#!/usr/bin/env python
"""Speed of the emulated precisions: quantization alone and a ResNet-20
training step in each precision, as a ratio to float32, from one run.

(a) ``FloatFormat.quantize`` on 4M float32 values (ns per element), against
    ``x.astype(ml_dtypes.T).astype(float32)`` where ml_dtypes has the format.
(b) CIFAR ResNet-20, batch 128, one ``MixedPrecisionUpdater`` step with
    ``fixed:8`` (so that every precision runs the same backward), for
    float32, mixed16, bf16, fp8 (E4M3 forward, E5M2 gradients), fp8_e4m3
    and the scaled precisions fp8:recipe=current, fp8:recipe=delayed and
    mxfp8 (also nvfp4 and fp8:recipe=blockwise when named; precisions with
    E2M1 gradients run ``fixed:4``, as a scale must be below 6); steps
    are interleaved round-robin against drift; medians and
    ratios to float32 are printed. Targets: <= 1.3x for the unscaled
    formats and the per-tensor recipes, <= 1.6x for MX (issue 25);
    <= 1.6x for nvfp4, <= 1.3x for fp8:recipe=blockwise (issue 33).
    ``--clock process`` times each step by this process's CPU time instead
    of wall time (for a machine shared with other jobs).
(c) the scaled quantizers alone (ns per element): quantize_mx along the
    last axis and along axis 0 of a (4096, 1024) matrix, the per-tensor
    cast (its amax included); quantize_nvfp4 (1x16, stochastic, 16x16),
    the 16-point RHT, quantize_blockwise (1x128, 128x128).

    .venv/bin/python scripts/bench_formats.py [--batch 128] [--repeats 5]
"""
import argparse
import sys
import time

import bench_common as bc  # NOQA (puts the project on sys.path)
import numpy

from ada_loss.formats import get_format
from ada_loss.precision import parse_precision


def quantize_table(n=4000000):
    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    rng = numpy.random.RandomState(0)
    x = (rng.standard_normal(n) * numpy.exp2(rng.uniform(-20, 8, n))).astype(
        numpy.float32)
    refs = {'float16': numpy.float16, 'bfloat16': 'bfloat16',
            'fp8_e4m3': 'float8_e4m3fn', 'fp8_e5m2': 'float8_e5m2',
            'e4m3': 'float8_e4m3', 'e3m0': None}
    print('(a) quantize, {:.0f}M float32 values: ns per element (median of '
          '3)'.format(n / 1e6))
    print('  {:<10s} {:>10s} {:>12s}'.format('format', 'quantize',
                                            'ml_dtypes'))
    for name, ref in refs.items():
        fmt = get_format(name)
        fmt.quantize(x[:1000])
        t = bc.median([bc.timed(lambda: fmt.quantize(x)) for _ in range(3)])
        r = ''
        if ref is not None and ml_dtypes is not None:
            typ = ref if not isinstance(ref, str) else getattr(ml_dtypes, ref)
            tr = bc.median([bc.timed(lambda: x.astype(typ).astype(
                numpy.float32)) for _ in range(3)])
            r = '{:.2f}'.format(tr / n * 1e9)
        print('  {:<10s} {:>10.2f} {:>12s}'.format(name, t / n * 1e9, r))
    sys.stdout.flush()


def scaled_quantize_table(rows=4096, cols=1024):
    from ada_loss.formats import (quantize_blockwise, quantize_mx,
                                  quantize_nvfp4, quantize_per_tensor,
                                  random_hadamard)
    rng = numpy.random.RandomState(0)
    x = (rng.standard_normal((rows, cols)) * numpy.exp2(
        rng.uniform(-20, 8, (rows, 1)))).astype(numpy.float32)
    n = x.size
    cases = [
        ('mx e4m3 axis -1', lambda: quantize_mx(x, 'fp8_e4m3')),
        ('mx e4m3 axis 0', lambda: quantize_mx(x, 'fp8_e4m3', axis=0)),
        ('mx e2m1 axis -1', lambda: quantize_mx(x, 'fp4_e2m1')),
        ('per-tensor e4m3', lambda: quantize_per_tensor(x, 'fp8_e4m3')),
        ('nvfp4 1x16 -1', lambda: quantize_nvfp4(x)),
        ('nvfp4 1x16 -1 sr', lambda: quantize_nvfp4(x, rounding='stochastic')),
        ('nvfp4 16x16', lambda: quantize_nvfp4(x, tile=(16, 16))),
        ('rht16 axis -1', lambda: random_hadamard(x)),
        ('blockwise 1x128', lambda: quantize_blockwise(x)),
        ('blockwise 128x128', lambda: quantize_blockwise(x, tile=(128, 128))),
    ]
    print('(c) scaled quantizers, {}x{} float32: ns per element (median of '
          '3)'.format(rows, cols))
    for name, fn in cases:
        fn()
        t = bc.median([bc.timed(fn) for _ in range(3)])
        print('  {:<18s} {:>8.2f}'.format(name, t / n * 1e9))
    sys.stdout.flush()


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--precisions', default='float32,mixed16,bf16,fp8,'
                                           'fp8_e4m3,fp8:recipe=current,'
                                           'fp8:recipe=delayed,mxfp8')
    p.add_argument('--skip-quantize', action='store_true')
    p.add_argument('--clock', choices=('wall', 'process'), default='wall')
    args = p.parse_args()
    clock = time.perf_counter if args.clock == 'wall' else time.process_time
    bc.print_machine_info()
    if not args.skip_quantize:
        quantize_table()
        scaled_quantize_table()
    precisions = args.precisions.split(',')
    steps = {}
    for prec in precisions:
        mode = 'fp32' if prec == 'float32' else 'fixed:8'
        if prec != 'float32' and parse_precision(prec).grad_format.u_max <= 8:
            mode = 'fixed:4'     # E2M1 gradients (max 6): S must be below

        steps[prec] = bc.ResNetStep(mode, args.batch, precision=prec)
    for _ in range(args.warmup):
        for s in steps.values():
            s.step()
    times = {k: [] for k in steps}
    for _ in range(args.repeats):
        for k, s in steps.items():
            t0 = clock()
            s.step()
            times[k].append(clock() - t0)
    print('(b) CIFAR ResNet-20 training step, batch {}, {} interleaved '
          'repeats, {} time'.format(args.batch, args.repeats, args.clock))
    base = bc.median(times[precisions[0]])
    print('  {:<20s} {:>9s} {:>9s}  {}'.format('precision', 'median s',
                                               '/ float32', 'all (s)'))
    for k in precisions:
        m = bc.median(times[k])
        print('  {:<20s} {:>9.3f} {:>9.2f}  {}'.format(
            k, m, m / base, ' '.join('{:.2f}'.format(t) for t in times[k])))
    print('load avg at end: {}'.format(bc.load_average()))


if __name__ == '__main__':
    bc.run_with_output(main, 'bench_formats')
