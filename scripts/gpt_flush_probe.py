#!/usr/bin/env python
"""Share of the nonzero gradient entries flushed to zero on entering each
GEMM of the GPT (the per-GEMM probe, ada_loss/analysis/gemm_probe.py), for
the second of two backward passes per mode on one batch at initialization
(``init_scale=amax|auto`` set α_{N+1} from the pass before; no update in
between).

Model: nanoGPT's CPU shape (4 layers, 4 heads, width 128, block 64) by
default, batch 12 (B·T = 768 tokens in the mean loss), vocabulary 65,
random token ids (the corpus is not needed to see the loss gradient's
magnitude at initialization: |p − y| / 768). Printed per mode: the largest
flush share (``uf_in``) over the GEMMs and where, the loss gradient's
(``lm_head``), attention's (the largest over its ``:a``/``:b`` rows) and the
share of GEMMs at or below 0.1 % (``-``: every entry entering was
zero already, flushed before).

Run:  .venv/bin/python scripts/gpt_flush_probe.py [--precision fp8_e4m3]
          [--modes adaptive adaptive:init_scale=amax ...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import numpy  # NOQA: E402

from ada_loss.analysis.gemm_probe import ProbingLossScaling  # NOQA: E402
from ada_loss.models.gpt import GPT, lm_loss  # NOQA: E402
from ada_loss.scaling import make_loss_scaling  # NOQA: E402
from ada_loss.training import apply_precision, dtype_config  # NOQA: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--precision', default='fp8_e4m3')
    p.add_argument('--modes', nargs='+', default=[
        'fixed:1', 'adaptive', 'adaptive:init_scale=amax',
        'adaptive:init_scale=auto'])
    p.add_argument('--batch', type=int, default=12)
    p.add_argument('--block', type=int, default=64)
    p.add_argument('--vocab', type=int, default=65)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--attention-stat', default='tensor',
                   choices=('tensor', 'head'))
    p.add_argument('--list', action='store_true',
                   help='also list every GEMM above 0.1 %%')
    p.add_argument('--detail', metavar='PREFIX',
                   help='also print the probe row (α, β, which bound set '
                        'β, uf_in, headroom in and out in binades) of every '
                        'GEMM whose name starts with PREFIX')
    args = p.parse_args()
    print('{}, GPT 4x4x128 block {}, batch {}, vocab {}, attention_stat {}'
          ', initialization'.format(args.precision, args.block, args.batch,
                                    args.vocab, args.attention_stat))
    print('{:<28} {:>9} {:<24} {:>9} {:>9} {:>8}'.format(
        'mode', 'max uf_in', 'at', 'lm_head', 'attention', '<=0.1%'))
    for mode in args.modes:
        numpy.random.seed(args.seed)
        with dtype_config(args.precision):
            m = GPT(args.vocab, block_size=args.block,
                    attention_stat=args.attention_stat)
        apply_precision(m, args.precision, args.seed)
        bound = 'output' if mode.startswith('adaptive') else None
        scaling = ProbingLossScaling(make_loss_scaling(mode, args.precision),
                                     mode, every=1, bound=bound)
        scaling.bind(m)
        rng = numpy.random.RandomState(args.seed)
        x = rng.randint(0, args.vocab, (args.batch, args.block)).astype(
            numpy.int32)
        for _ in range(2):
            scaling.records = []
            m.cleargrads()
            with dtype_config(args.precision):
                scaling.backward(lm_loss(m(x), numpy.roll(x, -1, axis=1)))
        rows = {r['layer']: r['uf_in'] for r in scaling.records}
        details = [r for r in scaling.records if args.detail is not None
                   and r['layer'].startswith(args.detail)]
        seen = {k: v for k, v in rows.items() if v == v}    # not NaN
        worst = max(seen, key=lambda k: seen[k])
        attn = [v for k, v in seen.items() if k.endswith((':a', ':b'))]
        ok = sum(v <= 1e-3 for v in seen.values())

        def pct(v):
            return '-' if v is None or v != v else '{:.2%}'.format(v)
        print('{:<28} {:>9} {:<24} {:>9} {:>9} {:>4}/{}'.format(
            mode, pct(seen[worst]), worst, pct(rows['lm_head']),
            pct(max(attn) if attn else None), ok, len(rows)), flush=True)
        if args.list:
            print('    above 0.1 %: ' + ', '.join(
                '{} {}'.format(k, pct(v)) for k, v in seen.items()
                if v > 1e-3))
        for r in details:
            print('    {:<24} alpha 2^{:<4g} beta 2^{:<3g} set_by {:<5} uf_in '
                  '{:6.2%} headroom in {:5.2f} out {:5.2f}'.format(
                      r['layer'], numpy.log2(r['alpha']),
                      numpy.log2(r['beta']), r['set_by'] or '-',
                      r['uf_in'], r['headroom_in_log2'],
                      r['headroom_log2']))


if __name__ == '__main__':
    main()
