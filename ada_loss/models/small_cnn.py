"""Small convolutional networks for fast tests and underflow measurements."""
import chainer
import chainer.functions as F
import chainer.links as L

from ada_loss import functions as AF
from ada_loss import links as AL
from ada_loss.models.common import global_average_pooling_2d, he_normal


class SmallCNN(chainer.Chain):
    """Three conv-BN-ReLU layers, two 2x2 max poolings, global average pooling
    and a linear classifier; for 16x16 or 28x28 single-channel images.

    ``conv1`` (``width``) -> pool -> ``conv2`` (``2 width``) -> pool ->
    ``conv3`` (``4 width``) -> average -> ``fc``. Convolutions are 3x3 with
    padding 1, no bias, He-normal initialization (He et al. 2015).

    Args:
        num_classes (int): output size.
        in_channels (int): input channels.
        width (int): filters of the first convolution.
    """

    def __init__(self, num_classes=10, in_channels=1, width=8):
        super(SmallCNN, self).__init__()
        with self.init_scope():
            self.conv1 = AL.Convolution2D(in_channels, width, 3, pad=1,
                                          nobias=True, initialW=he_normal())
            self.bn1 = L.BatchNormalization(width)
            self.conv2 = AL.Convolution2D(width, 2 * width, 3, pad=1,
                                          nobias=True, initialW=he_normal())
            self.bn2 = L.BatchNormalization(2 * width)
            self.conv3 = AL.Convolution2D(2 * width, 4 * width, 3, pad=1,
                                          nobias=True, initialW=he_normal())
            self.bn3 = L.BatchNormalization(4 * width)
            self.fc = AL.Linear(4 * width, num_classes)

    def forward(self, x):
        h = AF.relu(self.bn1(self.conv1(x)))
        h = F.max_pooling_2d(h, 2, cover_all=False)
        h = AF.relu(self.bn2(self.conv2(h)))
        h = F.max_pooling_2d(h, 2, cover_all=False)
        h = AF.relu(self.bn3(self.conv3(h)))
        return self.fc(global_average_pooling_2d(h))


class PlainConvNet(chainer.Chain):
    """Deep plain CNN without batch normalization: ``depth`` 3x3 conv + ReLU
    layers (``conv1`` ... ``conv<depth>``, with bias, He-normal initialized,
    ``width`` filters, stride 1, padding 1), global average pooling and
    ``fc``.

    Without BN nor shortcuts the activation gradients shrink layer after layer
    going backward, so the layers near the input are where FP16 gradients
    underflow: the model used to measure gradient underflow (Figure 1 of the
    adaptive loss scaling paper).

    Args:
        depth (int): number of convolutions (>= 1).
        width (int): filters of every convolution.
        num_classes (int): output size.
        in_channels (int): input channels.
    """

    def __init__(self, depth=16, width=16, num_classes=10, in_channels=1):
        super(PlainConvNet, self).__init__()
        if depth < 1:
            raise ValueError('depth must be >= 1, not {}'.format(depth))
        self.depth = depth
        with self.init_scope():
            channels = in_channels
            for i in range(depth):
                setattr(self, 'conv{}'.format(i + 1), AL.Convolution2D(
                    channels, width, 3, pad=1, initialW=he_normal()))
                channels = width
            self.fc = AL.Linear(width, num_classes)

    def forward(self, x):
        h = x
        for i in range(self.depth):
            h = AF.relu(getattr(self, 'conv{}'.format(i + 1))(h))
        return self.fc(global_average_pooling_2d(h))
