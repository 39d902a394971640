"""The experiment harness, separate from the library: typed YAML configs
(:mod:`.config`; modes and precisions parsed once), the one run path of every
entry (:mod:`.runner`: a :class:`~.runner.Study` names its config, cells, run
and tables), the one training recipe (:mod:`.recipe`: every study that trains
is a :class:`~.recipe.TrainingStudy`, and only its ``run`` constructs
Chainer's Trainer; the helpers it calls: :mod:`.run_folder`,
:mod:`.iterators`, :mod:`.optimization`, :mod:`.trainer_extensions`,
:mod:`.summaries`, :mod:`.settings`, :mod:`.devices`), ``run.json``
(:mod:`.runinfo`), the modes in tables and
folder names (:mod:`.modes`), the tables (:mod:`.tables`) and plots
(:mod:`.plots`). The studies (:mod:`.studies`): classification (Tables 1 and
4, the mini reproduction, the precision table), ImageNet (Table 2), detection
(Tables 3 and 5), APS (Han et al.), the figures, the depth study and the FP8
diagnosis. Nothing in the library imports from here.
"""
import os as _os

_os.environ.setdefault('MPLBACKEND', 'Agg')   # no display needed

from ada_loss.experiment.config import ConfigError  # NOQA: E402
