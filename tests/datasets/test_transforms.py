"""CIFAR augmentation and normalization."""
import random

import chainer
import numpy
import pytest

from ada_loss.datasets import CIFAR10_MEAN
from ada_loss.datasets import CIFAR10_STD
from ada_loss.datasets import channel_stats
from ada_loss.datasets import cifar_test_transform
from ada_loss.datasets import cifar_train_transform
from ada_loss.datasets import ImageLabelDataset
from ada_loss.datasets import normalize
from ada_loss.datasets import transform_dataset


def _images(n=64, seed=0):
    rng = numpy.random.RandomState(seed)
    return rng.randint(0, 256, size=(n, 3, 32, 32)).astype(numpy.uint8)


def test_channel_stats():
    images = _images()
    mean, std = channel_stats(images, batch_size=10)
    x = images.astype(numpy.float64) / 255
    numpy.testing.assert_allclose(mean, x.mean(axis=(0, 2, 3)))
    numpy.testing.assert_allclose(std, x.std(axis=(0, 2, 3)))
    mean_f, _ = channel_stats(x.astype(numpy.float32))
    numpy.testing.assert_allclose(mean_f, mean, rtol=1e-6)


def test_normalization_mean_zero():
    images = _images()
    dataset = ImageLabelDataset(images, numpy.zeros(len(images)), scale=1 / 255)
    mean, std = channel_stats(images)
    out = numpy.stack([cifar_test_transform(mean, std)(dataset[i])[0]
                       for i in range(len(dataset))])
    assert out.dtype == numpy.float32
    numpy.testing.assert_allclose(out.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    numpy.testing.assert_allclose(out.std(axis=(0, 2, 3)), 1, atol=1e-5)
    assert len(CIFAR10_MEAN) == len(CIFAR10_STD) == 3


def _locate(out, img, mean, std, pad=4):
    """All (y, x, flipped) such that ``out`` is that crop of the padded image."""
    padded = numpy.pad(normalize(img, mean, std),
                       ((0, 0), (pad, pad), (pad, pad)))
    _, h, w = img.shape
    return [(y, x, f) for y in range(2 * pad + 1) for x in range(2 * pad + 1)
            for f in (False, True)
            for crop in [padded[:, y:y + h, x:x + w]]
            if numpy.array_equal(out, crop[:, :, ::-1] if f else crop)]


def test_train_transform_crop_and_flip():
    img = numpy.random.RandomState(1).rand(3, 32, 32).astype(numpy.float32)
    transform = cifar_train_transform(0.5, 0.25, rng=0)
    crops, flips = set(), 0
    for _ in range(200):
        out, label = transform((img, 7))
        assert out.shape == (3, 32, 32) and out.dtype == numpy.float32
        assert label == 7
        found = _locate(out, img, 0.5, 0.25)
        assert len(found) == 1    # a padded crop, possibly mirrored
        crops.add(found[0][:2])
        flips += found[0][2]
    assert 50 < flips < 150 and len(crops) > 20


def test_train_transform_reproducible():
    img = numpy.random.RandomState(2).rand(3, 32, 32).astype(numpy.float32)
    runs = []
    for _ in range(2):
        t = cifar_train_transform(CIFAR10_MEAN, CIFAR10_STD,
                                  rng=numpy.random.RandomState(5))
        runs.append([t((img, 0))[0] for _ in range(5)])
    for a, b in zip(*runs):
        numpy.testing.assert_array_equal(a, b)
    gen = cifar_train_transform(CIFAR10_MEAN, CIFAR10_STD,
                                rng=numpy.random.default_rng(0))
    assert gen((img, 0))[0].shape == (3, 32, 32)


def test_chainercv_path_flips_with_seed():
    img = numpy.random.RandomState(3).rand(3, 8, 8).astype(numpy.float32) + 1
    transform = cifar_train_transform(0, 1)   # rng=None: chainercv + random
    random.seed(0)
    outs = [transform((img, 0))[0] for _ in range(100)]
    random.seed(0)
    assert all(numpy.array_equal(a, transform((img, 0))[0]) for a in outs)
    found = [_locate(o, img, 0, 1) for o in outs]
    assert all(len(f) == 1 for f in found)
    flips = sum(f[0][2] for f in found)
    assert 20 < flips < 80
    # zero padding shows up at the border of off-centre crops
    assert any((o == 0).all(axis=0).any() for o in outs)


def test_transform_dataset_with_iterator():
    images = _images(8)
    base = ImageLabelDataset(images, numpy.arange(8), scale=1 / 255)
    dataset = transform_dataset(base, cifar_train_transform(
        CIFAR10_MEAN, CIFAR10_STD, rng=0))
    assert isinstance(dataset, chainer.datasets.TransformDataset)
    batch = next(chainer.iterators.SerialIterator(dataset, 4, shuffle=False))
    x, t = chainer.dataset.concat_examples(batch)
    assert x.shape == (4, 3, 32, 32) and x.dtype == numpy.float32
    numpy.testing.assert_array_equal(t, [0, 1, 2, 3])
    assert t.dtype == numpy.int32


def test_channel_stats_rejects_bad_shape():
    with pytest.raises(ValueError, match='N, C, H, W'):
        channel_stats(numpy.zeros((3, 32, 32)))


def test_transforms_pickle():
    # MultiprocessIterator pickles the dataset and its transform
    import pickle
    img = numpy.ones((3, 32, 32), numpy.float32)
    for t in (cifar_train_transform(CIFAR10_MEAN, CIFAR10_STD, rng=1),
              cifar_test_transform(CIFAR10_MEAN, CIFAR10_STD)):
        clone = pickle.loads(pickle.dumps(t))
        numpy.testing.assert_array_equal(clone((img, 0))[0], t((img, 0))[0])
