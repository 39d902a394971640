"""Figures 1 and 4 of the paper from gradient records (matplotlib, Agg).

* :func:`plot_fig1`: per layer ID, (a) underflow rate and (b) expected loss
  scale of the activation gradients of an FP32 run, one line per recorded
  iteration (Fig. 1).
* :func:`plot_fig4a`: per layer, the loss scale alpha adaptive scaling used
  (mean of log2 over recorded iterations), with the fixed scale for
  reference (Fig. 4a).
* :func:`plot_fig4b`: per layer, Δ = FP16 underflow rate with fixed scaling
  minus that with adaptive scaling, in % (Fig. 4b; higher = adaptive
  mitigates more underflow).
* :func:`sigma_max_ratio`: σ_max(fixed) / σ_max(adaptive) (§4.2).
"""
import collections
import math

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # NOQA
import numpy  # NOQA

from ada_loss import atomic  # NOQA
from ada_loss.analysis.recorder import summarize  # NOQA


def _save(fig, path):
    """The PNG, replaced atomically."""
    atomic.replace_with(path, lambda f: fig.savefig(f, format='png',
                                                    dpi=100), mode='wb')


def _by_iteration(records, field):
    """{iteration: (layer_ids, values)} for records not skipped."""
    out = collections.OrderedDict()
    for r in sorted(records, key=lambda r: (r['iteration'], r['layer_id'])):
        if r.get('skipped'):
            continue
        ids, vals = out.setdefault(r['iteration'], ([], []))
        ids.append(r['layer_id'])
        vals.append(r[field])
    return out


def _pick(keys, n):
    keys = list(keys)
    if len(keys) <= n:
        return keys
    idx = numpy.linspace(0, len(keys) - 1, n).round().astype(int)
    return [keys[i] for i in sorted(set(idx))]


def _per_layer_mean(records, field, transform=None):
    """{(layer_id, layer): mean of field} over finite, non-skipped rows."""
    acc = collections.OrderedDict()
    for r in records:
        v = r[field]
        if r.get('skipped') or v is None or not math.isfinite(v):
            continue
        acc.setdefault((r['layer_id'], r['layer']), []).append(
            transform(v) if transform else v)
    return collections.OrderedDict(
        (k, float(numpy.mean(v))) for k, v in sorted(acc.items()))


def plot_fig1(records, path, title='', max_lines=8):
    """Underflow rate and expected loss scale per layer ID (Fig. 1)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    under = _by_iteration(records, 'underflow_rate')
    scale = _by_iteration(records, 'expected_loss_scale')
    iters = _pick(under, max_lines)
    cmap = plt.get_cmap('viridis')
    for n, it in enumerate(iters):
        color = cmap(n / max(len(iters) - 1, 1))
        ids, vals = under[it]
        axes[0].plot(ids, 100 * numpy.asarray(vals), '.-', color=color,
                     label='iter {}'.format(it))
        ids, vals = scale[it]
        axes[1].plot(ids, vals, '.-', color=color, label='iter {}'.format(it))
    axes[0].set_ylabel('underflow rate (%): 0 < |g| < 2^-24')
    axes[1].set_ylabel('expected loss scale: 1 / |g|_(0.01N)')
    axes[1].set_yscale('log', base=2)
    for ax, sub in zip(axes, ('(a)', '(b)')):
        ax.set_xlabel('layer ID (backward topological order)')
        ax.set_title(sub)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc='best')
    fig.suptitle(title or 'Activation gradient statistics (FP32 run)')
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def plot_fig4a(records, path, fixed_scale=None, title=''):
    """Per-layer adaptive loss scale alpha (log2 mean over iterations)."""
    means = _per_layer_mean(records, 'alpha', math.log2)
    ids = [k[0] for k in means]
    fig, ax = plt.subplots(figsize=(max(6, 0.25 * len(ids) + 2), 4))
    ax.bar(ids, list(means.values()), color='tab:blue',
           label='adaptive (mean log2 alpha)')
    if fixed_scale:
        ax.axhline(math.log2(fixed_scale), color='tab:red', ls='--',
                   label='fixed {:g}'.format(fixed_scale))
    ax.set_xlabel('layer ID (backward topological order)')
    ax.set_ylabel('log2 loss scale')
    ax.set_title(title or 'Loss scale of each layer (adaptive)')
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis='y')
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def underflow_delta(fixed_records, adaptive_records):
    """[(layer_id, layer, Δ %)]: mean FP16 underflow (fixed - adaptive)."""
    fixed = {k[1]: v for k, v in
             _per_layer_mean(fixed_records, 'fp16_underflow').items()}
    adaptive = _per_layer_mean(adaptive_records, 'fp16_underflow')
    return [(i, name, 100.0 * (fixed[name] - v))
            for (i, name), v in adaptive.items() if name in fixed]


def plot_fig4b(fixed_records, adaptive_records, path, title=''):
    """Δ underflow rate per layer, fixed minus adaptive (Fig. 4b)."""
    delta = underflow_delta(fixed_records, adaptive_records)
    fig, ax = plt.subplots(figsize=(max(6, 0.25 * len(delta) + 2), 4))
    if delta:
        ids, _, vals = zip(*delta)
        ax.bar(ids, vals, color=['tab:green' if v >= 0 else 'tab:red'
                                 for v in vals])
    else:
        ax.text(0.5, 0.5, 'no FP16 records', ha='center',
                transform=ax.transAxes)
    ax.axhline(0, color='k', lw=0.8)
    ax.set_xlabel('layer ID (backward topological order)')
    ax.set_ylabel('Δ underflow rate (%): fixed - adaptive')
    ax.set_title(title or 'Underflow reduced by adaptive loss scaling')
    ax.grid(alpha=0.3, axis='y')
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
    return path


def sigma_max_ratio(fixed_records, adaptive_records):
    """{'sigma_max_fixed', 'sigma_max_adaptive', 'ratio'} (§4.2)."""
    f = summarize(fixed_records)['sigma_max']
    a = summarize(adaptive_records)['sigma_max']
    ratio = f / a if a and math.isfinite(a) and a > 0 else float('nan')
    return {'sigma_max_fixed': f, 'sigma_max_adaptive': a, 'ratio': ratio}
