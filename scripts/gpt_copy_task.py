#!/usr/bin/env python
"""A tiny GPT on a task it must attend to, in several precisions and modes.

Each sequence is a random 4-token pattern over 19 tokens repeated twice;
the model sees the first 7 tokens and predicts the next ones. From position
3 on every target is the token 3 positions back, so the loss there (the
"copy loss", nats) falls below chance, log 19 = 2.94, only if attention
and the positions work. Model: 1 layer, 2 heads, width 32, block 8; Adam
(lr 1e-2), batch 16, ``--steps`` steps, one seed; the same batches for
every row. Printed per row: the copy loss of the current batch every 30
steps and at the end, and the skipped steps.

A smoke test of the model in each precision, not a result: one seed of a
toy task (docs/transformer.md says what it shows).

Run:  .venv/bin/python scripts/gpt_copy_task.py [--steps 150] [--rows ...]
          [--seed 0]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import chainer  # NOQA: E402
import numpy  # NOQA: E402

from ada_loss.models.gpt import GPT, lm_loss  # NOQA: E402
from ada_loss.scaling import make_loss_scaling  # NOQA: E402
from ada_loss.training import (  # NOQA: E402
    apply_precision, dtype_config, setup_optimizer)

V, T = 19, 8
ROWS = ('float32/fp32', 'bf16/adaptive', 'fp8/adaptive', 'fp8_e4m3/none',
        'fp8_e4m3/fixed:16', 'fp8_e4m3/adaptive',
        'fp8_e4m3/adaptive:init_scale=amax',
        'fp8_e4m3/adaptive:init_scale=auto', 'fp8_e4m3/amax',
        'fp8:recipe=current/',
        'fp8_e4m3:recipe=current,grad=loss/adaptive',
        'fp8_e4m3:recipe=current,grad=loss/adaptive:init_scale=amax')


def run(row, steps, seed=0):
    precision, _, mode = row.partition('/')
    numpy.random.seed(seed)
    with dtype_config(precision):
        m = GPT(V, n_layer=1, n_head=2, n_embd=32, block_size=T)
    apply_precision(m, precision, seed)
    opt = setup_optimizer(chainer.optimizers.Adam(alpha=1e-2), m, precision)
    scaling = make_loss_scaling(mode or None, precision)
    if hasattr(scaling, 'ada'):
        scaling.bind(m, verbose=False)
    else:
        scaling.bind(m)
    rng = numpy.random.RandomState(seed)
    losses, skipped = [], 0
    for i in range(steps):
        pat = rng.randint(0, V, (16, 4))
        x = numpy.concatenate([pat, pat], axis=1).astype(numpy.int32)
        x, t = x[:, :-1], x[:, 1:]
        m.cleargrads()
        with dtype_config(precision):
            y = m(x)
            loss = lm_loss(y, t)
        scaling.backward(loss)
        finite = all(bool(numpy.isfinite(p.grad).all()) for p in m.params())
        scaling.update(not finite)
        if finite:
            opt.update()
        else:
            skipped += 1
        if i % 30 == 0 or i == steps - 1:
            losses.append(float(lm_loss(y[:, 3:], t[:, 3:]).array))
    return losses, skipped


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--steps', type=int, default=150)
    p.add_argument('--rows', nargs='+', default=list(ROWS))
    p.add_argument('--seed', type=int, default=0,
                   help='the model, precision and batches seed')
    args = p.parse_args()
    print('copy loss (nats; chance 2.94) every 30 steps and at step {}'
          '{}'.format(args.steps, ', seed {}'.format(args.seed)
                      if args.seed else ''))
    for row in args.rows:
        losses, skipped = run(row, args.steps, args.seed)
        print('{:<58} {}  skipped {}'.format(
            row, ' '.join('{:5.2f}'.format(v) for v in losses), skipped),
            flush=True)


if __name__ == '__main__':
    main()
