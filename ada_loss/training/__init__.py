"""Mixed-precision training on Chainer's Trainer."""
from ada_loss.precision import (  # NOQA (re-exported: users import them here)
    PRECISIONS, Precision, compute_dtype, dtype_config, parse_precision)
from ada_loss.training.precision_setup import (  # NOQA
    apply_precision, setup_optimizer)
from ada_loss.training.classifier import Classifier  # NOQA
from ada_loss.training.language_model import LanguageModel  # NOQA
from ada_loss.training.updater import (  # NOQA
    MixedPrecisionUpdater, all_grads_finite)
