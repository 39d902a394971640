"""Snapshot files, corrupted and mutated (docs/reliability.md): loading a
truncated, bit-flipped or junk file, or one whose arrays are missing,
renamed, or of another shape or dtype, either loads a snapshot that fits,
starts afresh from an unreadable one (as before), or stops with a
SnapshotMismatchError naming the key; never another exception, and the
files on disk are never changed by loading. Fewer inputs than the string
parsers (examples(300)): each builds a trainer."""
import io
import os
import pickle
import re
import zipfile

import chainer
import chainer.links as L
import numpy as np
import pytest
from chainer import training
from hypothesis import given, settings, strategies as st

from ada_loss.scaling import make_loss_scaling
from ada_loss.training import MixedPrecisionUpdater
from ada_loss.training.safe_npz import UnsafeNpzError
from ada_loss.training.snapshot import (
    LATEST, PREVIOUS, SnapshotMismatchError, load_with_fallback,
    write_snapshot)

from property_helpers import assert_specific, examples


def _trainer(out):
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (6, 3)).astype(np.float32)
    t = rng.randint(0, 2, 6).astype(np.int32)
    it = chainer.iterators.SerialIterator(
        chainer.datasets.TupleDataset(x, t), 2, shuffle=False)
    model = L.Classifier(L.Linear(3, 2, initialW=np.full((2, 3), 0.1,
                                                         np.float32)))
    opt = chainer.optimizers.MomentumSGD(0.01)
    opt.setup(model)
    up = MixedPrecisionUpdater(it, opt, make_loss_scaling('dynamic'),
                               mode='dynamic')
    return training.Trainer(up, (3, 'iteration'), out=str(out))


def _snapshot_bytes(tmp):
    first = _trainer(tmp)
    first.run()
    write_snapshot(first, str(tmp))
    with open(os.path.join(str(tmp), LATEST), 'rb') as f:
        return f.read()


@pytest.fixture(scope='module')
def valid(tmp_path_factory):
    return _snapshot_bytes(tmp_path_factory.mktemp('snap'))


def _arrays(data):
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def _npz(arrays):
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


_file_mutation = st.tuples(
    st.sampled_from(['truncate', 'flip', 'junk', 'empty']),
    st.integers(0, 10 ** 6), st.lists(st.tuples(st.integers(0, 10 ** 6),
                                                st.integers(0, 7)),
                                      min_size=1, max_size=4),
    st.binary(max_size=64))
_key_mutation = st.tuples(
    st.sampled_from(['drop', 'rename', 'reshape', 'retype', 'scalar_to_array',
                     'text']),
    st.integers(0, 10 ** 6),
    st.sampled_from([np.float64, np.int32, np.int8, np.bool_, np.complex64,
                     np.uint8]))


def _mutate_file(data, mutation):
    how, cut, flips, junk = mutation
    data = bytearray(data)
    if how == 'truncate':
        return bytes(data[:cut % len(data)]), None
    if how == 'flip':
        for i, bit in flips:
            data[i % len(data)] ^= 1 << bit
        return bytes(data), None
    return (bytes(junk) if how == 'junk' else b''), None


def _mutate_keys(data, mutation):
    how, pick, dtype = mutation
    arrays = _arrays(data)
    key = sorted(arrays)[pick % len(arrays)]
    a = arrays[key]
    if how == 'drop':
        del arrays[key]
    elif how == 'rename':
        arrays[key + 'x'] = arrays.pop(key)
    elif how == 'reshape':
        arrays[key] = np.zeros(a.shape + (2,), a.dtype)
    elif how == 'retype':
        try:
            arrays[key] = a.astype(dtype)
        except (TypeError, ValueError):      # text (skipped layers' names)
            arrays[key] = np.zeros(a.shape, dtype)
    elif how == 'scalar_to_array':
        arrays[key] = np.zeros((3,), a.dtype)
    else:
        arrays[key] = np.array('ünï')
    return _npz(arrays), key


@settings(max_examples=examples(300))
@given(st.sampled_from(['file', 'keys']), _file_mutation, _key_mutation,
       st.booleans())
def test_mutated_snapshots_load_fall_back_or_name_the_key(
        tmp_path_factory, valid, what, file_mutation, key_mutation,
        with_previous):
    folder = tmp_path_factory.mktemp('run')
    bad, key = (_mutate_file(valid, file_mutation) if what == 'file'
                else _mutate_keys(valid, key_mutation))
    files = {LATEST: bad}
    if with_previous:
        files[PREVIOUS] = valid
    for name, data in files.items():
        with open(os.path.join(str(folder), name), 'wb') as f:
            f.write(data)
    trainer = _trainer(folder)
    try:
        loaded = load_with_fallback(trainer, str(folder), log=lambda t: None)
    except SnapshotMismatchError as e:
        assert_specific(e, e.key)
        assert not with_previous        # the intact previous one fits
        if key is not None and what == 'keys':
            # the mutated key, or (renamed) the one the trainer misses
            assert e.key in (key, key + 'x') or e.key in str(e)
    else:
        assert loaded in (LATEST, PREVIOUS, None)
        if with_previous:
            assert loaded is not None
    for name, data in files.items():            # loading changed nothing
        with open(os.path.join(str(folder), name), 'rb') as f:
            assert f.read() == data


def test_a_snapshot_of_another_model_is_refused_by_key(tmp_path, valid):
    arrays = _arrays(valid)
    w = [k for k in arrays if k.endswith('/W')][0]
    arrays[w] = np.zeros((5, 3), np.float32)      # another width
    with open(str(tmp_path / LATEST), 'wb') as f:
        f.write(_npz(arrays))
    with pytest.raises(SnapshotMismatchError) as e:
        load_with_fallback(_trainer(tmp_path), str(tmp_path),
                           log=lambda t: None)
    assert e.value.key == w
    assert 'float32 of shape (5, 3), expected float32 of shape (2, 3)' in \
        str(e.value)
    assert 'snapshots are kept' in str(e.value)
    # it crosses from a --jobs worker to the parent intact
    again = pickle.loads(pickle.dumps(e.value))
    assert (type(again), again.key, str(again)) == (
        type(e.value), e.value.key, str(e.value))


def test_a_snapshot_holding_a_pickle_is_not_loaded(tmp_path, valid):
    arrays = _arrays(valid)
    buf = io.BytesIO()
    np.savez(buf, **dict(arrays, evil=np.array([object()], object)))
    with open(str(tmp_path / LATEST), 'wb') as f:
        f.write(buf.getvalue())
    # not skipped as unreadable (which started afresh over it): the resume
    # stops naming the file and the key (issue 50 item 5)
    with pytest.raises(UnsafeNpzError, match='^{}: evil holds pickled'.format(
            re.escape(str(tmp_path / LATEST)))):
        load_with_fallback(_trainer(tmp_path), str(tmp_path),
                           log=lambda t: None)
    with zipfile.ZipFile(str(tmp_path / LATEST)) as z:
        assert 'evil.npy' in z.namelist()       # still there, not loaded
