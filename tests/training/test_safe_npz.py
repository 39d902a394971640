"""ada_loss.training.safe_npz (issue 50 item 5): ``.npz`` weights and
trainer snapshots whose arrays are pickled objects run no code, and the
error names the file and the key; legitimate files load as with
Chainer's ``load_npz``; a key, shape or dtype that does not fit is one
error naming the file and the key."""
import io
import os
import zipfile

import chainer
import chainer.links as L
import numpy
import pytest
from chainer import training

from ada_loss.scaling import make_loss_scaling
from ada_loss.training import MixedPrecisionUpdater
from ada_loss.training.safe_npz import (
    NpzMismatchError, UnsafeNpzError, load_npz, open_npz)
from ada_loss.training.snapshot import (
    LATEST, PREVIOUS, load_with_fallback, write_snapshot)

from npz_payloads import write_hostile


def _model(seed=0):
    numpy.random.seed(seed)
    return chainer.Sequential(L.Linear(3, 4), L.BatchNormalization(4))


def _arrays(obj):
    saver = chainer.serializers.DictionarySerializer()
    saver.save(obj)
    return {k: numpy.array(v) for k, v in saver.target.items()}


def _save(path, arrays):
    with open(str(path), 'wb') as f:
        numpy.savez(f, **arrays)
    return str(path)


def test_round_trip_as_chainer(tmp_path):
    src = _model(0)
    src[1].avg_mean[...] = 3.0
    src[1].N = 7
    path = str(tmp_path / 'm.npz')
    chainer.serializers.save_npz(path, src)
    ours, theirs = _model(1), _model(1)
    load_npz(path, ours)
    chainer.serializers.load_npz(path, theirs)
    a, b, c = _arrays(ours), _arrays(theirs), _arrays(src)
    assert sorted(a) == sorted(b) == sorted(c)
    for k in c:
        assert a[k].tobytes() == b[k].tobytes() == c[k].tobytes(), k
    assert ours[1].N == 7
    with open(path, 'rb') as f:             # a file object too
        load_npz(f, _model(2))


def test_hostile_file_runs_no_code(tmp_path):
    marker = tmp_path / 'ran'
    path = write_hostile(tmp_path / 'm.npz', _arrays(_model()), '0/W',
                         marker)
    model = _model(1)
    before = _arrays(model)
    with pytest.raises(UnsafeNpzError) as e:
        load_npz(path, model)
    assert not marker.exists()
    assert str(e.value).startswith(path + ': 0/W holds pickled')
    assert '\n' not in str(e.value)
    after = _arrays(model)
    assert all(after[k].tobytes() == before[k].tobytes() for k in before)
    with pytest.raises(UnsafeNpzError):
        with open_npz(path) as npz:
            npz.files
    assert not marker.exists()


def test_object_member_the_header_check_skips_is_still_refused(
        tmp_path, monkeypatch):
    """If the header check missed a member (a header it cannot parse),
    NumPy's own refusal (allow_pickle=False) is the same error."""
    from ada_loss.training import safe_npz
    marker = tmp_path / 'ran'
    path = write_hostile(tmp_path / 'm.npz', _arrays(_model()), '0/W',
                         marker)
    monkeypatch.setattr(safe_npz, 'check_members', lambda file: None)
    with pytest.raises(UnsafeNpzError) as e:
        load_npz(path, _model(1))
    assert not marker.exists() and path in str(e.value)


@pytest.mark.parametrize('change, expect', [
    ('drop', '{}: lacks 0/b (the Sequential holds it)'),
    ('shape', '{}: 0/W is float32 of shape (1, 3), expected float32 of '
     'shape (4, 3)'),
    ('scalar', '{}: 1/N is int64 of shape (2,), expected a scalar (int)'),
    ('text', '{}: 0/W is <U1 of shape (), expected float32 of shape '
     '(4, 3)'),
    ('extra', '{}: holds 2/W that the Sequential does not (1 such key)')])
def test_mismatch_is_one_error_naming_file_and_key(tmp_path, change,
                                                   expect):
    arrays = _arrays(_model())
    if change == 'drop':
        del arrays['0/b']
    elif change == 'shape':
        arrays['0/W'] = arrays['0/W'][:1]
    elif change == 'scalar':
        arrays['1/N'] = numpy.zeros(2, numpy.int64)
    elif change == 'text':
        arrays['0/W'] = numpy.array('x')
    else:
        arrays['2/W'] = numpy.zeros(3, numpy.float32)
    path = _save(tmp_path / 'm.npz', arrays)
    model = _model(1)
    w = model[0].W.array.copy()
    with pytest.raises(NpzMismatchError) as e:
        load_npz(path, model)
    assert str(e.value) == expect.format(path)
    assert model[0].W.array.tobytes() == w.tobytes()   # nothing copied in


def test_partial_load_and_path(tmp_path):
    """strict=False keeps what the file lacks; ``path`` selects a prefix
    (a model inside a trainer snapshot); a file matching nothing is an
    error."""
    src = _arrays(_model(0))
    path = _save(tmp_path / 'm.npz', {'pre/' + k: v for k, v in src.items()
                                      if k.startswith('0/')})
    model = _model(1)
    bn = _arrays(model)['1/gamma']
    load_npz(path, model, path='pre/', strict=False)
    got = _arrays(model)
    assert got['0/W'].tobytes() == src['0/W'].tobytes()
    assert got['1/gamma'].tobytes() == bn.tobytes()
    with pytest.raises(NpzMismatchError, match='lacks pre/1/'):
        load_npz(path, _model(1), path='pre/')
    with pytest.raises(NpzMismatchError, match='none of its keys under '
                                               'other/'):
        load_npz(path, _model(1), path='other/', strict=False)


# -- the trainer snapshot's path (ada_loss.training.snapshot) ---------------
def _trainer(out):
    rng = numpy.random.RandomState(0)
    x = rng.uniform(-1, 1, (6, 3)).astype(numpy.float32)
    t = rng.randint(0, 2, 6).astype(numpy.int32)
    it = chainer.iterators.SerialIterator(
        chainer.datasets.TupleDataset(x, t), 2, shuffle=False)
    model = L.Classifier(L.Linear(3, 2, initialW=numpy.full(
        (2, 3), 0.1, numpy.float32)))
    opt = chainer.optimizers.MomentumSGD(0.01)
    opt.setup(model)
    up = MixedPrecisionUpdater(it, opt, make_loss_scaling('dynamic'),
                               mode='dynamic')
    return training.Trainer(up, (3, 'iteration'), out=str(out))


@pytest.mark.parametrize('which', [LATEST, PREVIOUS])
def test_hostile_snapshot_stops_the_resume(tmp_path, which):
    """A snapshot holding a pickled object is not a damaged one to skip
    (which would start afresh over it): the resume stops with the file
    named, runs no code, and leaves both files as they are. (The previous
    snapshot is read when the latest is damaged: truncated here.)"""
    first = _trainer(tmp_path)
    first.run()
    write_snapshot(first, str(tmp_path))
    write_snapshot(first, str(tmp_path))
    path = os.path.join(str(tmp_path), which)
    with open(path, 'rb') as f, numpy.load(io.BytesIO(f.read())) as npz:
        arrays = {k: npz[k] for k in npz.files}
    marker = tmp_path / 'ran'
    write_hostile(path, arrays, 'updater/model:main/predictor/W', marker)
    if which == PREVIOUS:
        latest = os.path.join(str(tmp_path), LATEST)
        with open(latest, 'r+b') as f:
            f.truncate(os.path.getsize(latest) // 2)
    kept = {n: open(os.path.join(str(tmp_path), n), 'rb').read()
            for n in (LATEST, PREVIOUS)}
    other = _trainer(tmp_path)
    try:
        load_with_fallback(other, str(tmp_path), log=lambda text: None)
        error = None
    except UnsafeNpzError as e:
        error = str(e)
    assert not marker.exists(), 'the resume ran the code'
    assert error is not None, 'the hostile snapshot was skipped'
    assert error.startswith(path + ': updater/model:main/predictor/W')
    for n, data in kept.items():
        with open(os.path.join(str(tmp_path), n), 'rb') as f:
            assert f.read() == data, n


def test_a_member_of_another_shape_is_refused_from_its_header(tmp_path):
    """The header is checked before the data are read: a member declaring
    10^9 floats (4 GB once decompressed; here its data are cut to 8 bytes,
    which reading would fail on differently) is refused by its shape."""
    from numpy.lib import format as npy_format
    arrays = _arrays(_model())
    path = str(tmp_path / 'm.npz')
    with zipfile.ZipFile(path, 'w') as z:
        for k, v in arrays.items():
            if k != '0/W':
                with z.open(k + '.npy', 'w') as f:
                    numpy.lib.format.write_array(f, v)
        with z.open('0/W.npy', 'w') as f:
            npy_format.write_array_header_1_0(f, {
                'descr': '<f4', 'fortran_order': False,
                'shape': (10 ** 9,)})
            f.write(b'\0' * 8)
    with pytest.raises(NpzMismatchError) as e:
        load_npz(path, _model(1))
    assert str(e.value) == '{}: 0/W is float32 of shape (1000000000,), ' \
        'expected float32 of shape (4, 3)'.format(path)


@pytest.mark.parametrize('member', ['1/N.npy', '1/N'])
def test_a_scalar_key_holding_an_array_is_refused_from_its_header(
        tmp_path, member):
    """A scalar the target holds (BatchNormalization's ``N``) is checked
    from its header as arrays are: a member there declaring 10^9 bytes
    (1 GB once decompressed; its data cut to 8 bytes here, which reading
    would fail on differently) is refused by its shape before its data
    are read -- also under the member name without ``.npy``, which NumPy
    reads as an array just the same."""
    from numpy.lib import format as npy_format
    arrays = _arrays(_model())
    path = str(tmp_path / 'm.npz')
    with zipfile.ZipFile(path, 'w') as z:
        for k, v in arrays.items():
            if k != '1/N':
                with z.open(k + '.npy', 'w') as f:
                    numpy.lib.format.write_array(f, v)
        with z.open(member, 'w') as f:
            npy_format.write_array_header_1_0(f, {
                'descr': '|u1', 'fortran_order': False,
                'shape': (10 ** 9,)})
            f.write(b'\0' * 8)
    with pytest.raises(NpzMismatchError) as e:
        load_npz(path, _model(1))
    assert str(e.value) == '{}: 1/N is uint8 of shape (1000000000,), ' \
        'expected a scalar (int)'.format(path)


def test_a_member_that_is_no_array_is_refused_before_it_is_read(tmp_path):
    """A member that is not a ``.npy`` (NumPy's NpzFile gives its bytes,
    decompressed whole) is refused by its name, unread: a 64 MiB member
    compressed to 64 KiB allocates nothing of its size."""
    import tracemalloc
    arrays = _arrays(_model())
    path = str(tmp_path / 'm.npz')
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as z:
        for k, v in arrays.items():
            if k != '0/W':
                with z.open(k + '.npy', 'w') as f:
                    numpy.lib.format.write_array(f, v)
        z.writestr('0/W', b'\0' * (64 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError) as e:
            load_npz(path, _model(1))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value) == '{}: 0/W is not a NumPy array'.format(path)
    assert peak < 16 << 20, peak


def _snapshot_with(path, member, data, **kw):
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as z:
        with z.open('updater/iteration.npy', 'w') as f:
            numpy.lib.format.write_array(f, numpy.array(3))
        with z.open(member, 'w', **kw) as f:
            f.write(data)
    return path


def test_checking_a_snapshot_holds_no_whole_array(tmp_path):
    """check_snapshot reads every member for its CRC before the dry run:
    it read each into an array, so a 64 MiB member of zeros (64 KiB in the
    file) cost 64 MiB before its shape was ever compared; now it is
    streamed, a chunk at a time."""
    import tracemalloc
    from ada_loss.training.snapshot import check_snapshot
    buf = io.BytesIO()
    numpy.lib.format.write_array(buf, numpy.zeros(64 << 20, numpy.uint8))
    path = _snapshot_with(str(tmp_path / 'snapshot_latest'),
                          'updater/model:main/predictor/W.npy',
                          buf.getvalue())
    assert os.path.getsize(path) < 1 << 20
    tracemalloc.start()
    try:
        assert check_snapshot(path) is None     # intact; its shape is
        peak = tracemalloc.get_traced_memory()[1]   # the dry run's matter
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def test_a_snapshot_member_shorter_than_its_header_is_damaged(tmp_path):
    from numpy.lib import format as npy_format
    from ada_loss.training.snapshot import check_snapshot
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {
        'descr': '<f4', 'fortran_order': False, 'shape': (10 ** 6,)})
    path = _snapshot_with(str(tmp_path / 'snapshot_latest'), 'x/W.npy',
                          buf.getvalue() + b'\0' * 8)
    problem = check_snapshot(path)
    assert problem is not None and 'x/W' in problem and '\n' not in problem
