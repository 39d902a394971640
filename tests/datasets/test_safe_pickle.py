"""The restricted unpickler of data files
(:mod:`ada_loss.datasets.safe_pickle`) and CIFAR through it: a pickle whose
loading would run code runs none (its side effect is asserted absent);
real-layout CIFAR batches pickled as Python 2 wrote them and as Python 3 /
NumPy 2 write them (protocols 2-5) load; any truncated or bit-flipped file
gives one DatasetFormatError naming the file."""
import os
import pickle
import struct
import sys

import numpy
import pytest
from hypothesis import given, settings, strategies as st

from ada_loss.datasets import DatasetFormatError, get_cifar
from ada_loss.datasets import safe_pickle

from property_helpers import assert_specific, examples

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cifar import _rows, make_cifar10  # NOQA: E402


# -- Python 2's cPickle (protocol 2), written opcode by opcode ----------------
def _py2_str(s):
    """A Python 2 ``str`` (bytes): SHORT_BINSTRING / BINSTRING."""
    if isinstance(s, str):
        s = s.encode('latin1')
    if len(s) < 256:
        return b'U' + bytes([len(s)]) + s
    return b'T' + struct.pack('<i', len(s)) + s


def _py2_obj(obj):
    if isinstance(obj, dict):
        out = b'}(' if obj else b'}'
        for k, v in obj.items():
            out += _py2_obj(k) + _py2_obj(v)
        return out + (b'u' if obj else b'')
    if isinstance(obj, list):
        return b'](' + b''.join(_py2_obj(v) for v in obj) + b'e'
    if isinstance(obj, (str, bytes)):
        return _py2_str(obj)
    if isinstance(obj, int):
        return b'J' + struct.pack('<i', obj)
    if isinstance(obj, numpy.ndarray):
        # numpy.core.multiarray._reconstruct(ndarray, (0,), 'b'), then
        # __setstate__((1, shape, dtype, is_fortran, raw bytes as str))
        dtype = (b'cnumpy\ndtype\n' + _py2_str(obj.dtype.str[1:]) +
                 b'K\x00K\x01\x87R' + b'(K\x03' + _py2_str(
                     obj.dtype.str[0]) + b'NNNJ\xff\xff\xff\xffJ\xff\xff'
                 b'\xff\xffK\x00tb')
        shape = b'(' + b''.join(b'J' + struct.pack('<i', n)
                                for n in obj.shape) + b't'
        return (b'cnumpy.core.multiarray\n_reconstruct\n' +
                b'cnumpy\nndarray\n' + b'K\x00\x85' + _py2_str(b'b') +
                b'\x87R' + b'(K\x01' + shape + dtype + b'\x89' +
                _py2_str(obj.tobytes()) + b'tb')
    raise TypeError(type(obj))


def py2_pickle(obj):
    """The bytes Python 2's ``cPickle.dump(obj, f, 2)`` writes for a CIFAR
    batch (dict of str keys, a uint8 array, lists of ints and str)."""
    return b'\x80\x02' + _py2_obj(obj) + b'.'


def _batch(n=4, seed=0):
    return {'batch_label': 'training batch 1 of 5', 'data': _rows(n, seed),
            'labels': [int(v) for v in numpy.arange(n) % 10],
            'filenames': ['img_{}.png'.format(i) for i in range(n)]}


def _same_batch(got, want):
    got = {k.decode() if isinstance(k, bytes) else k: v
           for k, v in got.items()}
    assert set(got) == set(want)
    numpy.testing.assert_array_equal(got['data'], want['data'])
    assert got['data'].dtype == numpy.uint8
    assert list(got['labels']) == want['labels']


def test_python2_layout_loads():
    batch = _batch()
    _same_batch(safe_pickle.loads(py2_pickle(batch)), batch)
    # the hand-written opcodes are what pickle itself reads back
    _same_batch(pickle.loads(py2_pickle(batch), encoding='latin1'), batch)


@pytest.mark.parametrize('protocol', [2, 3, 4, 5])
@pytest.mark.parametrize('bytes_keys', [False, True])
def test_python3_layouts_load(protocol, bytes_keys):
    batch = _batch()
    obj = dict(batch, labels=numpy.array(batch['labels'], numpy.int64))
    obj['first'] = numpy.int64(3)                   # a NumPy scalar
    if bytes_keys:
        obj = {k.encode(): v for k, v in obj.items()}
    got = safe_pickle.loads(pickle.dumps(obj, protocol=protocol))
    _same_batch({k: v for k, v in got.items() if k not in (
        'first', b'first')}, batch)


class _RunsCode(object):
    """Unpickling it would call os.system (the side effect: a file)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, ('touch {}'.format(self.path),))


class _Evals(object):
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (eval, ("open({!r}, 'w').close()".format(self.path),))


@pytest.mark.parametrize('evil', [_RunsCode, _Evals])
@pytest.mark.parametrize('protocol', [0, 2, 5])
def test_a_pickle_that_would_run_code_runs_none(tmp_path, evil, protocol):
    marker = str(tmp_path / 'ran__')   # as long as 'probe'
    payload = pickle.dumps(dict(_batch(), labels=evil(marker)),
                           protocol=protocol)
    # the payload is live: plain pickle does run it
    probe = str(tmp_path / 'probe')
    pickle.loads(payload.replace(marker.encode(), probe.encode()))
    assert os.path.exists(probe)
    with pytest.raises(safe_pickle.UnsafePickleError,
                       match='system|eval') as e:
        safe_pickle.loads(payload)
    assert_specific(e.value)
    assert not os.path.exists(marker)
    # the same file as a CIFAR batch: one error naming the file
    folder, _ = make_cifar10(tmp_path)
    with open(os.path.join(folder, 'data_batch_1'), 'wb') as f:
        f.write(payload)
    with pytest.raises(DatasetFormatError, match='data_batch_1.*not a CIFAR'):
        get_cifar('cifar10', folder)
    assert not os.path.exists(marker)


@pytest.mark.parametrize('obj, what', [
    ({'data': numpy.array([object()], object)}, 'object'),
    ({'data': numpy.array([1, 'a'], object)}, 'dtype object'),
    ({'data': {1, 2}}, 'set'),
    ({'data': numpy.ma.masked_array([1, 2])}, 'numpy.ma'),
    ({'data': numpy.zeros(2, [('a', 'u1')])}, 'dtype'),
])
def test_objects_a_data_file_does_not_hold_are_refused(obj, what):
    with pytest.raises(safe_pickle.UnsafePickleError, match=what):
        safe_pickle.loads(pickle.dumps(obj, protocol=2))


_VALID = [py2_pickle(_batch(1, 1))] + [
    pickle.dumps(_batch(1, 2), protocol=p) for p in (2, 4, 5)]


@st.composite
def corrupted(draw):
    data = bytearray(draw(st.sampled_from(_VALID)))
    how = draw(st.sampled_from(['truncate', 'flip', 'both', 'junk']))
    if how in ('truncate', 'both'):
        data = data[:draw(st.integers(0, len(data) - 1))]
    if how in ('flip', 'both') and data:
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
    if how == 'junk':
        data = bytearray(draw(st.binary(max_size=64)))
    return bytes(data)


@settings(max_examples=examples(500))
@given(corrupted())
def test_corrupted_pickles_give_one_format_error(data):
    try:
        obj = safe_pickle.loads(data)
    except DatasetFormatError as e:
        assert_specific(e)
    else:                       # a flip may leave a loadable, plain pickle
        safe_pickle.check_plain(obj)
