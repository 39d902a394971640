#!/usr/bin/env python
"""Table 1 (paper §4.1): ResNet-20/56/110 on CIFAR-10/100 under every
loss-scaling mode. See ``--help`` and ada_loss/experiment/runner.py.

    python experiments/table1.py --config configs/table1.yaml \
        --only model=resnet20,dataset=cifar10,mode=adaptive,seed=0
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA

if __name__ == '__main__':
    sys.exit(main(default_config=os.path.join(
        os.path.dirname(__file__), '..', 'configs', 'table1.yaml'),
        description=__doc__.split('\n')[0]))
