"""The depth study's rows for the authors' configuration (issue 37).

    python scripts/depth_authors_rows.py --out results/depth_authors \\
        [--reference benchmarks/fp8_diagnosis/depth_grid2/results.json]

Reads the ``run.json`` of every run under ``--out`` (an
``experiments/depth_study.py --out`` folder) and the stored runs of
``--reference`` (the second edition's ``results.json``), and prints per
(precision, depth): the authors' configuration (``adaptive:style=authors``,
any options), the default ``adaptive`` run here and stored, the fixed scale
chosen on the other seeds (the stored sweep, :func:`held_out_fixed`), and
the authors' configuration minus each, paired by seed: mean ± sample std,
the 95 % t-interval and the seeds where it is ahead.
"""
import argparse
import collections
import glob
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.studies.depth import (  # NOQA: E402
    _reused, cell_text, held_out_fixed, stats)
from ada_loss.scaling import parse_mode  # NOQA: E402

#: two-sided 95 % Student t quantiles by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571}


def read_runs(out):
    """{(precision, model, canonical mode): [run.json dicts]} under out."""
    runs = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(out, '**', 'run.json'),
                                 recursive=True)):
        with open(path) as f:
            r = json.load(f)
        runs[(r['precision'], r['model'], str(parse_mode(r['mode'])))
             ].append(r)
    return runs


def stored_runs(path):
    """The same from a results.json (keys 'precision|model|mode')."""
    runs = collections.defaultdict(list)
    for (p, m, mode, _), r in _reused(path).items():
        runs[(p, m, str(parse_mode(mode)))].append(r)
    return runs


def _accuracy(r):
    if r is None or r.get('final_test_accuracy') is None or \
            r.get('status') != 'finished':
        return None
    return 100.0 * r['final_test_accuracy']


def paired_text(mine, other):
    """mine − other paired by seed ({seed: run}): 'mean ± std [lo, hi]
    (k/n ahead)'."""
    diffs = []
    for seed in sorted(mine):
        a, b = _accuracy(mine[seed]), _accuracy(other.get(seed))
        if a is not None and b is not None:
            diffs.append(a - b)
    if not diffs:
        return '—'
    n = len(diffs)
    mean = sum(diffs) / n
    if n < 2:
        return '{:+.2f} (1 seed)'.format(mean)
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = T95.get(n - 1, 1.96) * std / math.sqrt(n)
    return '{:+.2f} ± {:.2f} [{:+.1f}, {:+.1f}] ({}/{} ahead)'.format(
        mean, std, mean - half, mean + half, sum(d > 0 for d in diffs), n)


def rows(new, old):
    """The Markdown table of every (precision, model) with authors runs."""
    header = ['Depth', 'Precision', 'Authors', 'Adaptive (here)',
              'Adaptive (stored)', 'Fixed (held-out, stored)',
              'Authors − Adaptive (here)', 'Authors − Adaptive (stored)',
              'Authors − Fixed (held-out)']
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for (p, m, mode), rs in sorted(new.items()):
        spec = parse_mode(mode)
        if spec.name != 'adaptive' or spec.options.get('style') != 'authors':
            continue
        mine = {r['seed']: r for r in rs}
        here = {r['seed']: r for r in new.get((p, m, 'adaptive'), [])}
        stored = {r['seed']: r for r in old.get((p, m, 'adaptive'), [])}
        fixed, scales = held_out_fixed(old, p, m)
        lines.append('| ' + ' | '.join([
            m, p, cell_text(stats(rs)),
            cell_text(stats(list(here.values()))),
            cell_text(stats(list(stored.values()))),
            cell_text(stats(list(fixed.values())), ' (S={})'.format(
                '/'.join(scales[k] for k in sorted(scales)))),
            paired_text(mine, here), paired_text(mine, stored),
            paired_text(mine, fixed)]) + ' |')
    return '\n'.join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--out', required=True)
    p.add_argument('--reference', default=os.path.join(
        os.path.dirname(__file__), '..', 'benchmarks', 'fp8_diagnosis',
        'depth_grid2', 'results.json'))
    args = p.parse_args(argv)
    print(rows(read_runs(args.out), stored_runs(args.reference)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
