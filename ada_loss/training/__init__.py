"""Mixed-precision training on Chainer's Trainer."""
from ada_loss.training.precision import (  # NOQA
    compute_dtype, dtype_config, setup_optimizer)
from ada_loss.training.classifier import Classifier  # NOQA
from ada_loss.training.updater import (  # NOQA
    MixedPrecisionUpdater, all_grads_finite)
