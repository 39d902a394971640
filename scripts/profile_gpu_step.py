#!/usr/bin/env python
"""Where a GPU training step's host time goes (issue 35 item 6): CIFAR
ResNet-110 (or any bench_gpu model), batch 128, mixed16, one mode.

Prints (1) the step's wall time (synchronized) against its host time (the
time until Python returns, the device then drained): a step whose host time
is its wall time is host-bound; (2) the host time of the forward, the
backward and the update; (3) cProfile's top functions by own time and by
cumulative time over ``--steps`` steps.

    python scripts/profile_gpu_step.py [--model resnet110] [--mode adaptive]
        [--steps 10] [--out PATH]
"""
import argparse
import cProfile
import io
import pstats
import statistics
import time

import bench_common as bc  # NOQA (puts the project on sys.path)

import cupy

MODELS = {'resnet20': (128, 32, 10), 'resnet56': (128, 32, 10),
          'resnet110': (128, 32, 10), 'resnet50': (64, 224, 1000)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='resnet110')
    p.add_argument('--mode', default='adaptive')
    p.add_argument('--precision', default='mixed16')
    p.add_argument('--steps', type=int, default=10)
    p.add_argument('--out', help='also write the report here')
    args = p.parse_args()
    batch, insize, classes = MODELS[args.model]
    s = bc.ResNetStep(args.mode, batch, precision=args.precision,
                      device='@cupy:0', model=args.model, insize=insize,
                      num_classes=classes)
    for _ in range(3):
        s.step()
    dev = cupy.cuda.Device()
    wall, host, backward = [], [], []
    for _ in range(args.steps):
        dev.synchronize()
        t0 = time.perf_counter()
        s.step()
        t1 = time.perf_counter()
        dev.synchronize()
        t2 = time.perf_counter()
        host.append(t1 - t0)
        wall.append(t2 - t0)
        backward.append(s.last.get('backward', float('nan')))
    lines = ['{} batch {} {} {}: wall {:.4f} s, host {:.4f} s (the host '
             'returns {:.1f} ms before the device drains), backward host '
             '{:.4f} s; medians of {} steps'.format(
                 args.model, batch, args.precision, args.mode,
                 statistics.median(wall), statistics.median(host),
                 1e3 * (statistics.median(wall) - statistics.median(host)),
                 statistics.median(backward), args.steps)]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        s.step()
    dev.synchronize()
    prof.disable()
    for key in ('tottime', 'cumulative'):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(30)
        lines.append('--- cProfile over {} steps, by {} ---'.format(
            args.steps, key))
        lines.append(buf.getvalue())
    text = '\n'.join(lines)
    print(text)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text)


if __name__ == '__main__':
    main()
