#!/usr/bin/env python
"""How the weights a GPT-table run ended with survive a cast to E4M3, unscaled
(as the ``fp8_e4m3`` precision's forward casts them) and with a per-tensor
scale that puts each tensor's largest entry at 448 (as the current-scaling
recipe, ``fp8_e4m3:recipe=current``, does): the share of nonzero weights below
E4M3's smallest normal (2^-6), the share that rounds to zero, and the relative
L2 error of the cast, over every GEMM weight (``…/W``) of the run's last
snapshot (read without pickles). One number per way of casting; no training.

Run:  .venv/bin/python scripts/gpt_weight_cast.py <out>/gpt/<run folder> [...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import ml_dtypes  # NOQA: E402
import numpy  # NOQA: E402

from ada_loss.training.safe_npz import open_npz  # NOQA: E402

PREFIX = 'updater/model:main/predictor/'
E4M3_MAX = 448.0
E4M3_SMALLEST_NORMAL = 2.0 ** -6


def weights(run):
    """{name: float32 array} of the GEMM weights in ``run``'s last
    snapshot."""
    with open_npz(os.path.join(run, 'snapshot_latest')) as z:
        return {k[len(PREFIX):]: numpy.asarray(z[k], numpy.float32)
                for k in z.files if k.startswith(PREFIX) and
                k.endswith('/W')}


def cast_stats(ws, scaled):
    """(share below the smallest normal, share flushed to 0, relative L2
    error) of casting every array of ``ws`` to E4M3, each multiplied first
    by 448 / its max |w| if ``scaled`` (and divided after)."""
    n = below = flushed = 0
    err = ref = 0.0
    for w in ws.values():
        s = numpy.float32(E4M3_MAX / numpy.abs(w).max()) if scaled else \
            numpy.float32(1)
        q = (w * s).astype(ml_dtypes.float8_e4m3fn).astype(numpy.float32) / s
        nz = w != 0
        n += int(nz.sum())
        below += int((nz & (numpy.abs(w * s) < E4M3_SMALLEST_NORMAL)).sum())
        flushed += int((nz & (q == 0)).sum())
        err += float(((q.astype(numpy.float64) - w) ** 2).sum())
        ref += float((w.astype(numpy.float64) ** 2).sum())
    return below / n, flushed / n, (err / ref) ** 0.5


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('runs', nargs='+', help='GPT-table run folders')
    for run in p.parse_args(argv).runs:
        ws = weights(run)
        print('{} ({} GEMM weights, {} entries)'.format(
            os.path.basename(os.path.normpath(run)), len(ws),
            sum(w.size for w in ws.values())))
        for label, scaled in (('unscaled', False),
                              ('per-tensor amax -> 448', True)):
            below, flushed, rel = cast_stats(ws, scaled)
            print('  {:<24} below 2^-6 {:6.2%}  flushed {:6.2%}  rel L2 error '
                  '{:6.2%}'.format(label, below, flushed, rel))


if __name__ == '__main__':
    main()
