#!/usr/bin/env python
"""Builds Table 1 or Table 4 of the paper, or the precision table, from run
folders.

    python experiments/build_tables.py --results results/table1 --table 1
    python experiments/build_tables.py --results results/table4 --table 4
    python experiments/build_tables.py --results results/precision \
        --table precision

Writes table<N>.md and table<N>.csv into --out (default: --results) and
prints the Markdown.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.tables import write_tables  # NOQA


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--results', required=True, help='folder of run folders')
    p.add_argument('--table', choices=('1', '4', 'precision'), default='1')
    p.add_argument('--out', default=None, help='output folder')
    args = p.parse_args(argv)
    if not os.path.isdir(args.results):
        print('error: no such folder: {}'.format(args.results),
              file=sys.stderr)
        return 2
    layout = args.table if args.table == 'precision' else \
        'table' + args.table
    write_tables(args.results, layout, args.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
