#!/usr/bin/env python
"""The GPT table (issue 48, item 6; not in the paper): a character-level
GPT on the King James Bible in every precision and loss-scaling mode,
validation loss paired by seed against FP32; see
ada_loss/experiment/studies/gpt.py, configs/gpt.yaml and
docs/transformer.md ("The table").

    python experiments/gpt_table.py [--config C] [--set key=value ...] \
        [--jobs 1] [--out results] [--force] [--resume] [--table-only] \
        [--only precision=fp8_e4m3,mode=adaptive,seed=0]

Resumable: finished runs are skipped, unfinished ones resume from their
snapshot with --resume (as in every entry). Writes <out>/<table>/table.md
and results.json (from the runs finished so far). Takes the options of
every entry (docs/harness.md).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.gpt import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'gpt.yaml')

if __name__ == '__main__':
    sys.exit(main(STUDY, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0]))
