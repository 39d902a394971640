"""Diagnosis of loss scaling in an emulated narrow format (not in the paper).

A classification study (:mod:`~ada_loss.experiment.studies.classification`:
the same cells, runs and run folders, on the one run path) whose runs probe
every GEMM layer (``log.probe_every``; :mod:`ada_loss.analysis.gemm_probe`)
and whose tables add, per (precision, model, dataset, seed), what limits the
scaling in each mode: ``<out>/<table>/diagnosis/<precision>-<model>-
<dataset>-s<seed>/`` with ``records.csv`` (the runs' ``probe.csv`` rows),
``summary.csv`` (per mode and layer) and ``diagnosis.png``; besides the
precision table and ``modes.md`` (every mode string its own row).
"""
import collections
import csv
import math
import os

import numpy

from ada_loss import atomic
from ada_loss.analysis import gemm_probe
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import tables as T
from ada_loss.experiment.modes import mode_sort_key
from ada_loss.experiment.studies.classification import ClassificationStudy

SUMMARY_FIELDS = ('mode', 'layer_id', 'layer', 'log2_alpha', 'log2_beta',
                  'uf_in', 'of_in', 'headroom_in_log2', 'uf_out', 'of_out',
                  'set_by_upper', 'set_by_lower', 'set_by_one',
                  'pred_over_peak_output', 'pred_over_peak_product',
                  'headroom_log2', 'k', 'uf_w', 'err_x', 'err_w')


def _mean(values):
    v = [x for x in values if x is not None and not (
        isinstance(x, float) and math.isnan(x))]
    return float(numpy.mean(v)) if v else float('nan')


def summarize(records):
    """One row per (mode, layer): means over the probed steps (log2 for
    scales; fractions for ``set_by``)."""
    groups = {}
    for r in records:
        groups.setdefault((r['mode'], r['layer_id'], r['layer']), []).append(r)
    rows = []
    for (mode, lid, layer), rs in sorted(groups.items(),
                                         key=lambda kv: (kv[0][0], kv[0][1])):
        n = float(len(rs))
        rows.append({
            'mode': mode, 'layer_id': lid, 'layer': layer,
            'log2_alpha': _mean([math.log2(r['alpha']) for r in rs]),
            'log2_beta': _mean([math.log2(r['beta']) for r in rs]),
            'uf_in': _mean([r['uf_in'] for r in rs]),
            'uf_out': _mean([r['uf_out'] for r in rs]),
            'of_in': _mean([r['of_in'] for r in rs]),
            'headroom_in_log2': _mean([r['headroom_in_log2'] for r in rs]),
            'of_out': _mean([r['of_out'] for r in rs]),
            'set_by_upper': sum(r['set_by'] == 'upper' for r in rs) / n,
            'set_by_lower': sum(r['set_by'] == 'lower' for r in rs) / n,
            'set_by_one': sum(r['set_by'] == 'one' for r in rs) / n,
            'pred_over_peak_output': _mean([
                r['pred_output'] / r['peak'] for r in rs if r['peak'] > 0]),
            'pred_over_peak_product': _mean([
                r['pred_product'] / r['peak'] for r in rs if r['peak'] > 0]),
            'headroom_log2': _mean([r['headroom_log2'] for r in rs]),
            'k': _mean([r['k'] for r in rs]),
            'uf_w': _mean([r['uf_w'] for r in rs]),
            'err_x': _mean([r['err_x'] for r in rs]),
            'err_w': _mean([r['err_w'] for r in rs])})
    return rows


def write_summary_csv(rows, path):
    def write(f):
        w = csv.DictWriter(f, SUMMARY_FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(r[k], 5) if isinstance(r[k], float)
                            else r[k]) for k in SUMMARY_FIELDS})
    atomic.replace_with(path, write)
    return path


def plot(records, rows, path, title):
    """Panels per layer (x = layer ID, loss side first), one line per mode:
    underflow of the entering / produced gradient, relative error of the
    weight gradient, log2 α, unused headroom log2(u_max / max|β·gx|), the
    bounds' predicted / observed max|β·gx|, the weight-gradient shift k;
    and mean log2 α over training."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    modes = list(dict.fromkeys(r['mode'] for r in rows))
    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    panels = [('uf_in', 'underflow of the gradient entering the GEMM', False),
              ('uf_out', 'underflow of the produced gradient β·gx', False),
              ('err_w', 'rel. error of the weight gradient (vs FP32)', True),
              ('log2_alpha', 'log2 α (scale of the entering gradient)',
               False),
              ('headroom_log2', 'unused headroom log2(u_max / max|β·gx|)',
               False),
              ('pred_over_peak_output', "bound 'output': predicted / "
               'observed max|β·gx|', True),
              ('headroom_in_log2', 'headroom of the entering gradient '
               'log2(u_max / max|gy|)', False)]
    for ax, (key, label, log) in zip(axes.flat, panels):
        for m in modes:
            mine = [r for r in rows if r['mode'] == m]
            ax.plot([r['layer_id'] for r in mine], [r[key] for r in mine],
                    marker='o', ms=3, label=m)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel('layer ID (0 = nearest the loss)', fontsize=8)
        if log:
            ax.set_yscale('log')
    axes.flat[0].legend(fontsize=7)
    ax = axes.flat[7]
    for m in modes:
        mine = [r for r in records if r['mode'] == m]
        its = sorted({r['iteration'] for r in mine})
        ax.plot(its, [_mean([math.log2(r['alpha']) for r in mine
                             if r['iteration'] == i]) for i in its], label=m)
    ax.set_title('mean log2 α over the layers, over training', fontsize=9)
    ax.set_xlabel('iteration', fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def probed_runs(results_dir):
    """{(precision, model, dataset, seed): [run.json dicts]} of the finished
    runs below ``results_dir`` that have a ``probe.csv``, modes in the
    paper's column order."""
    groups = collections.defaultdict(list)
    for info in R.find_runs(results_dir):
        if info.get('status') == R.FINISHED and os.path.exists(
                os.path.join(info['folder'], 'probe.csv')):
            groups[info['precision'], info['model'], info['dataset'],
                   info['seed']].append(info)
    for runs in groups.values():
        runs.sort(key=lambda r: mode_sort_key(r['mode']))
    return groups


def write_diagnosis(runs, folder, title):
    """``records.csv``, ``summary.csv`` and ``diagnosis.png`` of the probed
    ``runs`` (one cell, several modes) in ``folder``; returns the paths."""
    records = []
    for info in runs:
        records += gemm_probe.load_csv(
            os.path.join(info['folder'], 'probe.csv'))
    os.makedirs(folder, exist_ok=True)
    rows = summarize(records)
    return [gemm_probe.save_csv(records, os.path.join(folder, 'records.csv')),
            write_summary_csv(rows, os.path.join(folder, 'summary.csv')),
            plot(records, rows, os.path.join(folder, 'diagnosis.png'),
                 title)]


class Fp8DiagnosisStudy(ClassificationStudy):
    """The classification study with the diagnosis in its tables."""

    def write_tables(self, cfg, out, quiet=False, train=True):
        """The precision table and ``modes.md`` (printed: one row per
        mode, the variants this study compares one under the other), then
        the diagnosis of every probed cell."""
        table = super(Fp8DiagnosisStudy, self).write_tables(cfg, out, True)
        results = os.path.join(out, cfg.table)
        if not quiet:
            print(T.to_markdown(T.modes_table(R.find_runs(results))))
        groups = probed_runs(results)
        for (precision, model, dataset, seed), runs in sorted(
                groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
            name = '{}-{}-{}-s{}'.format(precision, model, dataset, seed)
            paths = write_diagnosis(
                runs, os.path.join(results, 'diagnosis', name),
                '{} on {}, {} (seed {})'.format(model, dataset, precision,
                                                seed))
            if not quiet:
                print('[diagnosis] {}: {} modes -> {}'.format(
                    name, len(runs), os.path.dirname(paths[0])))
        if not groups and not quiet:
            print('[diagnosis] no finished probed run (log.probe_every) in '
                  '{}'.format(results))
        return table


#: the one instance the entry runs
STUDY = Fp8DiagnosisStudy()
