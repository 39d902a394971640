#!/usr/bin/env python
"""Tables 3 and 5 (paper §4.3, Appendix B): SSD512 on PASCAL VOC per
loss-scaling mode (Table 5: --config configs/table5_ssd.yaml).

    python experiments/table3_ssd.py [--config configs/table3_ssd.yaml] \\
        [--only batch=8,mode=adaptive,seed=0] [--set train.iterations=1000] \\
        [--resume] [--force] [--mpi] [--list] [--table-only]

Recipe and run folders: ada_loss/experiment/studies/detection.py."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.detection import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'table3_ssd.yaml')

if __name__ == '__main__':
    sys.exit(main(STUDY, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0]))
