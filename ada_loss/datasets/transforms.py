"""CIFAR preprocessing and augmentation (He et al., 2016, §4.2).

Training images are normalized per channel, zero-padded by 4 pixels on each
side, randomly cropped back to their size and randomly flipped horizontally;
test images are only normalized. Padding happens after normalization, so the
padding value is the channel mean, as with He et al.'s mean-subtracted inputs.

Transforms are picklable classes (usable with ``MultiprocessIterator``) that map
an ``(image, label)`` example to a new one; wrap a dataset with
:func:`transform_dataset` (``chainer.datasets.TransformDataset``).
"""
import chainer
import chainercv.transforms
import numpy

#: Per-channel (R, G, B) mean and standard deviation of the CIFAR-10 and
#: CIFAR-100 training sets, for pixels scaled to [0, 1] (population std over
#: all training pixels of a channel; :func:`channel_stats` recomputes them).
CIFAR10_MEAN = (0.49139968, 0.48215841, 0.44653091)
CIFAR10_STD = (0.24703223, 0.24348513, 0.26158784)
CIFAR100_MEAN = (0.50707516, 0.48654887, 0.44091784)
CIFAR100_STD = (0.26733429, 0.25643846, 0.27615047)

TransformDataset = chainer.datasets.TransformDataset


def transform_dataset(dataset, transform):
    """Returns ``dataset`` with ``transform`` applied to each example.

    A thin alias of :class:`chainer.datasets.TransformDataset`; ``transform``
    receives and returns an ``(image, label)`` tuple.
    """
    return TransformDataset(dataset, transform)


def channel_stats(images, batch_size=1024):
    """Per-channel mean and standard deviation of a set of images.

    Args:
        images (numpy.ndarray): ``(N, C, H, W)`` images; ``uint8`` pixels are
            scaled by 1/255 first (so the result matches ``float32`` images in
            [0, 1], e.g. ``get_cifar(...)[0].images``).
        batch_size (int): images processed at once (bounds the memory used).

    Returns:
        tuple: ``(mean, std)``, two ``float64`` arrays of shape ``(C,)``; the
        std is the population std over all pixels of a channel.
    """
    images = numpy.asarray(images)
    if images.ndim != 4 or len(images) == 0:
        raise ValueError('images must be a non-empty (N, C, H, W) array, got '
                         'shape {}'.format(images.shape))
    scale = 1.0 / 255 if images.dtype == numpy.uint8 else 1.0
    total = numpy.zeros(images.shape[1])
    total_sq = numpy.zeros(images.shape[1])
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size].astype(numpy.float64) * scale
        total += chunk.sum(axis=(0, 2, 3))
        total_sq += (chunk * chunk).sum(axis=(0, 2, 3))
    count = images.size / images.shape[1]
    mean = total / count
    var = numpy.maximum(total_sq / count - mean * mean, 0.0)
    return mean, numpy.sqrt(var)


def normalize(img, mean, std):
    """Returns ``(img - mean) / std`` per channel, as ``float32`` ``CHW``."""
    mean, std = _per_channel(mean), _per_channel(std)
    return ((numpy.asarray(img, numpy.float32) - mean) / std).astype(
        numpy.float32, copy=False)


def pad(img, width, value=0):
    """Pads a ``CHW`` image with ``width`` pixels of ``value`` on each side."""
    return numpy.pad(img, ((0, 0), (width, width), (width, width)),
                     mode='constant', constant_values=value)


def _per_channel(values):
    return numpy.asarray(values, numpy.float32).reshape(-1, 1, 1)


def _as_rng(rng):
    if rng is None or hasattr(rng, 'randint') or hasattr(rng, 'integers'):
        return rng
    return numpy.random.RandomState(rng)


def _draw(rng, high):
    """An integer in [0, high) from a RandomState or a Generator."""
    if hasattr(rng, 'integers'):
        return int(rng.integers(high))
    return int(rng.randint(high))


class CifarTrainTransform(object):
    """Normalize, zero-pad, random crop and random horizontal flip.

    Args:
        mean, std: per-channel statistics (e.g. :data:`CIFAR10_MEAN`,
            :data:`CIFAR10_STD`); scalars are broadcast to all channels.
        pad (int): pixels added on each side before cropping.
        rng: ``None`` to draw from Python's ``random`` module through
            ``chainercv.transforms.random_crop`` / ``random_flip`` (seed it
            with ``random.seed``), or a ``numpy.random.RandomState``,
            ``numpy.random.Generator`` or integer seed for a private,
            reproducible stream. With ``MultiprocessIterator`` each worker
            gets a copy of the stream: prefer ``None`` there.

    Calling it on ``(image, label)`` returns a new ``float32`` ``CHW`` image
    of the input's size and the unchanged label.
    """

    def __init__(self, mean, std, pad=4, rng=None):
        self.mean = _per_channel(mean)
        self.std = _per_channel(std)
        self.pad = int(pad)
        self.rng = _as_rng(rng)

    def __call__(self, in_data):
        img, label = in_data
        _, height, width = img.shape
        img = pad(normalize(img, self.mean, self.std), self.pad)
        if self.rng is None:
            img = chainercv.transforms.random_crop(img, (height, width))
            img = chainercv.transforms.random_flip(img, x_random=True)
        else:
            y = _draw(self.rng, img.shape[1] - height + 1)
            x = _draw(self.rng, img.shape[2] - width + 1)
            img = img[:, y:y + height, x:x + width]
            img = chainercv.transforms.flip(img, x_flip=bool(_draw(self.rng, 2)))
        return numpy.ascontiguousarray(img), label


class CifarTestTransform(object):
    """Per-channel normalization only; see :class:`CifarTrainTransform`."""

    def __init__(self, mean, std):
        self.mean = _per_channel(mean)
        self.std = _per_channel(std)

    def __call__(self, in_data):
        img, label = in_data
        return normalize(img, self.mean, self.std), label


def cifar_train_transform(mean, std, rng=None):
    """Training augmentation of He et al. (2016); see CifarTrainTransform."""
    return CifarTrainTransform(mean, std, pad=4, rng=rng)


def cifar_test_transform(mean, std):
    """Test-time preprocessing: per-channel normalization only."""
    return CifarTestTransform(mean, std)
