#!/usr/bin/env python
"""The precision table (not in the paper): every loss-scaling mode in
every precision of grid.precisions (mixed16, bf16, fp8_e5m2, fp8_e4m3, fp8),
emulated on the CPU; configs/precision.yaml, configs/demo_fp8.yaml. Takes
the options of every entry (--set, --only, --out, --jobs, --resume, ...)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.classification import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'precision.yaml')

if __name__ == '__main__':
    sys.exit(main(STUDY, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0], defaults={'jobs': 2}))
