"""A NumPy reader for the IDX format of MNIST and Fashion-MNIST.

An IDX file is a big-endian header followed by the raw array::

    bytes 0-1   zero
    byte  2     element type: 0x08 uint8, 0x09 int8, 0x0B int16,
                0x0C int32, 0x0D float32, 0x0E float64
    byte  3     number of dimensions d
    then        d big-endian uint32 sizes, then the data in C order

The first four bytes read as a big-endian integer are the "magic number":
2051 (0x00000803) for uint8 image stacks (N, rows, cols) and 2049
(0x00000801) for uint8 label vectors (N,).
"""
import gzip
import math
import zlib

import numpy

from ada_loss.datasets.errors import DatasetFormatError

IDX_IMAGES_MAGIC = 2051
IDX_LABELS_MAGIC = 2049

#: the largest IDX file read (MNIST-like sets are tens of MB; a larger
#: one, or a gzip stream inflating beyond it, is refused unread)
MAX_BYTES = 1 << 31

_TYPES = {0x08: '>u1', 0x09: '>i1', 0x0B: '>i2', 0x0C: '>i4', 0x0D: '>f4',
          0x0E: '>f8'}


def parse_idx(buf, expected_magic=None, name='IDX data'):
    """Parses the bytes of an IDX file into a NumPy array.

    Args:
        buf (bytes): the file content (already decompressed).
        expected_magic (int): if given, the required magic number.
        name (str): how the data is named in error messages.

    Raises:
        DatasetFormatError: bad magic number, type or size.
    """
    if len(buf) < 4:
        raise DatasetFormatError('{}: {} bytes is too short for an IDX header'
                                 .format(name, len(buf)))
    magic = int.from_bytes(buf[:4], 'big')
    if expected_magic is not None and magic != expected_magic:
        raise DatasetFormatError(
            '{}: magic number {} (0x{:08X}), expected {} (0x{:08X}); is this '
            'the right IDX file?'.format(name, magic, magic, expected_magic,
                                         expected_magic))
    if buf[0] != 0 or buf[1] != 0 or buf[2] not in _TYPES:
        raise DatasetFormatError('{}: magic number 0x{:08X} is not an IDX '
                                 'header'.format(name, magic))
    ndim = buf[3]
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise DatasetFormatError('{}: truncated IDX header'.format(name))
    shape = tuple(int(d) for d in numpy.frombuffer(buf, '>u4', ndim, 4))
    dtype = numpy.dtype(_TYPES[buf[2]])
    # Python's product: NumPy's would wrap around in int64 for a forged
    # header and could then match the data's size
    expected = math.prod(shape) * dtype.itemsize
    if len(buf) - header != expected:
        raise DatasetFormatError('{}: {} data bytes for shape {} of {}, '
                                 'expected {}'.format(name, len(buf) - header,
                                                      shape, dtype, expected))
    data = numpy.frombuffer(buf, dtype, offset=header).reshape(shape)
    return data.astype(dtype.newbyteorder('='))


def read_idx(path, expected_magic=None):
    """Reads an IDX file, gzip-compressed if its name ends with ``.gz``."""
    path = str(path)
    try:
        opener = gzip.open if path.endswith('.gz') else open
        with opener(path, 'rb') as f:
            buf = f.read(MAX_BYTES + 1)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DatasetFormatError('{} is not a readable gzip file ({})'.format(
            path, e)) from e
    if len(buf) > MAX_BYTES:    # e.g. a gzip bomb: not read further
        raise DatasetFormatError('{}: more than {} bytes of data, expected '
                                 'an IDX file of at most that'.format(
                                     path, MAX_BYTES))
    return parse_idx(buf, expected_magic, name=path)
