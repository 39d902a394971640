#!/usr/bin/env python
"""Time per training step of the GPT (ada_loss/models/gpt.py) on the CPU.

One step = forward of a batch of token ids, the mean cross-entropy over the
B·T tokens, the loss-scaling mode's backward, the finite check and an AdamW
update (nanoGPT's optimizer: β2 0.99, weight decay 0.1), built the way
training builds it (``apply_precision``, ``setup_optimizer``,
``make_loss_scaling``). Model: nanoGPT's CPU shape by default (4 layers, 4
heads, width 128, block 64), batch 12, vocabulary 65 (random token ids: the
cost does not depend on the text). Rows (``--rows``): precision/mode pairs;
by default ``float32/fp32``, ``mixed16/adaptive`` and
``fp8_e4m3/adaptive``.

The rows are timed round-robin after ``--warmup`` untimed steps each, so
that slow drift of the machine hits every row alike; printed: the median
seconds per step (wall clock and process CPU time) and the ratio to the
first row.

Run on one core, niced (the numbers of docs/transformer.md):

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \\
        nice -n 10 .venv/bin/python scripts/bench_gpt_step.py --steps 20
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import (  # NOQA: E402
    median, print_machine_info, run_with_output)

import chainer  # NOQA: E402
import numpy  # NOQA: E402

from ada_loss.models.gpt import GPT, lm_loss  # NOQA: E402
from ada_loss.scaling import make_loss_scaling  # NOQA: E402
from ada_loss.training import (  # NOQA: E402
    apply_precision, dtype_config, setup_optimizer)

DEFAULT_ROWS = ('float32/fp32', 'mixed16/adaptive', 'fp8_e4m3/adaptive')


class Step(object):
    """One precision/mode's model, optimizer and loss scaling."""

    def __init__(self, row, args):
        self.row = row
        self.precision, _, self.mode = row.partition('/')
        numpy.random.seed(args.seed)
        with dtype_config(self.precision):
            self.model = GPT(args.vocab, n_layer=args.n_layer,
                             n_head=args.n_head, n_embd=args.n_embd,
                             block_size=args.block,
                             tie_weights=args.tie)
        apply_precision(self.model, self.precision, args.seed)
        self.opt = setup_optimizer(chainer.optimizers.AdamW(
            alpha=1e-3, beta2=0.99, weight_decay_rate=0.1), self.model,
            self.precision)
        self.scaling = make_loss_scaling(self.mode or None, self.precision)
        self.scaling.bind(self.model)
        rng = numpy.random.RandomState(args.seed)
        self.x = rng.randint(0, args.vocab, (args.batch, args.block)).astype(
            numpy.int32)
        self.t = numpy.roll(self.x, -1, axis=1)
        self.skipped = 0

    def __call__(self):
        m = self.model
        m.cleargrads()
        with dtype_config(self.precision):
            loss = lm_loss(m(self.x), self.t)
        self.scaling.backward(loss)
        finite = all(bool(numpy.isfinite(p.grad).all())
                     for p in m.params() if p.grad is not None)
        self.scaling.update(not finite)
        if finite:
            self.opt.update()
        else:
            self.skipped += 1
        return float(loss.array)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rows', nargs='+', default=list(DEFAULT_ROWS),
                   help='precision/mode pairs (mode empty: the '
                        "precision's default)")
    p.add_argument('--steps', type=int, default=20)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--batch', type=int, default=12)
    p.add_argument('--block', type=int, default=64)
    p.add_argument('--n-layer', type=int, default=4)
    p.add_argument('--n-head', type=int, default=4)
    p.add_argument('--n-embd', type=int, default=128)
    p.add_argument('--vocab', type=int, default=65)
    p.add_argument('--tie', action='store_true')
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args()
    if args.steps < 1 or args.warmup < 0:
        p.error('--steps must be ≥ 1 and --warmup ≥ 0')
    print_machine_info()
    print('GPT: {} layers, {} heads, width {}, block {}, batch {}, vocab {}'
          '{}'.format(args.n_layer, args.n_head, args.n_embd, args.block,
                      args.batch, args.vocab, ', tied' if args.tie else ''))
    steps = [Step(r, args) for r in args.rows]
    for s in steps:
        for _ in range(args.warmup):
            s()
    wall = {s.row: [] for s in steps}
    cpu = {s.row: [] for s in steps}
    for k in range(args.steps):
        order = steps[k % len(steps):] + steps[:k % len(steps)]
        for s in order:
            t0, c0 = time.perf_counter(), time.process_time()
            s()
            wall[s.row].append(time.perf_counter() - t0)
            cpu[s.row].append(time.process_time() - c0)
    base = median(wall[steps[0].row])
    print('{:<28} {:>10} {:>10} {:>8} {:>8}'.format(
        'precision/mode', 's/step', 'cpu s', 'ratio', 'skipped'))
    for s in steps:
        w = median(wall[s.row])
        print('{:<28} {:>10.4f} {:>10.4f} {:>8.2f} {:>8d}'.format(
            s.row, w, median(cpu[s.row]), w / base, s.skipped))
    print('({} timed steps per row, round-robin, after {} warm-up steps; '
          'medians)'.format(args.steps, args.warmup))


if __name__ == '__main__':
    run_with_output(main, 'bench_gpt_step')
