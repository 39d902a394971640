#!/usr/bin/env python
"""APS (seed 004): see ada_loss/communication/studies.py (cost_main) and
configs/aps_cost.yaml. Options: --config, --set key=value, --help-config,
--out."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.communication.studies import cost_main  # NOQA

if __name__ == '__main__':
    sys.exit(cost_main())
