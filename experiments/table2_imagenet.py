#!/usr/bin/env python
"""Table 2 of the paper: ResNet-18/50 on ILSVRC2012, top-1 (%) per mode.

    python experiments/table2_imagenet.py \\
        --config configs/table2_imagenet.yaml \\
        [--only model=resnet18,mode=adaptive,seed=0] [--set train.epochs=1] \\
        [--out results] [--resume] [--force] [--mpi] [--list] [--table-only]

§4.2: the training method of He et al. (2016) in its common large-batch
form (Goyal et al. 2017): 90 epochs, MomentumSGD 0.9, lr 0.1 * B / 256 with
a linear warm-up over the first 5 epochs, x0.1 at epochs 30, 60 and 80,
weight decay 1e-4; random-resized crops + flips, 224x224 center crops of
256-resized images for evaluation. Only the loss-scaling mode changes:
FP32 | None | Fixed (128) | Dynamic | Adaptive. Each cell is one run in
``<out>/<table>/<model>-imagenet-<mode>-s<seed>/`` with the harness's files
(``run.json``: status finished/diverged, ``final_test_accuracy`` = top-1 on
the validation set ...). The table goes to ``<out>/<table>/table2.md``.
Under ``mpiexec -n P`` with ``--mpi`` every run is data-parallel (ChainerMN;
``train.batchsize`` is global).
"""
import sys

from ada_loss.experiment.imagenet import (  # NOQA: the script's API
    SCHEMA, WarmupStepLR, build_table, load_config, run_imagenet,
    write_table)
from ada_loss.experiment import imagenet


def main(argv=None):
    return imagenet.main(argv, description=__doc__.split('\n')[0])


if __name__ == '__main__':
    sys.exit(main())
