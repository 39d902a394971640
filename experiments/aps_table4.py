#!/usr/bin/env python
"""APS (Han et al.): the table4 study of ada_loss/experiment/studies/aps.py,
configs/aps_table4.yaml. Takes the options of every entry (--set, --only,
--out, --force, --resume, --list, --table-only, --help-config, ...)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.aps import TABLE4  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs',
                      'aps_table4.yaml')

if __name__ == '__main__':
    sys.exit(main(TABLE4, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0]))
