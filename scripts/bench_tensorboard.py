#!/usr/bin/env python
"""Cost of the TensorBoard writer (ada_loss/training/tensorboard.py) on the
mini Table 1 run.

Two measurements of ``experiments/table1.py --config configs/mini.yaml
--only mode=adaptive,seed=0`` (ResNet-8 w8 on 16x16 digits, mixed16, 135
iterations; the writer writes 6 log entries, α and β of 8 layers every 5
iterations and the HParams):

1. **A/B**: the command as a subprocess with the writer on (the default)
   and off (``--set log.tensorboard=false``), alternating (on, off, off,
   on, on, off, ...) for ``--rounds`` rounds, each into a fresh folder.
   Printed: the medians of the process's wall time, of the run's own
   ``wall_time_s`` (the Trainer's elapsed time, ``run.json``) and of the
   process's CPU time (user + system), and their ratios on / off. On a shared machine the noise of one run is larger
   than the writer's cost: read this as a bound.
2. **Direct**: the same run in this process, with every call of the
   writer's ``__call__`` and ``finalize`` timed (time.perf_counter), plus
   the import of its modules: the writer's time as a share of the run's
   ``wall_time_s``.

Run:  .venv/bin/python scripts/bench_tensorboard.py [--rounds 5]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ['--config', os.path.join(ROOT, 'configs', 'mini.yaml'), '--only',
        'mode=adaptive,seed=0', '--no-table']
RUN = os.path.join('mini', 'resnet8-digits-adaptive-s0')


def one(on, out):
    cmd = [sys.executable, os.path.join(ROOT, 'experiments', 'table1.py'),
           *ARGS, '--out', out, '--set', 'log.progress=none']
    if not on:
        cmd += ['--set', 'log.tensorboard=false']
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - \
        (before.ru_utime + before.ru_stime)
    with open(os.path.join(out, RUN, 'run.json')) as f:
        run = json.load(f)['wall_time_s']
    events = [n for n in os.listdir(os.path.join(out, RUN))
              if n.startswith('events.out.tfevents.')]
    assert bool(events) == on, events
    return wall, run, cpu


def ab(rounds, tmp):
    times = {True: [], False: []}
    for i in range(rounds):
        order = (True, False) if i % 2 == 0 else (False, True)
        for on in order:
            times[on].append(one(on, os.path.join(
                tmp, '{}-{}'.format('on' if on else 'off', i))))
    print('A/B, {} rounds (medians; all runs listed):'.format(rounds))
    med = {}
    names = ('process wall', 'run.json wall_time_s', 'process CPU')
    for on in (True, False):
        med[on] = [statistics.median(x[i] for x in times[on])
                   for i in range(3)]
        print('  writer {}:'.format('on ' if on else 'off'))
        for i, name in enumerate(names):
            print('    {:21s} median {:6.2f} s  [{}]'.format(
                name, med[on][i],
                ' '.join('{:.2f}'.format(x[i]) for x in times[on])))
    print('  ratio on/off of the medians: ' + ', '.join(
        '{} {:.4f}'.format(name, med[True][i] / med[False][i])
        for i, name in enumerate(names)))


def direct(tmp):
    import ada_loss.training, ada_loss.analysis.observing  # noqa: before
    t = time.perf_counter()
    from ada_loss.training import tensorboard as T     # noqa: the import
    imported = time.perf_counter() - t
    spent = {'calls': 0, 'time': 0.0}

    def timed(f):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                spent['time'] += time.perf_counter() - t
                spent['calls'] += 1
        return wrapper
    T.TensorBoardWriter.__call__ = timed(T.TensorBoardWriter.__call__)
    T.TensorBoardWriter.finalize = timed(T.TensorBoardWriter.finalize)
    from ada_loss.experiment import runner
    from ada_loss.experiment.studies.classification import STUDY
    out = os.path.join(tmp, 'direct')
    runner.main(STUDY, argv=ARGS + ['--out', out, '--set',
                                    'log.progress=none'])
    with open(os.path.join(out, RUN, 'run.json')) as f:
        run = json.load(f)['wall_time_s']
    size = sum(os.path.getsize(os.path.join(out, RUN, n))
               for n in os.listdir(os.path.join(out, RUN))
               if n.startswith('events.out.tfevents.'))
    print('direct: {} calls of the writer took {:.1f} ms of the run\'s '
          '{:.2f} s ({:.3f} %); importing its modules {:.1f} ms; event '
          'file {} bytes'.format(spent['calls'], spent['time'] * 1e3, run,
                                 100 * spent['time'] / run, imported * 1e3,
                                 size))


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ab(a.rounds, tmp)
        direct(tmp)


if __name__ == '__main__':
    main()
