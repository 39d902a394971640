#!/usr/bin/env python
"""The depth study (issue 19; not in the paper): Table 1's depth claim in
FP8 E4M3 on Fashion-MNIST with CIFAR ResNet-20/56/110; see
ada_loss/experiment/studies/depth.py and configs/depth_study.yaml.

    python experiments/depth_study.py [--config C] [--set key=value ...] \
        [--jobs 2] [--out results] [--force] [--table-only] [--only ...]

Resumable: finished runs are skipped, unfinished ones resume from their
snapshot with --resume (as in every entry). Writes <out>/<table>/table1.md, table4.md, fig4a.png,
fig4b.png, fig4_records.csv, results.json (from the runs finished so far).
Takes the options of every entry (docs/harness.md).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.depth import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs',
                      'depth_study.yaml')

if __name__ == '__main__':
    sys.exit(main(STUDY, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0],
                  defaults={'jobs': 2}))
