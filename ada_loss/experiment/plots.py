"""Plots of per-layer adaptive loss scales over training (cf. the paper's
Figure 4: the loss scale α of every layer as training goes on).

Uses matplotlib's Agg backend (no display needed).
"""
import collections
import csv
import math
import os

import matplotlib
import numpy

matplotlib.use('Agg')

from ada_loss import atomic  # NOQA: E402
from ada_loss.experiment import runinfo as R  # NOQA: E402


def read_loss_scales(path):
    """``loss_scales.csv`` -> ``{layer: ([iteration...], [alpha...])}`` in
    the file's layer order (the backward pass order, output layer first)."""
    series = collections.OrderedDict()
    with open(path) as f:
        for row in csv.DictReader(f):
            its, alphas = series.setdefault(row['layer'], ([], []))
            its.append(int(row['iteration']))
            alphas.append(float(row['alpha']))
    return series


def plot_loss_scales(csv_paths, png_path, title=None, max_panels=4):
    """Heat map of log2 α per layer (rows, output layer on top) against
    iterations (columns), one panel per CSV file. Layers often share the
    same α (β = 1 wherever nothing underflows), which a heat map shows and
    overlapping lines would hide.

    Args:
        csv_paths (str or list of str): ``loss_scales.csv`` files.
        png_path (str): output PNG.
        title (str or list of str): panel titles.
    Returns:
        str or None: ``png_path``, or None when there was nothing to plot.
    """
    import matplotlib.pyplot as plt
    if isinstance(csv_paths, str):
        csv_paths = [csv_paths]
    titles = title if isinstance(title, (list, tuple)) else \
        [title] * len(csv_paths)
    panels = [(read_loss_scales(p), t)
              for p, t in zip(csv_paths, titles)][:max_panels]
    panels = [(s, t) for s, t in panels if s]
    if not panels:
        return None
    n_layers = max(len(s) for s, _ in panels)
    fig, axes = plt.subplots(
        1, len(panels), squeeze=False,
        figsize=(5.5 * len(panels) + 1.5, 1.2 + 0.22 * n_layers))
    for ax, (series, name) in zip(axes[0], panels):
        its = sorted({i for its, _ in series.values() for i in its})
        col = {i: k for k, i in enumerate(its)}
        grid = numpy.full((len(series), len(its)), numpy.nan)
        for r, (its_l, alphas) in enumerate(series.values()):
            for i, a in zip(its_l, alphas):
                grid[r, col[i]] = math.log2(a)
        edges = its + [its[-1] + (its[-1] - its[-2] if len(its) > 1 else 1)]
        mesh = ax.pcolormesh(edges, numpy.arange(len(series) + 1), grid,
                             cmap='viridis', shading='flat')
        ax.set_yticks(numpy.arange(len(series)) + 0.5)
        ax.set_yticklabels([k.replace('predictor/', '') for k in series],
                           fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel('iteration')
        if name:
            ax.set_title(name, fontsize=9)
        fig.colorbar(mesh, ax=ax, label='log2 α (loss scale of the layer)')
    fig.tight_layout()
    atomic.replace_with(png_path, lambda f: fig.savefig(f, format='png',
                                                       dpi=110), mode='wb')
    plt.close(fig)
    return png_path


def plot_adaptive(table_dir, png_path):
    """One panel per seed of every finished adaptive run below
    ``table_dir``; returns the PNG path or None."""
    runs = [r for r in R.find_runs(table_dir)
            if r['mode_name'] == 'adaptive' and r['status'] == R.FINISHED
            and os.path.exists(os.path.join(r['folder'], 'loss_scales.csv'))]
    if not runs:
        return None
    return plot_loss_scales(
        [os.path.join(r['folder'], 'loss_scales.csv') for r in runs],
        png_path, title=['{} (test acc {:.2f}%)'.format(
            r['name'], 100 * r['final_test_accuracy']) for r in runs])
