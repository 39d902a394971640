"""scikit-learn's handwritten digits: a real image dataset needing no download.

``sklearn.datasets.load_digits`` ships 1797 grayscale 8x8 images of the digits
0-9 (about 180 per class) with integer pixel values 0..16, from the UCI
"Optical Recognition of Handwritten Digits" set. Upsampled to 16x16 or 32x32
they are large enough for a small strided ResNet, which makes them the
dataset of the demos and tests.
"""
import os

import numpy

from ada_loss.datasets.image_label_dataset import ImageLabelDataset

DIGITS_SIZE = 8
DIGITS_MAX_VALUE = 16.0


def get_digits(test_ratio=0.2, seed=0, size=16):
    """Loads the scikit-learn digits as a stratified train/test split.

    Args:
        test_ratio (float): fraction of each class put in the test set, in
            (0, 1).
        seed (int): seed of the split; the same seed gives the same split.
        size (int): side of the returned images; 8x8 pixels are upsampled by
            nearest neighbour (each pixel repeated ``size / 8`` times when
            ``size`` is a multiple of 8).

    Returns:
        tuple: ``(train, test)``, two :class:`ImageLabelDataset` whose examples
        are a ``float32`` ``(1, size, size)`` image in [0, 1] and an ``int32``
        label in 0..9.
    """
    if not 0 < test_ratio < 1:
        raise ValueError('test_ratio must be in (0, 1), got {}'.format(
            test_ratio))
    if int(size) != size or size < 1:
        raise ValueError('size must be a positive integer, got {}'.format(size))
    # imported here: scikit-learn takes seconds to import, and importing
    # ada_loss.datasets (python -m ada_loss.datasets.fetch) needs none of it
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    digits = load_digits()
    index = numpy.arange(int(size)) * DIGITS_SIZE // int(size)
    images = digits.images[:, index][:, :, index] / DIGITS_MAX_VALUE
    images = images.astype(numpy.float32)[:, None]
    labels = digits.target.astype(numpy.int32)
    train_idx, test_idx = train_test_split(
        numpy.arange(len(labels)), test_size=test_ratio, random_state=seed,
        stratify=labels)
    names = [str(d) for d in range(10)]
    return tuple(ImageLabelDataset(images[idx], labels[idx], label_names=names)
                 for idx in (train_idx, test_idx))


def digits_files():
    """The file scikit-learn's ``load_digits`` reads (its bundled
    ``data/digits.csv.gz``), as a one-element list of its absolute path."""
    import sklearn.datasets     # imported here, as in get_digits
    return [os.path.join(os.path.dirname(os.path.abspath(
        sklearn.datasets.__file__)), 'data', 'digits.csv.gz')]
