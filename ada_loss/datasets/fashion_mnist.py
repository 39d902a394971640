"""Fashion-MNIST read from its IDX files.

The dataset (Xiao et al., 2017; https://github.com/zalandoresearch/fashion-mnist)
is 60000 training and 10000 test 28x28 grayscale images of 10 clothing
classes, stored as four IDX files (see :mod:`ada_loss.datasets.idx`)::

    train-images-idx3-ubyte.gz   train-labels-idx1-ubyte.gz
    t10k-images-idx3-ubyte.gz    t10k-labels-idx1-ubyte.gz

Uncompressed copies (the same names without ``.gz``) are accepted too. On
Debian, ``apt-get install dataset-fashion-mnist`` puts them in
``/usr/share/datasets/fashion-mnist``, the default location here.
"""
import os

import numpy

from ada_loss.datasets.errors import DatasetFormatError
from ada_loss.datasets.errors import DatasetNotFoundError
from ada_loss.datasets.idx import IDX_IMAGES_MAGIC
from ada_loss.datasets.idx import IDX_LABELS_MAGIC
from ada_loss.datasets.idx import read_idx
from ada_loss.datasets.image_label_dataset import ImageLabelDataset

FASHION_MNIST_ROOT = '/usr/share/datasets/fashion-mnist'
FASHION_MNIST_URL = 'https://github.com/zalandoresearch/fashion-mnist'

fashion_mnist_label_names = (
    'T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt',
    'Sneaker', 'Bag', 'Ankle boot')

_FILES = {split: ('{}-images-idx3-ubyte.gz'.format(prefix),
                  '{}-labels-idx1-ubyte.gz'.format(prefix))
          for split, prefix in (('train', 'train'), ('test', 't10k'))}


def _locate(root, name):
    """The path of ``name`` or of its uncompressed copy, or ``None``."""
    for candidate in (name, name[:-len('.gz')]):
        path = os.path.join(root, candidate)
        if os.path.isfile(path):
            return path
    return None


def fashion_mnist_available(root=FASHION_MNIST_ROOT):
    """Whether the four Fashion-MNIST IDX files exist in ``root``.

    Only checks that the files are there; it does not parse them.
    """
    return all(_locate(os.fspath(root), name)
               for names in _FILES.values() for name in names)


def fashion_mnist_files(root=FASHION_MNIST_ROOT):
    """The files :func:`get_fashion_mnist` reads from ``root`` (absolute
    paths, in its order; reads none of them); missing ones are left out."""
    root = os.fspath(root)
    found = [_locate(root, name) for split in ('train', 'test')
             for name in _FILES[split]]
    return [os.path.abspath(p) for p in found if p is not None]


def get_fashion_mnist(root=FASHION_MNIST_ROOT):
    """Loads Fashion-MNIST from the IDX files in ``root``.

    Returns:
        tuple: ``(train, test)``, two :class:`ImageLabelDataset` whose examples
        are a ``float32`` ``(1, 28, 28)`` image in [0, 1] and an ``int32``
        label in 0..9; ``.images`` holds the ``uint8`` ``(N, 1, 28, 28)``
        array.

    Raises:
        DatasetNotFoundError: (a ``FileNotFoundError``) a file is missing.
        DatasetFormatError: (a ``ValueError``) a file is not valid IDX data.
    """
    root = os.fspath(root)
    missing = [name for names in _FILES.values() for name in names
               if _locate(root, name) is None]
    if missing:
        raise DatasetNotFoundError(
            'Fashion-MNIST not found in {}: missing {}. Expected the IDX files '
            '{} (or uncompressed copies without .gz). Install them with '
            '`apt-get install dataset-fashion-mnist` (Debian, into {}), fetch '
            'them with `python -m ada_loss.datasets.fetch fashion_mnist --root '
            '{}` (or `--set data.download=true` on an entry), or download '
            'them from {} yourself; this loader never downloads.'.format(
                root, ', '.join(missing),
                ', '.join(n for names in _FILES.values() for n in names),
                FASHION_MNIST_ROOT, root, FASHION_MNIST_URL))
    return tuple(_load_split(root, *_FILES[split]) for split in ('train', 'test'))


def _load_split(root, images_name, labels_name):
    images_path = _locate(root, images_name)
    labels_path = _locate(root, labels_name)
    images = read_idx(images_path, IDX_IMAGES_MAGIC)
    labels = read_idx(labels_path, IDX_LABELS_MAGIC)
    if images.ndim != 3 or images.dtype != numpy.uint8:
        raise DatasetFormatError('{}: expected uint8 images (N, rows, cols), got '
                                 '{} {}'.format(images_path, images.dtype,
                                                images.shape))
    if labels.ndim != 1 or len(labels) != len(images):
        raise DatasetFormatError('{} has {} labels for the {} images of {}'
                                 .format(labels_path, len(labels), len(images),
                                         images_path))
    if labels.size and labels.max() >= len(fashion_mnist_label_names):
        raise DatasetFormatError('{}: labels must lie in 0..9, found {}'.format(
            labels_path, labels.max()))
    return ImageLabelDataset(images[:, None], labels, scale=1.0 / 255,
                             label_names=fashion_mnist_label_names)
