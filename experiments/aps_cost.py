#!/usr/bin/env python
"""APS (Han et al.): the cost study of ada_loss/experiment/studies/aps.py,
configs/aps_cost.yaml. Takes the options of every entry (--set, --only,
--out, --force, --resume, --list, --table-only, --help-config, ...)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.aps import COST  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs',
                      'aps_cost.yaml')

if __name__ == '__main__':
    sys.exit(main(COST, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0]))
