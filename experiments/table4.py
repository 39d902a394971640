#!/usr/bin/env python
"""Table 4 (paper Appendix A): test accuracy of ResNet-20/56 on CIFAR-10 per
fixed loss scale S in {1, 16, 128, 1024, 4096, 8192, 16384}. See --help."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from ada_loss.experiment.runner import main  # NOQA: E402
from ada_loss.experiment.studies.classification import STUDY  # NOQA: E402

CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'table4.yaml')

if __name__ == '__main__':
    sys.exit(main(STUDY, default_config=os.path.normpath(CONFIG),
                  description=__doc__.split('\n')[0]))
