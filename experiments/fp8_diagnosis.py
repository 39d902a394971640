#!/usr/bin/env python
"""What limits layer-wise loss scaling in FP8 E4M3 (not in the paper;
docs/fp8_diagnosis.md): runs of the precision table whose GEMM layers are
probed (log.probe_every), and per (precision, model, dataset, seed) the
diagnosis: <out>/<table>/diagnosis/<cell>/{records.csv, summary.csv,
diagnosis.png}, besides precision.md and modes.md; configs/fp8_diagnosis.yaml.
Takes the options of every entry (--set, --only, --out, --jobs, --resume,
--table-only, ...)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.fp8_diagnosis import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs',
                      'fp8_diagnosis.yaml')

if __name__ == '__main__':
    sys.exit(main(STUDY, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0], defaults={'jobs': 2}))
