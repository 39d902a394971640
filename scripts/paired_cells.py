"""Any two cells of a depth study's results.json against each other, paired
by seed: the mean difference with its 95 % interval and the verdict, as the
study's own tables compute them (:mod:`ada_loss.experiment.verdicts`). For
the comparisons the tables do not print — one fixed scale against another,
a mode against FP32 (issue 32; docs/depth_study.md).

    python scripts/paired_cells.py RESULTS.json 'mixed16|resnet56|fixed:4' \\
        'mixed16|resnet56|fixed:16' ['float32|resnet56|fp32' ...]

Each cell is ``precision|model|mode`` as the results.json keys it; every
pair (a, b) of the cells named, a before b, gets one row: a − b.
"""
import argparse
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))

from ada_loss.experiment import runinfo as R  # NOQA: E402
from ada_loss.experiment import verdicts as V  # NOQA: E402


def accuracies(results, cell):
    """{seed: final test accuracy (%)} of the finished runs of ``cell``."""
    if cell not in results:
        raise SystemExit('no cell {!r} in the results; it has: {}'.format(
            cell, ', '.join(sorted(results))))
    return {r['seed']: 100.0 * r['final_test_accuracy']
            for r in results[cell]
            if r.get('status') == R.FINISHED
            and r.get('final_test_accuracy') is not None}


def _label(cell):
    """'mixed16 resnet56 fixed:4' (a '|' would split a Markdown cell)."""
    return cell.replace('|', ' ')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('results', help="a depth study's results.json")
    ap.add_argument('cells', nargs='+', help='precision|model|mode, two or '
                    'more')
    a = ap.parse_args(argv)
    if len(a.cells) < 2:
        ap.error('name two cells or more')
    with open(a.results) as f:
        results = json.load(f)
    print('| a | b | a − b, mean ± 95 % | verdict | a ahead |')
    print('|---|---|---|---|---|')
    for x, y in itertools.combinations(a.cells, 2):
        ax, ay = accuracies(results, x), accuracies(results, y)
        diffs = [ax[s] - ay[s] for s in sorted(ax) if s in ay]
        p = V.paired(diffs)
        print('| {} | {} | {} | {} | {}/{} |'.format(
            _label(x), _label(y), V.paired_text(p), p.verdict or '—',
            sum(d > 0 for d in diffs), len(diffs)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
