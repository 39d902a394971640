#!/usr/bin/env python
"""Tables 3 and 5 of the paper: SSD512 on PASCAL VOC per loss-scaling mode.

    python experiments/table3_ssd.py --config configs/table3_ssd.yaml \\
        [--only batch=8,mode=adaptive,seed=0] [--set train.iterations=1000] \\
        [--out results] [--resume] [--force] [--mpi] [--list] [--table-only]

Table 3 (§4.3): VOC07 test mAP (%) of SSD512 trained on VOC07+12 with batch
8 and 32, columns FP32 | None | Fixed (best) | Dynamic | Adaptive; Table 5
(Appendix B, ``configs/table5_ssd.yaml``): mAP per fixed loss scale at batch
8. Each cell is one run (:func:`ada_loss.detection.train.run_ssd`) in
``<out>/<table>/<model>-b<batch>-<mode>-s<seed>/``; finished or diverged
runs are skipped unless ``--force``; ``--resume`` continues unfinished runs
from their snapshot. The table is written to ``<out>/<table>/<layout>.md``
(and ``.csv``); "diverged" marks cells whose runs all diverged (non-finite
gradients in a mode that cannot skip steps, or a non-finite final loss/mAP).
"""
import sys

from ada_loss.detection.experiment import (  # NOQA: the script's API
    SCHEMA, MapStats, build_table, cells, grid_modes, load_config, select,
    write_table)
from ada_loss.detection import experiment


def main(argv=None, default_config='configs/table3_ssd.yaml'):
    return experiment.main(argv, default_config,
                           description=__doc__.split('\n')[0])


if __name__ == '__main__':
    sys.exit(main())
