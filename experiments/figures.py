#!/usr/bin/env python
"""Figures 1 and 4 of the paper and the σ_max ratio of §4.2.

    python experiments/figures.py [--config configs/figures.yaml] \\
        [--set profile=NAME] [--set iterations=10 ...] [--out results]

Runs the short recorded trainings of a profile of the config (FP32 for
Fig. 1; fixed and adaptive mixed16 for Fig. 4 and σ_max), one run folder
each, and writes ``fig1.png``, ``fig4a.png``, ``fig4b.png`` and
``summary.json`` to ``<out>/<table>/`` (table: ``figures/<profile>``).
See ada_loss/experiment/studies/figures.py; the options of every entry
(--only run=adaptive, --force, --table-only, --help-config, ...)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.figures import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs',
                      'figures.yaml')

if __name__ == '__main__':
    sys.exit(main(STUDY, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0]))
