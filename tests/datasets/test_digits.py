"""get_digits: scikit-learn's real 8x8 digits as a stratified split."""
import numpy
import pytest

from ada_loss.datasets import get_digits


def test_shapes_and_types():
    train, test = get_digits()
    assert len(train) + len(test) == 1797
    assert len(test) == 360   # ceil(0.2 * 1797)
    assert train.images.shape == (len(train), 1, 16, 16)
    image, label = train[0]
    assert image.shape == (1, 16, 16) and image.dtype == numpy.float32
    assert label.dtype == numpy.int32
    assert train.images.min() == 0 and train.images.max() == 1
    assert set(train.labels) == set(test.labels) == set(range(10))


def test_upsampling_repeats_pixels():
    small, _ = get_digits(size=8)
    big, _ = get_digits(size=32)
    numpy.testing.assert_array_equal(
        big.images, numpy.kron(small.images, numpy.ones((4, 4), 'f')))
    numpy.testing.assert_array_equal(small.images * 16,
                                     numpy.round(small.images * 16))


def test_deterministic_by_seed():
    a, _ = get_digits(seed=3)
    b, _ = get_digits(seed=3)
    c, _ = get_digits(seed=4)
    numpy.testing.assert_array_equal(a.images, b.images)
    numpy.testing.assert_array_equal(a.labels, b.labels)
    assert not numpy.array_equal(a.labels, c.labels)


def test_stratified():
    train, test = get_digits(test_ratio=0.25)
    all_counts = numpy.bincount(
        numpy.concatenate([train.labels, test.labels]), minlength=10)
    test_counts = numpy.bincount(test.labels, minlength=10)
    assert numpy.all(numpy.abs(test_counts - 0.25 * all_counts) <= 1)


def test_bad_arguments():
    with pytest.raises(ValueError, match='test_ratio'):
        get_digits(test_ratio=1.0)
    with pytest.raises(ValueError, match='size'):
        get_digits(size=0)
