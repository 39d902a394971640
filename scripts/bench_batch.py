#!/usr/bin/env python
"""Images per second against batch size on the depth study's networks
(issue 32: before choosing a larger budget for the depth study).

CIFAR ResNet-20/56/110 at width 4 on 1×14×14 inputs (the depth study's
Fashion-MNIST, configs/depth_study.yaml), one ``MixedPrecisionUpdater``
step each (``fp8_e4m3`` with the default ``adaptive`` mode), for several
batch sizes; the steps of all batch sizes are interleaved round-robin
against drift, timed by this process's CPU time (``--clock wall`` for wall
time). Prints images/s per batch size and its ratio to batch 64 (the
study's): a ratio well above 1 means the nets are Python-bound and a larger
batch buys images almost for free.

    .venv/bin/python scripts/bench_batch.py [--depths 20,56,110]
        [--batches 32,64,128,256,512] [--repeats 5]
"""
import argparse
import time

import bench_common as bc  # NOQA (puts the project on sys.path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--depths', default='20,56,110')
    p.add_argument('--batches', default='32,64,128,256,512')
    p.add_argument('--repeats', type=int, default=5)
    p.add_argument('--precision', default='fp8_e4m3')
    p.add_argument('--mode', default='adaptive')
    p.add_argument('--clock', choices=('wall', 'process'), default='process')
    args = p.parse_args()
    clock = time.perf_counter if args.clock == 'wall' else time.process_time
    bc.print_machine_info()
    batches = [int(b) for b in args.batches.split(',')]
    for depth in [int(d) for d in args.depths.split(',')]:
        steps = {b: bc.ResNetStep(args.mode, b, precision=args.precision,
                                  model='resnet{}'.format(depth), insize=14,
                                  in_channels=1,
                                  model_kwargs={'width': 4})
                 for b in batches}
        for s in steps.values():
            s.step()                    # warm-up
        times = {b: [] for b in batches}
        for _ in range(args.repeats):
            for b, s in steps.items():
                t0 = clock()
                s.step()
                times[b].append(clock() - t0)
        base = 64 / bc.median(times[64]) if 64 in times else None
        print('ResNet-{} width 4, 1x14x14, {} {}, {} interleaved repeats, '
              '{} time'.format(depth, args.precision, args.mode,
                               args.repeats, args.clock))
        print('  {:>6s} {:>10s} {:>10s} {:>10s}'.format(
            'batch', 'step s', 'images/s', '/ batch 64'))
        for b in batches:
            m = bc.median(times[b])
            ips = b / m
            print('  {:>6d} {:>10.3f} {:>10.0f} {:>10s}'.format(
                b, m, ips, '{:.2f}'.format(ips / base) if base else '-'))
    print('load avg at end: {}'.format(bc.load_average()))


if __name__ == '__main__':
    bc.run_with_output(main, 'bench_batch')
