#!/usr/bin/env python
"""Mini reproduction of Table 1 on 2 CPU cores (digits, ResNet-8): the Table 1
protocol (paper §4.1) at CPU scale, configs/mini.yaml, two runs at a time.
At the end: the table, a PNG of the per-layer adaptive loss scales over
iterations (cf. Fig. 4) and the wall time. Takes the options of every entry
(--set, --only, --out, --jobs, --resume, --force, ...)."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.plots import plot_adaptive  # NOQA: E402
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.classification import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'mini.yaml')


def run(argv=None):
    t0 = time.time()

    def after(cfg, args, table):
        table_dir = os.path.join(args.out, cfg.table)
        png = plot_adaptive(table_dir, os.path.join(
            table_dir, 'adaptive_loss_scales.png'))
        if png:
            print('[mini] per-layer adaptive loss scales: {}'.format(png))
        if table is not None:
            print('[mini] table: {}'.format(os.path.join(
                table_dir, cfg.layout + '.md')))
        print('[mini] wall time {:.1f} s'.format(time.time() - t0))

    return main(STUDY, argv, default_config=os.path.normpath(CONFIG),
                description=__doc__.split('\n')[0], defaults={'jobs': 2},
                after=after)


if __name__ == '__main__':
    sys.exit(run())
