"""The mini reproduction: the Table 1 protocol (paper §4.1) at CPU scale.

Runs ``configs/mini.yaml`` through the same runner, configs and run folders
as the full tables: FP32, mixed16 without scaling, a fixed-scale sweep,
dynamic (backoff) and adaptive loss scaling, two seeds, on real images that
need no download (scikit-learn's digits at 16x16, or Fashion-MNIST when its
files are installed), with a reduced CIFAR ResNet. At the end it prints the
table in the paper's layout, saves a PNG of the per-layer adaptive loss
scales over iterations (cf. Figure 4) and reports the wall time.

Runs train two at a time by default (``--jobs 2``: each process is mostly
single-threaded Python, so two use both cores of a small machine).
"""
import os
import time

from ada_loss.experiment import runinfo as R
from ada_loss.experiment.runner import main as runner_main

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), '..', '..',
                              'configs', 'mini.yaml')


def plot_adaptive(table_dir, png_path):
    """One panel per seed of every finished adaptive run below
    ``table_dir``; returns the PNG path or None."""
    from ada_loss.experiment.plots import plot_loss_scales
    runs = [r for r in R.find_runs(table_dir)
            if r['mode_name'] == 'adaptive' and r['status'] == R.FINISHED
            and os.path.exists(os.path.join(r['folder'], 'loss_scales.csv'))]
    if not runs:
        return None
    return plot_loss_scales(
        [os.path.join(r['folder'], 'loss_scales.csv') for r in runs],
        png_path, title=['{} (test acc {:.2f}%)'.format(
            r['name'], 100 * r['final_test_accuracy']) for r in runs])


def main(argv=None):
    t0 = time.time()

    def after(cfg, args, table):
        table_dir = os.path.join(args.out, cfg['table'])
        png = plot_adaptive(table_dir, os.path.join(
            table_dir, 'adaptive_loss_scales.png'))
        if png:
            print('[mini] per-layer adaptive loss scales: {}'.format(png))
        if table is not None:
            print('[mini] table: {}'.format(os.path.join(
                table_dir, cfg['layout'] + '.md')))
        print('[mini] wall time {:.1f} s'.format(time.time() - t0))

    return runner_main(argv, default_config=os.path.normpath(DEFAULT_CONFIG),
                       description='Mini reproduction of Table 1 (CPU, no '
                                   'download)',
                       defaults={'jobs': 2}, after=after)
