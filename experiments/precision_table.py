#!/usr/bin/env python
"""The precision table (not in the paper): rows = precision (mixed16, bf16,
fp8_e5m2, fp8_e4m3, fp8), columns = None, Fixed (best/worst), Dynamic,
Adaptive, Adaptive with the paper's overflow bound, Amax; see
ada_loss/experiment/precision_sweep.py and configs/precision.yaml. Takes the
runner's options (--set, --only, --out, --jobs, --resume, --force, ...)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.precision_sweep import main  # NOQA

DEFAULT = os.path.join(os.path.dirname(__file__), '..', 'configs',
                       'precision.yaml')

if __name__ == '__main__':
    sys.exit(main(default_config=os.path.normpath(DEFAULT),
                  description='Loss scaling across precisions (CPU)',
                  defaults={'jobs': 2}))
