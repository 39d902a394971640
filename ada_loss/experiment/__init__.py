"""Experiments of the paper (§4.1 Table 1, Appendix A Table 4) on Chainer's
Trainer: YAML configs (:mod:`.config`), the grid of runs (:mod:`.grid`), one
run (:mod:`.run`), the Trainer set-up and run.json summary shared by every
table (:mod:`.trainer`), the command line (:mod:`.runner`), the tables
(:mod:`.tables`) and loss-scale plots (:mod:`.plots`); §4.2 Table 2 on
ImageNet is :mod:`.imagenet`; the mini reproduction on real data without
downloads is :mod:`.mini`.
"""
import os as _os

_os.environ.setdefault('MPLBACKEND', 'Agg')   # no display needed

from ada_loss.experiment.config import ConfigError, load_config  # NOQA
