"""The two dtypes: ``float32`` and ``mixed16`` (MPT, Micikevicius et al.).

``mixed16`` is Chainer's own mixed16 mode: GEMM weights, activations and
activation gradients in FP16; batch normalization keeps FP32 statistics and
FP32 γ/β (``chainer.links.BatchNormalization`` maps mixed16 to float32 for
them); the optimizer keeps an FP32 master copy of every FP16 parameter
(``UpdateRule.use_fp32_update``), unscales the gradient there in FP32 and
updates in FP32.
"""
import contextlib

import chainer
import numpy

from ada_loss.scaling.modes import check_dtype


def chainer_dtype(dtype):
    check_dtype(dtype)
    return chainer.mixed16 if dtype == 'mixed16' else numpy.float32


@contextlib.contextmanager
def dtype_config(dtype):
    """Context in which models are built and run in ``dtype``."""
    with chainer.using_config('dtype', chainer_dtype(dtype)):
        yield


def compute_dtype(dtype):
    """NumPy dtype of activations: float16 for mixed16, else float32."""
    return numpy.dtype(numpy.float16 if check_dtype(dtype) == 'mixed16'
                       else numpy.float32)


def setup_optimizer(optimizer, model, dtype):
    """``optimizer.setup(model)``, with FP32 master weights for mixed16."""
    optimizer.setup(model)
    if check_dtype(dtype) == 'mixed16':
        optimizer.use_fp32_update()
    return optimizer
