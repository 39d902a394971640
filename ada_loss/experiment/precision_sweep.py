"""The precision table (not in the paper): every loss-scaling mode in every
precision of ``grid.precisions``, through the same runner and run folders
as Table 1.

Each precision p runs the config's grid with ``train.precision = p`` into
``results/<table>/<p>/``; at the end the one table of all of them (layout
``precision``, :mod:`ada_loss.experiment.precision_table`) is written to
``results/<table>/precision.md`` and ``.csv`` and printed.
"""
import os
import sys

from ada_loss.experiment import config as C
from ada_loss.experiment.runner import main as runner_main, parse_args


def main(argv=None, default_config=None, description=None, defaults=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv, default_config, description, defaults)
    if args.help_config:
        print(C.describe_schema())
        return 0
    try:
        cfg = C.load_config(args.config, args.set)
    except ValueError as e:
        print('error: {}'.format(e), file=sys.stderr)
        return 2
    precisions = cfg['grid']['precisions'] or [cfg['train']['precision']]
    if None in precisions:
        print('error: config key \'grid.precisions\': give the precisions '
              'to sweep (or train.precision)', file=sys.stderr)
        return 2
    for p in precisions:
        print('[precision] {}'.format(p), flush=True)
        rc = runner_main(argv + [
            '--set', 'train.precision={}'.format(p),
            '--set', 'grid.precisions=[]',
            '--set', 'table={}/{}'.format(cfg['table'], p),
            '--set', 'layout=precision', '--no-table'], default_config,
            description, defaults)
        if rc:
            return rc
    if not args.no_table and not args.list:
        from ada_loss.experiment.tables import write_tables
        write_tables(os.path.join(args.out, cfg['table']), 'precision')
    return 0
