#!/usr/bin/env python
"""Mini reproduction of Table 1 on 2 CPU cores (digits, ResNet-8): see
ada_loss/experiment/mini.py and configs/mini.yaml. Takes the runner's
options (--set, --only, --out, --jobs, --resume, --force, ...)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.mini import main  # NOQA

if __name__ == '__main__':
    sys.exit(main())
