"""Helpers shared by the model definitions."""
import chainer
import chainer.functions as F


def he_normal():
    """He-normal (MSRA, fan-in) initializer of He et al. (2015), the
    initialization used by the ResNets of He et al. (2016)."""
    return chainer.initializers.HeNormal()


def global_average_pooling_2d(x):
    """Mean over the spatial axes: ``(N, C, H, W) -> (N, C)``.

    Keeps the input dtype (float16 in mixed16), so no cast happens inside a
    model.
    """
    return F.average(x, axis=(2, 3))
