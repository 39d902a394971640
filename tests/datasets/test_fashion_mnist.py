"""get_fashion_mnist on small IDX .gz fixtures."""
import gzip
import os
import shutil

import numpy
import pytest

from ada_loss.datasets import DatasetFormatError
from ada_loss.datasets import DatasetNotFoundError
from ada_loss.datasets import fashion_mnist_available
from ada_loss.datasets import get_fashion_mnist
from ada_loss.datasets import parse_idx

NAMES = ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
         't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')


def idx_bytes(array, magic=None):
    """The IDX encoding of a uint8 array (optionally with a forged magic)."""
    array = numpy.asarray(array, numpy.uint8)
    if magic is None:
        magic = 0x0800 + array.ndim
    header = magic.to_bytes(4, 'big') + b''.join(
        d.to_bytes(4, 'big') for d in array.shape)
    return header + array.tobytes()


def write_gz(path, data):
    with gzip.open(str(path), 'wb') as f:
        f.write(data)


def make_fashion_mnist(root, n_train=6, n_test=4):
    rng = numpy.random.RandomState(0)
    truth = {}
    for prefix, n in (('train', n_train), ('t10k', n_test)):
        images = rng.randint(0, 256, size=(n, 28, 28)).astype(numpy.uint8)
        labels = numpy.arange(n, dtype=numpy.uint8) % 10
        write_gz(root / ('%s-images-idx3-ubyte.gz' % prefix),
                 idx_bytes(images))
        write_gz(root / ('%s-labels-idx1-ubyte.gz' % prefix),
                 idx_bytes(labels))
        truth[prefix] = (images, labels)
    return truth


def test_load(tmp_path):
    truth = make_fashion_mnist(tmp_path)
    assert fashion_mnist_available(str(tmp_path))
    train, test = get_fashion_mnist(str(tmp_path))
    assert len(train) == 6 and len(test) == 4
    assert train.images.shape == (6, 1, 28, 28)
    image, label = train[3]
    assert image.shape == (1, 28, 28) and image.dtype == numpy.float32
    assert label.dtype == numpy.int32 and label == 3
    numpy.testing.assert_allclose(image[0], truth['train'][0][3] / 255.0,
                                  rtol=1e-6)
    numpy.testing.assert_array_equal(test.images[:, 0], truth['t10k'][0])
    assert train.label_names[9] == 'Ankle boot'


def test_uncompressed_copies(tmp_path):
    make_fashion_mnist(tmp_path)
    for name in NAMES[:2]:
        with gzip.open(str(tmp_path / name)) as f:
            (tmp_path / name[:-3]).write_bytes(f.read())
        os.remove(str(tmp_path / name))
    train, _ = get_fashion_mnist(tmp_path)
    assert len(train) == 6


def test_missing(tmp_path):
    assert not fashion_mnist_available(str(tmp_path))
    make_fashion_mnist(tmp_path)
    os.remove(str(tmp_path / NAMES[3]))
    assert not fashion_mnist_available(str(tmp_path))
    with pytest.raises(FileNotFoundError) as e:
        get_fashion_mnist(str(tmp_path))
    assert isinstance(e.value, DatasetNotFoundError)
    assert 'missing t10k-labels-idx1-ubyte.gz' in str(e.value)
    for name in NAMES:
        assert name in str(e.value)


def test_bad_magic(tmp_path):
    make_fashion_mnist(tmp_path)
    labels = numpy.zeros(6, numpy.uint8)
    write_gz(tmp_path / NAMES[1], idx_bytes(labels, magic=2051))
    with pytest.raises(ValueError) as e:
        get_fashion_mnist(str(tmp_path))
    assert isinstance(e.value, DatasetFormatError)
    assert NAMES[1] in str(e.value) and 'expected 2049' in str(e.value)
    # images and labels files swapped
    make_fashion_mnist(tmp_path)
    shutil.copy(str(tmp_path / NAMES[1]), str(tmp_path / NAMES[0]))
    with pytest.raises(DatasetFormatError, match='magic number 2049.*'
                       'expected 2051'):
        get_fashion_mnist(str(tmp_path))


def test_malformed(tmp_path):
    make_fashion_mnist(tmp_path)
    (tmp_path / NAMES[2]).write_bytes(b'not gzip')
    with pytest.raises(DatasetFormatError, match='gzip'):
        get_fashion_mnist(str(tmp_path))
    make_fashion_mnist(tmp_path)
    write_gz(tmp_path / NAMES[3], idx_bytes(numpy.zeros(5, numpy.uint8)))
    with pytest.raises(DatasetFormatError, match='5 labels for the 4 images'):
        get_fashion_mnist(str(tmp_path))
    with pytest.raises(DatasetFormatError, match='data bytes'):
        parse_idx(idx_bytes(numpy.zeros((2, 3), numpy.uint8))[:-1])


def test_parse_idx_types():
    data = numpy.arange(6, dtype='>i4').reshape(2, 3)
    buf = bytes([0, 0, 0x0C, 2]) + (2).to_bytes(4, 'big') + \
        (3).to_bytes(4, 'big') + data.tobytes()
    out = parse_idx(buf)
    numpy.testing.assert_array_equal(out, numpy.arange(6).reshape(2, 3))
    assert out.dtype == numpy.int32
