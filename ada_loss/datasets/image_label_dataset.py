"""An in-memory dataset of ``(image, label)`` pairs."""
import chainer
import numpy


class ImageLabelDataset(chainer.dataset.DatasetMixin):
    """Images and integer labels held as two arrays.

    Images may be stored compactly (e.g. ``uint8``); each example is converted
    on access, so a 50000-image CIFAR training set costs 150 MB instead of 600.

    Args:
        images (numpy.ndarray): ``(N, C, H, W)`` array of any real dtype.
        labels (numpy.ndarray): ``(N,)`` integer labels.
        scale (float): factor applied after the cast to ``float32`` (e.g.
            ``1 / 255`` for ``uint8`` pixels) so that images lie in [0, 1].
        label_names (sequence of str): class names, or ``None`` if unknown.

    Attributes:
        images (numpy.ndarray): the stored images, as given.
        labels (numpy.ndarray): the labels as ``int32``.
        label_names (tuple of str or None): class names.

    ``get_example(i)`` returns ``(image, label)``: a fresh ``float32`` array of
    shape ``(C, H, W)`` and an ``int32`` scalar.
    """

    def __init__(self, images, labels, scale=1.0, label_names=None):
        images = numpy.asarray(images)
        labels = numpy.asarray(labels)
        if images.ndim != 4:
            raise ValueError('images must be (N, C, H, W), got shape {}'
                             .format(images.shape))
        if labels.shape != (len(images),):
            raise ValueError('labels must have shape ({},), got {}'
                             .format(len(images), labels.shape))
        self.images = images
        self.labels = labels.astype(numpy.int32, copy=False)
        self.scale = float(scale)
        self.label_names = (None if label_names is None
                            else tuple(label_names))

    def __len__(self):
        return len(self.images)

    def get_example(self, i):
        image = self.images[i].astype(numpy.float32)
        if self.scale != 1.0:
            image *= numpy.float32(self.scale)
        return image, self.labels[i]
