"""Diagnosis of loss scaling in an emulated narrow format (not in the paper).

Trains one cell of a precision-table config (the same model, data,
optimizer, learning-rate schedule and seed as the harness's run) once per
mode with a :class:`ada_loss.analysis.gemm_probe.ProbingLossScaling`, and
writes per layer and step what limits the scaling (see
:mod:`ada_loss.analysis.gemm_probe`): ``records.csv``, a per-(mode, layer)
summary ``summary.csv``, ``diagnosis.png`` and ``summary.json`` (final
test accuracy and skipped steps of each mode).
"""
import csv
import json
import math
import os
import random

import chainer
import numpy

from ada_loss import atomic
from ada_loss.analysis import gemm_probe
from ada_loss.errors import NonFiniteGradientError
from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import trainer as T
from ada_loss.experiment.data import dataset_info, load_datasets
from ada_loss.experiment.models import build
from ada_loss.experiment.studies.classification import STUDY, Cell, Config
from ada_loss.scaling import make_loss_scaling, parse_mode
from ada_loss.training import Classifier
from ada_loss.training import dtype_config
from ada_loss.training.extensions import StepLearningRate

SUMMARY_FIELDS = ('mode', 'layer_id', 'layer', 'log2_alpha', 'log2_beta',
                  'uf_in', 'of_in', 'headroom_in_log2', 'uf_out', 'of_out',
                  'set_by_upper', 'set_by_lower', 'set_by_one',
                  'pred_over_peak_output', 'pred_over_peak_product',
                  'headroom_log2', 'k', 'uf_w', 'err_x', 'err_w')


def _accuracy(model, test, batchsize):
    """Test accuracy (%) as the harness's Evaluator computes it."""
    it = T.make_iterator(test, batchsize, repeat=False, shuffle=False)
    correct = total = 0
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)
    with chainer.using_config('train', False), chainer.no_backprop_mode():
        for batch in it:
            x, t = chainer.dataset.concat_examples(batch)
            obs = {}
            with reporter.scope(obs):
                model(x, t)
            correct += float(obs['main/accuracy'].array) * len(t)
            total += len(t)
    return 100.0 * correct / total


def run_probed(cfg, cell, every=1, datasets=None):
    """Trains ``cell`` as the harness would, probing every ``every`` steps.

    Returns ``(records, info)``; info has ``final_test_accuracy``,
    ``skipped_steps``, ``iterations`` and ``diverged``.
    """
    c = cfg.for_model(cell.model)
    precision = STUDY.run_config(cfg, cell)['run']['precision']
    train_cfg, mcfg = c.train, c.model
    random.seed(cell.seed)
    numpy.random.seed(cell.seed)
    train, test = datasets or load_datasets(cell.dataset, c.data)
    num_classes, in_channels = dataset_info(cell.dataset)
    with dtype_config(precision):
        model = Classifier(build(cell.model, num_classes,
                                 mcfg.in_channels or in_channels,
                                 mcfg.width, mcfg.shortcut), precision)
    optimizer = T.build_optimizer(model, precision, train_cfg.lr,
                                  train_cfg.momentum, train_cfg.weight_decay)
    it = T.make_iterator(train, train_cfg.batchsize)
    spec = parse_mode(cell.mode)
    inner = make_loss_scaling(cell.mode, precision)
    bound = (spec.options.get('bound', 'output') if spec.name == 'adaptive'
             else None)
    scaling = gemm_probe.ProbingLossScaling(
        inner, cell.mode, every, spec.options.get('t_uf', 1e-3), bound)
    updater = T.make_updater(it, optimizer, scaling, spec)
    lr = StepLearningRate(train_cfg.lr, train_cfg.lr_steps,
                          train_cfg.lr_decay)
    info = {'mode': cell.mode, 'diverged': None}
    while it.epoch_detail < train_cfg.epochs:
        optimizer.lr = lr.value(updater.iteration, it.epoch_detail)
        try:
            with chainer.using_config('train', True):
                updater.update()
        except NonFiniteGradientError as e:
            info['diverged'] = str(e)[:200]
            break
    info['iterations'] = updater.iteration
    info['skipped_steps'] = updater.skipped_steps
    info['final_test_accuracy'] = (
        None if info['diverged'] else
        _accuracy(model, test, train_cfg.eval_batchsize))
    return scaling.records, info


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


def diagnose(config, modes, out, sets=(), model=None, dataset=None, seed=0,
             every=1, precision=None):
    """Runs every mode of ``modes`` on one cell of ``config`` and writes the
    outputs (module docstring) to ``out``. Returns the summary dict."""
    cfg = C.load(Config, config, list(sets))
    g = cfg.grid
    precision = precision or (g.precisions[0] if g.precisions
                              else cfg.train.precision)
    cfg = C.replace(cfg, train=C.replace(cfg.train, precision=precision))
    model = model or g.models[0]
    dataset = dataset or g.datasets[0]
    os.makedirs(out, exist_ok=True)
    records, infos, data = [], {}, None
    for mode in modes:
        cell = Cell(model, dataset, mode, seed)
        if data is None:
            data = load_datasets(dataset, cfg.for_model(cell.model).data)
        recs, info = run_probed(cfg, cell, every, data)
        records += recs
        infos[mode] = info
        print('[diagnosis] {:28s} acc {} skipped {} it {}'.format(
            mode, info['final_test_accuracy'], info['skipped_steps'],
            info['iterations']), flush=True)
    gemm_probe.save_csv(records, os.path.join(out, 'records.csv'))
    rows = summarize(records)
    write_summary_csv(rows, os.path.join(out, 'summary.csv'))
    plot(records, rows, os.path.join(out, 'diagnosis.png'),
         '{} on {}, {} (seed {})'.format(model, dataset,
                                         precision, seed))
    summary = {'config': config, 'sets': list(sets), 'model': model,
               'dataset': dataset, 'precision': precision,
               'seed': seed, 'runs': infos}
    atomic.write_text(os.path.join(out, 'summary.json'),
                      json.dumps(summary, indent=2))
    return summary


def mode_table(folder):
    """Markdown table of every run.json under ``folder``, one row per
    (precision, dataset, model, mode) — every mode string its own row, where
    the precision table merges the options of a mode into one column:
    final test accuracy mean ± sample std over seeds, n, mean skipped."""
    groups = {}
    for root, _, files in os.walk(folder):
        if 'run.json' not in files:
            continue
        info = R.read_run(root)
        if not info or info.get('status') not in (R.FINISHED, R.DIVERGED):
            continue
        key = (info.get('precision'), info['dataset'], info['model'],
               info['mode'])
        groups.setdefault(key, []).append(info)
    lines = ['| Precision | Dataset | Model | Mode | Accuracy (%) | n | '
             'diverged | skipped steps (mean) |', '|---|---|---|---|---|---|'
             '---|---|']
    for key in sorted(groups, key=lambda k: tuple(str(x) for x in k)):
        rs = groups[key]
        accs = [100 * r['final_test_accuracy'] for r in rs
                if r.get('status') == R.FINISHED
                and r.get('final_test_accuracy') is not None]
        div = sum(r.get('status') == R.DIVERGED for r in rs)
        acc = ('{:.2f} ± {:.2f}'.format(numpy.mean(accs),
                                        numpy.std(accs, ddof=1))
               if len(accs) > 1 else '{:.2f}'.format(accs[0]) if accs
               else '—')
        skipped = numpy.mean([r.get('skipped_steps') or 0 for r in rs])
        lines.append('| {} | {} | {} | {} | {} | {} | {} | {:.1f} |'.format(
            *key, acc, len(accs), div, skipped))
    return '\n'.join(lines)
