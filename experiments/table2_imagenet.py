#!/usr/bin/env python
"""Table 2 (paper §4.2): ResNet-18/50 on ILSVRC2012, top-1 (%) per
loss-scaling mode.

    python experiments/table2_imagenet.py [--config configs/table2_imagenet.yaml] \\
        [--only model=resnet18,mode=adaptive,seed=0] [--set train.epochs=1] \\
        [--resume] [--force] [--mpi] [--list] [--table-only]

Recipe and run folders: ada_loss/experiment/studies/imagenet.py."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.imagenet import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'table2_imagenet.yaml')

if __name__ == '__main__':
    sys.exit(main(STUDY, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0]))
