"""CIFAR ResNets of He et al., "Deep Residual Learning for Image
Recognition", CVPR 2016, Section 4.2.

The network is a 3x3 convolution with 16 filters, then three stages of ``n``
basic blocks (two 3x3 convolutions each) on feature maps of 32x32, 16x16 and
8x8 with 16, 32 and 64 filters (the first block of the 2nd and 3rd stage
subsamples with stride 2), then global average pooling and a fully-connected
layer: ``6n + 2`` weighted layers, i.e. ResNet-20/56/110 for n = 3/9/18.

Shortcuts:

* ``'A'`` (default): identity shortcuts everywhere; where the shape changes
  the input is subsampled (stride-2 slicing) and the new channels are zeros.
  This is what He et al. use on CIFAR-10 ("in all cases we use identity
  shortcuts", i.e. option A), so the models are parameter-free in their
  shortcuts and have the paper's sizes: 269,722 / 853,018 / 1,727,962
  parameters for ResNet-20/56/110 with 10 classes (0.27M / 0.85M / 1.7M in
  Table 6 of the paper).
* ``'B'``: a 1x1 convolution (stride 2) + batch normalization projection
  where the shape changes, identity elsewhere (+2,752 parameters at width 16).
* ``'authors'``: the authors' CIFAR ResNet (kumasento/gradient-scaling,
  ``chainerlp/links/models/resnet.py: ResNetCIFAR``, the model of their
  ``examples/adaptive_loss_scaling/cifar`` runs), not He et al.'s: the
  first block of *every* stage (``res2`` too, 16 -> 16 at stride 1) has a
  1x1 convolution + BN projection shortcut (``residual_conv=True``), the
  block subsamples in its *second* 3x3 convolution (their ``BasicBlock``:
  ``conv1`` stride 1, ``conv2`` stride 2), and every convolution and the
  classifier are initialized HeNormal(scale 1, ``fan_option='fan_out'``)
  (the classifier's bias 0). 272,762 / 856,058 / 1,731,002 parameters for
  ResNet-20/56/110 with 10 classes. Their global pooling is an 8x8 average
  pooling, the same as the global average here at 32x32 inputs.

Layer paths read like ``conv1``, ``bn1``, ``res2/0/conv1``, ``res3/0/bn2``,
``res3/0/shortcut_conv``, ``fc``. The residual sum is ``h + x`` and the
activation ReLU, through :func:`ada_loss.functions.add` and
:func:`ada_loss.functions.relu`: Chainer's ``F.add``/``F.relu`` except on
float16 NumPy arrays (mixed16 on CPU), where they give the same bits faster.
"""
import chainer
import chainer.functions as F
import chainer.links as L

from ada_loss import functions as AF
from ada_loss import links as AL
from ada_loss.models.common import global_average_pooling_2d, he_normal

SHORTCUTS = ('A', 'B', 'authors')


def _initializer(shortcut):
    # the authors' ResNetCIFAR.get_initialW: HeNormal(1.0, fan_out)
    if shortcut == 'authors':
        return chainer.initializers.HeNormal(scale=1.0, fan_option='fan_out')
    return he_normal()


def conv3x3(in_channels, out_channels, stride=1, initialW=None):
    """3x3 convolution without bias, padding 1, He-normal initialization
    (fan-in) unless ``initialW`` is given."""
    return AL.Convolution2D(in_channels, out_channels, 3, stride=stride,
                            pad=1, nobias=True,
                            initialW=initialW or he_normal())


class BasicBlock(chainer.Chain):
    """Basic residual block: ``relu(bn2(conv2(relu(bn1(conv1(x))))) + s(x))``.

    Args:
        in_channels (int): input channels.
        out_channels (int): output channels.
        stride (int): stride of ``conv1`` (``conv2`` with ``'authors'``)
            and of the shortcut.
        shortcut (str): ``'A'`` (zero-padded identity) or ``'B'`` (1x1
            convolution + BN projection), used only where the shape changes;
            ``'authors'``: the authors' block (module docstring).
        project (bool): ``'authors'`` only: a projection shortcut (their
            first block of each stage) or the identity.
    """

    def __init__(self, in_channels, out_channels, stride=1, shortcut='A',
                 project=False):
        super(BasicBlock, self).__init__()
        if shortcut not in SHORTCUTS:
            raise ValueError('shortcut must be one of {}, not {!r}'.format(
                ', '.join(SHORTCUTS), shortcut))
        self.stride = stride
        self.pad_channels = out_channels - in_channels
        changes = stride != 1 or in_channels != out_channels
        if shortcut == 'authors':
            self.projection = project
        else:
            self.projection = shortcut == 'B' and changes
        init = _initializer(shortcut)
        # theirs subsamples in the second convolution
        s1, s2 = (1, stride) if shortcut == 'authors' else (stride, 1)
        with self.init_scope():
            self.conv1 = conv3x3(in_channels, out_channels, s1, init)
            self.bn1 = L.BatchNormalization(out_channels)
            self.conv2 = conv3x3(out_channels, out_channels, s2, init)
            self.bn2 = L.BatchNormalization(out_channels)
            if self.projection:
                self.shortcut_conv = AL.Convolution2D(
                    in_channels, out_channels, 1, stride=stride, nobias=True,
                    initialW=init)
                self.shortcut_bn = L.BatchNormalization(out_channels)

    def shortcut(self, x):
        if self.projection:
            return self.shortcut_bn(self.shortcut_conv(x))
        if self.stride != 1:
            x = x[:, :, ::self.stride, ::self.stride]
        if self.pad_channels > 0:
            x = F.pad(x, ((0, 0), (0, self.pad_channels), (0, 0), (0, 0)),
                      'constant')
        return x

    def forward(self, x):
        h = AF.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return AF.relu(AF.add(h, self.shortcut(x)))


class CifarResNet(chainer.Chain):
    """CIFAR ResNet of depth ``6n + 2`` (He et al. 2016, Section 4.2).

    Args:
        depth (int): 20, 32, 44, 56, 110, ... (``(depth - 2) % 6 == 0``).
        num_classes (int): output size of ``fc``.
        shortcut (str): ``'A'`` (default, as in the paper), ``'B'``, or
            ``'authors'`` (the authors' CIFAR ResNet, module docstring).
        in_channels (int): channels of the input images (3 for CIFAR; e.g. 1
            for a reduced model on grey-scale digits).
        width (int): filters of the first stage (16 in the paper); the stages
            have ``width``, ``2 * width`` and ``4 * width``.

    ``forward(x)`` returns the logits ``(N, num_classes)``, in the dtype of
    the computation (float16 in mixed16).
    """

    def __init__(self, depth, num_classes=10, shortcut='A', in_channels=3,
                 width=16):
        super(CifarResNet, self).__init__()
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(
                'CIFAR ResNet depth must be 6n+2 with n >= 1, not {}'.format(
                    depth))
        n = (depth - 2) // 6
        self.depth = depth
        self.shortcut = shortcut
        if shortcut not in SHORTCUTS:
            raise ValueError('shortcut must be one of {}, not {!r}'.format(
                ', '.join(SHORTCUTS), shortcut))
        init = _initializer(shortcut)
        with self.init_scope():
            self.conv1 = conv3x3(in_channels, width, initialW=init)
            self.bn1 = L.BatchNormalization(width)
            channels = width
            for i, stage in enumerate(('res2', 'res3', 'res4')):
                out_channels = width * 2 ** i
                blocks = chainer.ChainList()
                for j in range(n):
                    stride = 2 if (i > 0 and j == 0) else 1
                    blocks.append(BasicBlock(channels, out_channels, stride,
                                             shortcut, project=j == 0))
                    channels = out_channels
                setattr(self, stage, blocks)
            # theirs: fc6 = L.Linear(64, n_class, initialW=HeNormal(fan_out))
            self.fc = AL.Linear(channels, num_classes, initialW=(
                init if shortcut == 'authors' else None))

    def forward(self, x):
        h = AF.relu(self.bn1(self.conv1(x)))
        for stage in (self.res2, self.res3, self.res4):
            for block in stage:
                h = block(h)
        return self.fc(global_average_pooling_2d(h))


def cifar_resnet_num_params(depth, num_classes=10, shortcut='A',
                            in_channels=3, width=16):
    """Closed-form parameter count of :class:`CifarResNet` (BN: gamma, beta).

    With n = (depth - 2) / 6, w = width, c = in_channels, k = num_classes:
    stem ``9cw + 2w``; per block with C_in -> C_out ``9 C_in C_out +
    9 C_out^2 + 4 C_out``; option B adds ``C_in C_out + 2 C_out`` to the two
    subsampling blocks, ``'authors'`` to the first block of each of the three
    stages; fc ``4wk + k``.
    """
    n = (depth - 2) // 6
    w = width
    total = 9 * in_channels * w + 2 * w + 4 * w * num_classes + num_classes
    channels = w
    for i in range(3):
        out = w * 2 ** i
        for j in range(n):
            total += 9 * channels * out + 9 * out * out + 4 * out
            if (shortcut == 'B' and channels != out) or \
                    (shortcut == 'authors' and j == 0):
                total += channels * out + 2 * out
            channels = out
    return total


def resnet20(num_classes=10, **kwargs):
    """ResNet-20 (n = 3): 269,722 parameters for 10 classes (option A)."""
    return CifarResNet(20, num_classes, **kwargs)


def resnet56(num_classes=10, **kwargs):
    """ResNet-56 (n = 9): 853,018 parameters for 10 classes (option A)."""
    return CifarResNet(56, num_classes, **kwargs)


def resnet110(num_classes=10, **kwargs):
    """ResNet-110 (n = 18): 1,727,962 parameters for 10 classes (option A)."""
    return CifarResNet(110, num_classes, **kwargs)


def build_cifar_resnet(name, num_classes=10, **kwargs):
    """Builds ``'resnet<depth>'`` (e.g. ``'resnet20'``) as a CIFAR ResNet.

    ``kwargs`` go to :class:`CifarResNet` (``shortcut``, ``in_channels``,
    ``width``).
    """
    prefix = 'resnet'
    if not name.startswith(prefix) or not name[len(prefix):].isdigit():
        raise ValueError('unknown CIFAR ResNet {!r}: expected "resnet<depth>" '
                         'with depth = 6n+2, e.g. resnet20, resnet56, '
                         'resnet110'.format(name))
    return CifarResNet(int(name[len(prefix):]), num_classes, **kwargs)
