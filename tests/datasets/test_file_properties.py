"""IDX (Fashion-MNIST) and ImageNet labels files, corrupted
(docs/reliability.md): every file either reads to data that agrees with
its header (IDX: shape and size) or gives one DatasetFormatError naming
the file and what was expected; never another exception."""
import gzip
import os
import sys

import numpy
from hypothesis import given, settings, strategies as st

from ada_loss.datasets import DatasetFormatError
from ada_loss.datasets.idx import read_idx
from ada_loss.datasets.imagenet import read_val_labels

from property_helpers import assert_specific, examples

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_fashion_mnist import idx_bytes  # NOQA: E402

WNIDS = ['n01440764', 'n01443537', 'n01484850']
IDX = [idx_bytes(numpy.arange(2 * 3 * 4).reshape(2, 3, 4) % 256),
       idx_bytes(numpy.arange(5) % 10)]
LABELS = {
    'val.txt': b'ILSVRC2012_val_00000001.JPEG 0\nILSVRC2012_val_00000002.'
               b'JPEG n01484850\n\n',
    'LOC_val_solution.csv': b'ImageId,PredictionString\nILSVRC2012_val_0000'
                            b'0001,n01443537 1 2 3 4\n'}


def _mutate(draw, data):
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(['cut', 'flip', 'insert', 'header']))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == 'cut':
            del data[i:i + draw(st.integers(1, 16))]
        elif how == 'flip' and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif how == 'header' and len(data) >= 8:     # a forged dimension
            data[4:8] = draw(st.integers(0, 2 ** 32 - 1)).to_bytes(4, 'big')
        else:
            data[i:i] = draw(st.binary(max_size=6) | st.sampled_from(
                [b'\x00', b'\xff\xfe', b',', b'\n', b' ', b'-1', b'\xb2',
                 b'\xd9\xa3', b'"']))
    return bytes(data)


@st.composite
def idx_files(draw):
    data = _mutate(draw, draw(st.sampled_from(IDX)))
    return data, draw(st.booleans())


@settings(max_examples=examples(500))
@given(idx_files())
def test_corrupted_idx_files_read_or_name_the_file(tmp_path_factory, case):
    data, compressed = case
    path = str(tmp_path_factory.getbasetemp() / (
        'f-idx3-ubyte' + ('.gz' if compressed else '')))
    if compressed and data[:1] != b'\x1f':       # also corrupt gzip streams
        with gzip.open(path, 'wb') as f:
            f.write(data)
    else:
        with open(path, 'wb') as f:
            f.write(data)
    try:
        array = read_idx(path)
    except DatasetFormatError as e:
        assert path in str(e)
        assert_specific(e)
    else:
        ndim = data[3]
        shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], 'big')
                      for i in range(ndim))
        assert array.shape == shape
        assert 4 + 4 * ndim + array.nbytes == len(data)


def test_a_gzip_stream_that_is_not_gzip_is_named(tmp_path):
    path = str(tmp_path / 'x-idx1-ubyte.gz')
    with open(path, 'wb') as f:
        f.write(gzip.compress(IDX[1])[:-12] + b'\x00' * 12)   # bad CRC
    try:
        read_idx(path)
    except DatasetFormatError as e:
        assert path in str(e)
    else:
        raise AssertionError('read a corrupted gzip file')


@st.composite
def label_files(draw):
    name = draw(st.sampled_from(sorted(LABELS)))
    return name, _mutate(draw, LABELS[name])


@settings(max_examples=examples(500))
@given(label_files())
def test_corrupted_labels_files_read_or_name_the_file(tmp_path_factory,
                                                      case):
    name, data = case
    path = str(tmp_path_factory.getbasetemp() / name)
    with open(path, 'wb') as f:
        f.write(data)
    try:
        labels = read_val_labels(path, WNIDS)
    except DatasetFormatError as e:
        assert path in str(e)
        assert_specific(e)
    else:
        assert all(isinstance(k, str) and 0 <= v < 3
                   for k, v in labels.items())
