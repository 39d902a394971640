#!/usr/bin/env python
"""What limits layer-wise loss scaling in FP8 E4M3 (issue 19; not in the
paper): trains one cell of a precision-table config (default: the demo's
FP8 table, configs/demo_fp8.yaml, ResNet-8 w8 on digits 16x16) once per
mode, probing every GEMM layer at every ``--every``-th step, and writes
``records.csv``, ``summary.csv``, ``summary.json`` and ``diagnosis.png`` to
``--out``. See ada_loss/analysis/gemm_probe.py for the columns.

    python experiments/fp8_diagnosis.py [--config C] [--set k=v ...]
        [--modes none fixed:256 adaptive ...] [--seed 0] [--every 1]
        [--out benchmarks/fp8_diagnosis/demo_fp8]
    python experiments/fp8_diagnosis.py --table results/demo_fp8
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.studies.fp8_diagnosis import diagnose, mode_table  # NOQA

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), '..'))
MODES = ['none', 'fixed:16', 'fixed:256', 'dynamic:style=chainer',
         'adaptive:bound=output', 'adaptive:bound=product', 'amax']


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--config', default=os.path.join(ROOT, 'configs',
                                                     'demo_fp8.yaml'))
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE')
    p.add_argument('--modes', nargs='+', default=MODES)
    p.add_argument('--precision', default=None,
                   help='default: the first of grid.precisions')
    p.add_argument('--model', default=None)
    p.add_argument('--dataset', default=None)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--every', type=int, default=1)
    p.add_argument('--out', default=os.path.join(
        ROOT, 'benchmarks', 'fp8_diagnosis', 'demo_fp8'))
    p.add_argument('--table', default=None, metavar='DIR',
                   help='only print the per-mode table of the run.json '
                        'files under DIR (mean ± std over seeds) and exit')
    a = p.parse_args(argv)
    if a.table:
        print(mode_table(a.table))
        return 0
    diagnose(a.config, a.modes, a.out, a.set, a.model, a.dataset, a.seed,
             a.every, a.precision)
    return 0


if __name__ == '__main__':
    sys.exit(main())
