#!/usr/bin/env python
"""The depth study (issue 19; not in the paper): Table 1's depth claim in
FP8 E4M3 on Fashion-MNIST with CIFAR ResNet-20/56/110; see
ada_loss/analysis/depth_study.py and configs/depth_study.yaml.

    python experiments/depth_study.py [--config C] [--set key=value ...]
        [--jobs 2] [--out results] [--force] [--no-train] [--no-fig4]

Resumable: finished runs are skipped, unfinished ones resume from their
snapshot. Writes <out>/<table>/table1.md, table4.md, fig4a.png, fig4b.png,
fig4_records.csv, results.json (from the runs finished so far).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.analysis import depth_study as D  # NOQA

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), '..'))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--config', default=os.path.join(ROOT, 'configs',
                                                     'depth_study.yaml'))
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                   help='override a key (study.* included), value as YAML')
    p.add_argument('--jobs', type=int, default=2)
    p.add_argument('--out', default='results')
    p.add_argument('--force', action='store_true',
                   help='rerun finished runs and Fig. 4')
    p.add_argument('--no-train', action='store_true',
                   help='only write the tables/figures of existing runs')
    p.add_argument('--no-fig4', action='store_true')
    a = p.parse_args(argv)
    try:
        cfg, study = D.load(a.config, a.set)
    except ValueError as e:
        print('error: {}'.format(e), file=sys.stderr)
        return 2
    t0 = time.time()
    if not a.no_train:
        D.run_grid(cfg, study, a.out, a.jobs, resume=True, force=a.force)
    runs = D.collect(cfg, study, a.out)
    t1, t4 = D.write_outputs(cfg, study, a.out, runs)
    if not a.no_fig4:
        for path in D.fig4(cfg, study, a.out, runs, a.force):
            print('[depth] wrote', path)
    print(t1)
    print(t4)
    print('[depth] {:.0f} s'.format(time.time() - t0))
    return 0


if __name__ == '__main__':
    sys.exit(main())
