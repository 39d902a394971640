"""ImageNet ResNets of He et al., "Deep Residual Learning for Image
Recognition", CVPR 2016 (Table 1).

Stem: 7x7/2 convolution (64) + BN + ReLU + 3x3/2 max pooling; stages
``res2`` ... ``res5`` of basic blocks (ResNet-18/34) or bottleneck blocks
(ResNet-50/101/152) with 64/128/256/512 base filters, the first block of
``res3``-``res5`` subsampling by 2; global average pooling; ``fc``.

* Shortcuts are identities, and projections (1x1 convolution + BN, option B
  of the paper) where the shape changes.
* Bottleneck blocks put the stride on the 3x3 convolution (``conv2``), not
  on the first 1x1 as in the original paper: this is torchvision's layout,
  known as "ResNet v1.5" (slightly more accurate, same parameters).
* Convolutions have no bias and He-normal initialization; ``fc`` has a bias.

With 1000 classes: ResNet-18 has 11,689,512 parameters and ResNet-50
25,557,032 (the standard torchvision numbers; BN gamma/beta counted, running
statistics not). Layer paths read like ``conv1``, ``res2/0/conv1``,
``res3/0/shortcut_conv``, ``fc``; residual sums are ``h + x`` (as
:func:`ada_loss.functions.add`, and ReLU as :func:`ada_loss.functions.relu`:
Chainer's own except on float16 NumPy arrays, where they give the same bits
faster).
"""
import chainer
import chainer.functions as F
import chainer.links as L

from ada_loss import functions as AF
from ada_loss import links as AL
from ada_loss.models.common import global_average_pooling_2d, he_normal


def _conv(in_channels, out_channels, ksize, stride=1):
    return AL.Convolution2D(in_channels, out_channels, ksize, stride=stride,
                            pad=ksize // 2, nobias=True, initialW=he_normal())


class _Block(chainer.Chain):
    """Adds the projection shortcut (``shortcut_conv``, ``shortcut_bn``) where
    the shape changes."""

    def _init_shortcut(self, in_channels, out_channels, stride):
        self.projection = stride != 1 or in_channels != out_channels
        if self.projection:
            with self.init_scope():
                self.shortcut_conv = _conv(in_channels, out_channels, 1,
                                           stride)
                self.shortcut_bn = L.BatchNormalization(out_channels)

    def shortcut(self, x):
        if self.projection:
            return self.shortcut_bn(self.shortcut_conv(x))
        return x


class BasicBlock(_Block):
    """Two 3x3 convolutions (stride on ``conv1``); ``planes`` outputs."""

    expansion = 1

    def __init__(self, in_channels, planes, stride=1):
        super(BasicBlock, self).__init__()
        with self.init_scope():
            self.conv1 = _conv(in_channels, planes, 3, stride)
            self.bn1 = L.BatchNormalization(planes)
            self.conv2 = _conv(planes, planes, 3)
            self.bn2 = L.BatchNormalization(planes)
        self._init_shortcut(in_channels, planes, stride)

    def forward(self, x):
        h = AF.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return AF.relu(AF.add(h, self.shortcut(x)))


class Bottleneck(_Block):
    """1x1 (``planes``) -> 3x3 (``planes``, stride here: v1.5) -> 1x1
    (``4 planes``)."""

    expansion = 4

    def __init__(self, in_channels, planes, stride=1):
        super(Bottleneck, self).__init__()
        out_channels = planes * self.expansion
        with self.init_scope():
            self.conv1 = _conv(in_channels, planes, 1)
            self.bn1 = L.BatchNormalization(planes)
            self.conv2 = _conv(planes, planes, 3, stride)
            self.bn2 = L.BatchNormalization(planes)
            self.conv3 = _conv(planes, out_channels, 1)
            self.bn3 = L.BatchNormalization(out_channels)
        self._init_shortcut(in_channels, out_channels, stride)

    def forward(self, x):
        h = AF.relu(self.bn1(self.conv1(x)))
        h = AF.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return AF.relu(AF.add(h, self.shortcut(x)))


#: depth -> (block type, blocks per stage), Table 1 of He et al. (2016).
ARCHITECTURES = {
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
    101: (Bottleneck, (3, 4, 23, 3)),
    152: (Bottleneck, (3, 8, 36, 3)),
}


class ImageNetResNet(chainer.Chain):
    """ImageNet ResNet (He et al. 2016, Table 1).

    Args:
        depth (int): 18, 34, 50, 101 or 152.
        num_classes (int): output size of ``fc``.
        in_channels (int): input channels (given, so that all parameters exist
            right after construction).

    ``forward(x)`` returns the logits ``(N, num_classes)``, in the dtype of
    the computation (float16 in mixed16).
    """

    def __init__(self, depth, num_classes=1000, in_channels=3):
        super(ImageNetResNet, self).__init__()
        if depth not in ARCHITECTURES:
            raise ValueError('ImageNet ResNet depth must be one of {}, not '
                             '{}'.format(sorted(ARCHITECTURES), depth))
        block, counts = ARCHITECTURES[depth]
        self.depth = depth
        with self.init_scope():
            self.conv1 = _conv(in_channels, 64, 7, stride=2)
            self.bn1 = L.BatchNormalization(64)
            channels = 64
            for i, count in enumerate(counts):
                planes = 64 * 2 ** i
                blocks = chainer.ChainList()
                for j in range(count):
                    stride = 2 if (i > 0 and j == 0) else 1
                    blocks.append(block(channels, planes, stride))
                    channels = planes * block.expansion
                setattr(self, 'res{}'.format(i + 2), blocks)
            self.fc = AL.Linear(channels, num_classes)

    def forward(self, x):
        h = AF.relu(self.bn1(self.conv1(x)))
        h = F.max_pooling_2d(h, 3, stride=2, pad=1, cover_all=False)
        for stage in (self.res2, self.res3, self.res4, self.res5):
            for block in stage:
                h = block(h)
        return self.fc(global_average_pooling_2d(h))


def resnet18(num_classes=1000, **kwargs):
    """ResNet-18: 11,689,512 parameters with 1000 classes."""
    return ImageNetResNet(18, num_classes, **kwargs)


def resnet50(num_classes=1000, **kwargs):
    """ResNet-50 (v1.5): 25,557,032 parameters with 1000 classes."""
    return ImageNetResNet(50, num_classes, **kwargs)


def build_imagenet_resnet(name, num_classes=1000, **kwargs):
    """Builds ``'resnet<depth>'`` (18, 34, 50, 101, 152) as an ImageNet
    ResNet; ``kwargs`` go to :class:`ImageNetResNet` (``in_channels``)."""
    prefix = 'resnet'
    depth = name[len(prefix):] if name.startswith(prefix) else ''
    if not depth.isdigit() or int(depth) not in ARCHITECTURES:
        raise ValueError('unknown ImageNet ResNet {!r}: expected one of '
                         '{}'.format(name, ', '.join(
                             'resnet{}'.format(d)
                             for d in sorted(ARCHITECTURES))))
    return ImageNetResNet(int(depth), num_classes, **kwargs)
