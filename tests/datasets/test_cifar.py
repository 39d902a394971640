"""get_cifar on tiny fixtures written in the official CIFAR python format."""
import os
import pickle
import tarfile

import numpy
import pytest

from ada_loss.datasets import DatasetFormatError
from ada_loss.datasets import DatasetNotFoundError
from ada_loss.datasets import get_cifar

TRAIN_ROWS = (7, 7, 7)
TEST_ROWS = 5


def _rows(n, seed):
    return numpy.random.RandomState(seed).randint(
        0, 256, size=(n, 3072)).astype(numpy.uint8)


def _dump(path, obj, bytes_keys):
    if bytes_keys:
        obj = {k.encode('ascii'): v for k, v in obj.items()}
    with open(path, 'wb') as f:
        pickle.dump(obj, f, protocol=2)


def make_cifar10(parent, bytes_keys=False, n_train=TRAIN_ROWS):
    """Writes cifar-10-batches-py/ under ``parent``; returns (folder, truth)."""
    folder = os.path.join(str(parent), 'cifar-10-batches-py')
    os.makedirs(folder)
    truth = {'train': [], 'test': None}
    for i, n in enumerate(n_train, 1):
        data = _rows(n, i)
        labels = [int(v) for v in numpy.arange(n) * i % 10]   # Python list
        _dump(os.path.join(folder, 'data_batch_%d' % i),
              {'batch_label': 'training batch %d' % i, 'data': data,
               'labels': labels}, bytes_keys)
        truth['train'].append((data, labels))
    data, labels = _rows(TEST_ROWS, 99), [9, 0, 3, 3, 1]
    _dump(os.path.join(folder, 'test_batch'),
          {'data': data, 'labels': labels}, bytes_keys)
    truth['test'] = (data, labels)
    names = ['airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog',
             'horse', 'ship', 'truck']
    _dump(os.path.join(folder, 'batches.meta'),
          {'label_names': [n.encode() if bytes_keys else n for n in names],
           'num_cases_per_batch': 7}, bytes_keys)
    return folder, truth


def make_cifar100(parent, bytes_keys=False):
    folder = os.path.join(str(parent), 'cifar-100-python')
    os.makedirs(folder)
    truth = {}
    for split, n, seed in (('train', 11, 1), ('test', 4, 2)):
        fine = numpy.arange(n) * 9 % 100
        coarse = fine // 5
        data = _rows(n, seed)
        _dump(os.path.join(folder, split),
              {'data': data, 'fine_labels': [int(v) for v in fine],
               'coarse_labels': [int(v) for v in coarse]}, bytes_keys)
        truth[split] = (data, fine, coarse)
    _dump(os.path.join(folder, 'meta'),
          {'fine_label_names': ['f%d' % i for i in range(100)],
           'coarse_label_names': ['c%d' % i for i in range(20)]}, bytes_keys)
    return folder, truth


def make_tar(folder, path):
    with tarfile.open(path, 'w:gz') as tar:
        tar.add(folder, arcname=os.path.basename(folder))
    return path


@pytest.mark.parametrize('bytes_keys', [False, True])
def test_cifar10_folder(tmp_path, bytes_keys):
    folder, truth = make_cifar10(tmp_path, bytes_keys)
    train, test = get_cifar('cifar10', folder)
    assert len(train) == sum(TRAIN_ROWS) and len(test) == TEST_ROWS
    assert train.images.shape == (21, 3, 32, 32)
    assert train.images.dtype == numpy.uint8
    assert train.labels.dtype == numpy.int32
    # batches are concatenated in numeric order
    expected = numpy.concatenate([d for d, _ in truth['train']])
    numpy.testing.assert_array_equal(train.images.reshape(21, -1), expected)
    numpy.testing.assert_array_equal(
        train.labels, numpy.concatenate([lab for _, lab in truth['train']]))
    numpy.testing.assert_array_equal(test.labels, truth['test'][1])
    assert train.label_names[0] == 'airplane' and len(train.label_names) == 10

    image, label = test[2]
    assert image.shape == (3, 32, 32) and image.dtype == numpy.float32
    assert label.dtype == numpy.int32 and label == 3
    assert 0 <= image.min() and image.max() <= 1
    row = truth['test'][0][2]
    for c, y, x in [(0, 0, 0), (0, 0, 31), (1, 5, 7), (2, 31, 31), (2, 1, 0)]:
        # channel c is bytes [1024 c, 1024 (c + 1)), row-major within a plane
        assert round(float(image[c, y, x]) * 255) == row[1024 * c + 32 * y + x]
    numpy.testing.assert_allclose(image, row.reshape(3, 32, 32) / 255.0,
                                  rtol=1e-6)


def test_cifar10_counts_batches_numerically(tmp_path):
    sizes = (2,) * 9 + (3, 4)   # data_batch_1 .. data_batch_11
    folder, truth = make_cifar10(tmp_path, n_train=sizes)
    train, _ = get_cifar('cifar10', folder)
    assert len(train) == sum(sizes)
    numpy.testing.assert_array_equal(
        train.images.reshape(len(train), -1),
        numpy.concatenate([d for d, _ in truth['train']]))


def test_cifar10_roots(tmp_path, monkeypatch):
    folder, truth = make_cifar10(tmp_path / 'extracted')
    archive = make_tar(folder, str(tmp_path / 'cifar-10-python.tar.gz'))
    os.makedirs(str(tmp_path / 'only_archive'))
    os.rename(archive, str(tmp_path / 'only_archive' / os.path.basename(
        archive)))
    archive = str(tmp_path / 'only_archive' / 'cifar-10-python.tar.gz')
    roots = [folder, str(tmp_path / 'extracted'), archive,
             str(tmp_path / 'only_archive')]
    for root in roots:
        train, test = get_cifar('cifar10', root)
        assert len(train) == 21 and len(test) == 5, root
        numpy.testing.assert_array_equal(test.images.reshape(5, -1),
                                         truth['test'][0])
    monkeypatch.setenv('ADA_LOSS_CIFAR_ROOT', archive)
    train, test = get_cifar('cifar10')
    assert len(train) == 21 and train.label_names[-1] == 'truck'


@pytest.mark.parametrize('bytes_keys', [False, True])
def test_cifar100(tmp_path, bytes_keys):
    folder, truth = make_cifar100(tmp_path, bytes_keys)
    archive = make_tar(folder, str(tmp_path / 'cifar-100-python.tar.gz'))
    for root in (folder, str(tmp_path), archive):
        train, test = get_cifar('cifar100', root)
        assert train.images.shape == (11, 3, 32, 32) and len(test) == 4
        numpy.testing.assert_array_equal(train.labels, truth['train'][1])
        numpy.testing.assert_array_equal(train.images.reshape(11, -1),
                                         truth['train'][0])
        assert train.label_names[7] == 'f7'
    train, test = get_cifar('cifar100', folder, label='coarse')
    numpy.testing.assert_array_equal(test.labels, truth['test'][2])
    assert len(train.label_names) == 20


def test_missing_data_messages(tmp_path, monkeypatch):
    monkeypatch.delenv('ADA_LOSS_CIFAR_ROOT', raising=False)
    with pytest.raises(FileNotFoundError) as e:
        get_cifar('cifar10')
    msg = str(e.value)
    for part in ('ADA_LOSS_CIFAR_ROOT', 'cifar-10-python.tar.gz',
                 'cifar-10-batches-py', 'data_batch_1', 'test_batch',
                 'https://www.cs.toronto.edu/~kriz/cifar.html'):
        assert part in msg
    with pytest.raises(DatasetNotFoundError, match='does not exist'):
        get_cifar('cifar100', str(tmp_path / 'nope'))
    with pytest.raises(DatasetNotFoundError,
                       match='cifar-100-python.tar.gz') as e:
        get_cifar('cifar100', str(tmp_path))
    assert 'holding train, test' in str(e.value)
    # a CIFAR-10 folder is not CIFAR-100
    folder, _ = make_cifar10(tmp_path)
    with pytest.raises(DatasetNotFoundError, match='cifar-100-python'):
        get_cifar('cifar100', folder)
    os.remove(os.path.join(folder, 'data_batch_2'))
    os.remove(os.path.join(folder, 'test_batch'))
    with pytest.raises(DatasetNotFoundError, match='test_batch'):
        get_cifar('cifar10', folder)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match='cifar10, cifar100'):
        get_cifar('cifar1000', str(tmp_path))
    with pytest.raises(ValueError, match='coarse'):
        get_cifar('cifar10', str(tmp_path), label='coarse')


def test_malformed_files(tmp_path):
    folder, _ = make_cifar10(tmp_path)
    batch = os.path.join(folder, 'data_batch_2')
    with open(batch, 'wb') as f:
        f.write(b'not a pickle at all')
    with pytest.raises(DatasetFormatError, match='data_batch_2'):
        get_cifar('cifar10', folder)

    _dump(batch, {'data': _rows(3, 0)}, bytes_keys=False)
    with pytest.raises(ValueError, match="lacks key.*labels"):
        get_cifar('cifar10', folder)

    _dump(batch, {'data': numpy.zeros((3, 3000), numpy.uint8),
                  'labels': [0, 1, 2]}, bytes_keys=False)
    with pytest.raises(DatasetFormatError, match=r'\(N, 3072\)'):
        get_cifar('cifar10', folder)

    _dump(batch, {'data': _rows(3, 0), 'labels': [0, 1]}, bytes_keys=False)
    with pytest.raises(DatasetFormatError, match='one per row'):
        get_cifar('cifar10', folder)

    # integers NumPy cannot hold in one integer dtype (NumPy 2: float64):
    # the message said "got shape (3,)", the right shape
    _dump(batch, {'data': _rows(3, 0), 'labels': [-1, 2 ** 64 - 1, 0]},
          bytes_keys=False)
    with pytest.raises(DatasetFormatError,
                       match=r'got shape \(3,\) of dtype (float64|object)'):
        get_cifar('cifar10', folder)

    _dump(batch, {'data': _rows(3, 0), 'labels': [0, 1, 10]},
          bytes_keys=False)
    with pytest.raises(DatasetFormatError, match=r'\[0, 10\)'):
        get_cifar('cifar10', folder)

    not_tar = tmp_path / 'cifar-10-python.tar.gz'
    not_tar.write_bytes(b'\x1f\x8b garbage')
    with pytest.raises(DatasetFormatError, match='tar archive'):
        get_cifar('cifar10', str(not_tar))


def test_small_files_cannot_ask_for_large_allocations(tmp_path):
    # issue 50: the batch passes the restricted unpickler (plain bytes, a
    # list), and numpy.asarray of it would allocate rows x the longest text
    # (200,001 x 300,000 bytes = 60 GB) from a 0.7 MB file
    folder, _ = make_cifar10(tmp_path)
    batch = os.path.join(folder, 'data_batch_2')
    texts = [b'x' * 300000] + [b'a'] * 200000
    _dump(batch, {'data': texts, 'labels': [0]}, bytes_keys=False)
    assert os.path.getsize(batch) < 2 ** 20
    with pytest.raises(DatasetFormatError,
                       match="data_batch_2: 'data' is a list, expected"):
        get_cifar('cifar10', folder)

    _dump(batch, {'data': _rows(2, 0), 'labels': [b'x' * 300000, b'a']},
          bytes_keys=False)
    with pytest.raises(DatasetFormatError, match="'labels' must be 2 int"):
        get_cifar('cifar10', folder)
    _dump(batch, {'data': _rows(2, 0), 'labels': [0, 1]}, bytes_keys=False)

    meta = os.path.join(folder, 'batches.meta')
    _dump(meta, {'label_names': [[b'a'] * 10] * 10}, bytes_keys=False)
    with pytest.raises(DatasetFormatError, match="'label_names' must be a "
                       'list of class names'):
        get_cifar('cifar10', folder)


def test_archive_members_are_read_within_a_bound(tmp_path):
    # a tar member declaring 400 MiB (a gzip of zeros that size is 0.4 MB):
    # refused from its header, before anything is inflated or read
    archive = tmp_path / 'cifar-10-python.tar'
    info = tarfile.TarInfo('cifar-10-batches-py/test_batch')
    info.size = 400 * 2 ** 20
    archive.write_bytes(info.tobuf())
    with pytest.raises(DatasetFormatError, match='test_batch is 419430400 '
                       'bytes .at most 402653184 per file'):
        get_cifar('cifar10', str(archive))


@pytest.mark.parametrize('removed', [('data_batch_1',),
                                     ('data_batch_1', 'data_batch_2')])
@pytest.mark.parametrize('as_archive', [False, True])
def test_cifar10_with_a_batch_missing_below_the_highest_is_not_read(
        tmp_path, removed, as_archive):
    """A folder (or archive) holding data_batch_3 but not data_batch_1 is
    what an interrupted extraction leaves, not a smaller CIFAR-10: it was
    read as such without a word; now one line names what it lacks (the
    files a run would record, cifar_files, say the same)."""
    from ada_loss.datasets.cifar import cifar_files
    folder, _ = make_cifar10(tmp_path / 'd')
    for name in removed:
        os.remove(os.path.join(folder, name))
    root = folder
    if as_archive:
        root = str(tmp_path / 'cifar-10-python.tar.gz')
        with tarfile.open(root, 'w:gz') as tar:
            tar.add(folder, arcname='cifar-10-batches-py')
    with pytest.raises(DatasetNotFoundError) as e:
        get_cifar('cifar10', root)
    text = str(e.value)
    assert '\n' not in text
    assert 'lacks {} beside data_batch_3'.format(', '.join(removed)) in text
    if not as_archive:
        with pytest.raises(DatasetNotFoundError, match='lacks ' +
                           ', '.join(removed) + ' beside'):
            cifar_files('cifar10', root)
