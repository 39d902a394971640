"""Mixed-precision training on Chainer's Trainer."""
from ada_loss.training.precision import (  # NOQA
    PRECISIONS, Precision, apply_precision, compute_dtype, dtype_config,
    parse_precision, setup_optimizer)
from ada_loss.training.classifier import Classifier  # NOQA
from ada_loss.training.updater import (  # NOQA
    MixedPrecisionUpdater, all_grads_finite)
