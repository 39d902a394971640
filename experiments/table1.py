#!/usr/bin/env python
"""Table 1 (paper §4.1): ResNet-20/56/110 on CIFAR-10/100 under every
loss-scaling mode.

    python experiments/table1.py [--config configs/table1.yaml] \\
        [--only model=resnet20,dataset=cifar10,mode=adaptive,seed=0] \\
        [--set train.lr=0.05] [--resume] [--force] [--jobs N] [--mpi]

The options of every entry: ada_loss/experiment/runner.py (--help)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.classification import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'table1.yaml')

if __name__ == '__main__':
    sys.exit(main(STUDY, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0]))
