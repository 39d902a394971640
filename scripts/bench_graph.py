#!/usr/bin/env python
"""Eager steps against replayed CUDA graphs (issue 46 item 1): ResNet-110,
batch 128, 32×32, mixed16, ``fixed:128`` and ``adaptive``, each once eager
(``MixedPrecisionUpdater``'s step) and once through
:class:`ada_loss.training.cuda_graph.CudaGraphStep` (warm-up, capture,
replays). Steps are interleaved round-robin over the four set-ups, each
ended by a device synchronization; medians of ``--repeats`` steps after
``--warmup`` steps each. Prints images/s per set-up and the ratios
(replay / eager, adaptive / fixed under replay); ``--json`` writes them.
PyTorch AMP's figure on the same GPU comes from
``scripts/bench_torch_peer.py`` in the same call
(``scripts/gpu_graph_check.sh``).

    python scripts/bench_graph.py [--model resnet110] [--batch 128]
        [--repeats 20] [--warmup 6] [--json PATH]
"""
import argparse
import json
import statistics
import time

import bench_common as bc  # NOQA (puts the project on sys.path)

import cupy

DEVICE = '@cupy:0'


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--model', default='resnet110')
    p.add_argument('--batch', type=int, default=128)
    p.add_argument('--modes', default='fixed:128,adaptive')
    p.add_argument('--repeats', type=int, default=20)
    p.add_argument('--warmup', type=int, default=6)
    p.add_argument('--json')
    args = p.parse_args()
    from ada_loss.training.cuda_graph import CudaGraphStep

    logs = []
    setups = []
    for mode in args.modes.split(','):
        for replay in (False, True):
            s = bc.ResNetStep(mode, args.batch, precision='mixed16',
                              device=DEVICE, model=args.model, insize=32)
            if replay:
                s.updater.step_runner = CudaGraphStep(
                    s.updater, warmup=3, log=lambda m, mode=mode:
                    logs.append('{}: {}'.format(mode, m)))
            setups.append((mode, replay, s))
    dev = cupy.cuda.Device()
    for _ in range(args.warmup):
        for _, _, s in setups:
            s.step()
    dev.synchronize()
    times = {(m, r): [] for m, r, _ in setups}
    for _ in range(args.repeats):
        for mode, replay, s in setups:
            dev.synchronize()
            t0 = time.perf_counter()
            s.step()
            dev.synchronize()
            times[mode, replay].append(time.perf_counter() - t0)
    rows = []
    for mode, replay, s in setups:
        sec = statistics.median(times[mode, replay])
        runner = s.updater.step_runner
        rows.append(dict(
            model=args.model, batch=args.batch, precision='mixed16',
            mode=mode, step='replay' if replay else 'eager',
            step_seconds=sec, images_per_second=args.batch / sec,
            replays=getattr(runner, 'replays', 0),
            captures=getattr(runner, 'captures', 0),
            fallback=getattr(runner, 'reason', None),
            skipped_steps=s.updater.skipped_steps))
        print('{model} b{batch} {mode:10s} {step:6s} {step_seconds:.4f} s '
              '{images_per_second:8.0f} images/s  (captures {captures}, '
              'replays {replays}, fallback {fallback})'.format(**rows[-1]),
              flush=True)
    by = {(r['mode'], r['step']): r['images_per_second'] for r in rows}
    ratios = {}
    for mode in args.modes.split(','):
        ratios['{} replay/eager'.format(mode)] = \
            by[mode, 'replay'] / by[mode, 'eager']
    modes = args.modes.split(',')
    if len(modes) == 2:
        ratios['{} / {} step time, replay'.format(modes[1], modes[0])] = \
            by[modes[0], 'replay'] / by[modes[1], 'replay']
    for k, v in ratios.items():
        print('{:40s} {:.3f}'.format(k, v))
    for line in logs:
        print(line)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(gpu=cupy.cuda.runtime.getDeviceProperties(
                0)['name'].decode(), rows=rows, ratios=ratios, log=logs),
                f, indent=1)


if __name__ == '__main__':
    main()
