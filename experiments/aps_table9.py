#!/usr/bin/env python
"""APS (seed 004): see ada_loss/communication/studies.py (table9_main) and
configs/aps_table9.yaml. Options: --config, --set key=value, --help-config,
--out."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.communication.studies import table9_main  # NOQA

if __name__ == '__main__':
    sys.exit(table9_main())
