"""Model names an experiment may use, and building them for a dataset.

Names are those of :data:`ada_loss.models.MODELS` plus any CIFAR ResNet depth
``resnet<6n+2>`` (e.g. ``resnet8``, ``resnet14`` for reduced reproductions;
He et al. 2016, §4.2). The paper's Table 1 uses ResNet-20/56/110 (§4.1).
"""
import re

from ada_loss.models import MODELS, build_cifar_resnet, build_model

_CIFAR_RESNET = re.compile(r'^resnet(\d+)$')
_IMAGENET = ('resnet18', 'resnet50')
MODEL_HELP = ('resnet<6n+2> (CIFAR ResNet, e.g. resnet8, resnet20, '
              'resnet56, resnet110), {}'.format(', '.join(
                  sorted(set(MODELS) - {'resnet20', 'resnet56',
                                        'resnet110'}))))


def _cifar_depth(name):
    m = _CIFAR_RESNET.match(name)
    if m and name not in _IMAGENET:
        return int(m.group(1))
    return None


def check_model_name(name):
    """Returns ``name`` if it is a known model, else raises ValueError."""
    depth = _cifar_depth(name)
    if depth is not None:
        if depth < 8 or (depth - 2) % 6:
            raise ValueError('CIFAR ResNet depth must be 6n+2 >= 8 (e.g. 8, '
                             '14, 20, 56, 110), got {!r}'.format(name))
        return name
    if name not in MODELS:
        raise ValueError('unknown model {!r}; expected {}'.format(
            name, MODEL_HELP))
    return name


def model_depth(name):
    """The depth shown in Table 1 (``resnet56`` -> ``'56'``) or the name."""
    depth = _cifar_depth(name)
    return str(depth) if depth is not None else name


def build(name, num_classes, in_channels, width=None, shortcut=None):
    """Builds model ``name`` (see :func:`check_model_name`).

    ``width`` and ``shortcut`` (None: the model's default) apply to CIFAR
    ResNets; ``width`` also to ``small_cnn`` and ``plain_cnn``.
    """
    check_model_name(name)
    kwargs = {'in_channels': in_channels}
    if _cifar_depth(name) is not None:
        if width is not None:
            kwargs['width'] = width
        if shortcut is not None:
            kwargs['shortcut'] = shortcut
        return build_cifar_resnet(name, num_classes, **kwargs)
    if width is not None and name not in _IMAGENET:
        kwargs['width'] = width
    return build_model(name, num_classes, **kwargs)
