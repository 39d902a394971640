"""Models: Chainer Chains returning logits, built from :mod:`ada_loss.links`
GEMM layers and ``chainer.links.BatchNormalization``.

They work in float32 and in Chainer's ``mixed16`` mode (construct them under
``chainer.using_config('dtype', chainer.mixed16)``: GEMM parameters are then
float16, BN parameters float32, and a float16 input gives float16 logits).

* CIFAR ResNet-20/56/110 (He et al. 2016, Sec. 4.2, option-A shortcuts).
* ImageNet ResNet-18/50 (He et al. 2016, Table 1; ResNet-50 is v1.5).
* :class:`SmallCNN` for fast tests, :class:`PlainConvNet` (no BN) for
  gradient-underflow measurements.
* :class:`GPT`, a decoder-only transformer (nanoGPT's model; token ids in,
  logits out, :func:`lm_loss`); not in :data:`MODELS`, whose models
  classify images (docs/transformer.md).
"""
from ada_loss.models.cifar_resnet import (  # NOQA
    CifarResNet, build_cifar_resnet, cifar_resnet_num_params, resnet20,
    resnet56, resnet110)
from ada_loss.models.imagenet_resnet import (  # NOQA
    ImageNetResNet, Bottleneck, build_imagenet_resnet, resnet18, resnet50)
from ada_loss.models.small_cnn import PlainConvNet, SmallCNN  # NOQA
from ada_loss.models.gpt import GPT, lm_accuracy, lm_loss  # NOQA


def _small_cnn(num_classes=10, **kwargs):
    return SmallCNN(num_classes=num_classes, **kwargs)


def _plain_cnn(num_classes=10, **kwargs):
    return PlainConvNet(num_classes=num_classes, **kwargs)


#: name -> constructor ``f(num_classes, **kwargs)``.
MODELS = {
    'resnet20': resnet20,
    'resnet56': resnet56,
    'resnet110': resnet110,
    'resnet18': resnet18,
    'resnet50': resnet50,
    'small_cnn': _small_cnn,
    'plain_cnn': _plain_cnn,
}


def build_model(name, num_classes, **kwargs):
    """Builds the model ``name`` of :data:`MODELS` with ``num_classes``
    outputs; ``kwargs`` go to its constructor (e.g. ``shortcut``, ``width``,
    ``in_channels``, ``depth``).

    Raises:
        ValueError: ``name`` is not in :data:`MODELS`.
    """
    if name not in MODELS:
        raise ValueError('unknown model {!r}; allowed: {}'.format(
            name, ', '.join(sorted(MODELS))))
    return MODELS[name](num_classes, **kwargs)
