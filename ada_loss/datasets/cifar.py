"""CIFAR-10 and CIFAR-100 read from the official "python version" files.

Layout (https://www.cs.toronto.edu/~kriz/cifar.html)::

    cifar-10-python.tar.gz             cifar-100-python.tar.gz
    `-- cifar-10-batches-py/           `-- cifar-100-python/
        |-- data_batch_1 ... _5            |-- train
        |-- test_batch                     |-- test
        `-- batches.meta                   `-- meta

Each data file is a pickle of a dict with ``data``, a ``uint8`` array of shape
``(N, 3072)`` whose rows hold a 32x32 image as 1024 red, then 1024 green, then
1024 blue bytes (row-major within each plane), and the labels: ``labels`` for
CIFAR-10, ``fine_labels`` (100 classes) and ``coarse_labels`` (20
superclasses) for CIFAR-100. The meta files hold the class names. The
official pickles come from Python 2 and are read with ``encoding='latin1'``
(their keys are then ``str``); files re-pickled by Python 3 may have ``bytes``
keys (``b'data'``). Both are accepted. The number of training batches and of
rows per batch is read from the files, not assumed.

The pickles are read by a restricted unpickler
(:mod:`ada_loss.datasets.safe_pickle`): a file that names anything but the
arrays, lists, dicts, text and numbers of this layout is refused unloaded,
so a data file cannot run code.
"""
import os
import posixpath
import re
import tarfile

import numpy

from ada_loss.datasets.errors import DatasetFormatError
from ada_loss.datasets.errors import DatasetNotFoundError
from ada_loss.datasets.errors import one_line
from ada_loss.datasets.image_label_dataset import ImageLabelDataset
from ada_loss.datasets.roots import default_root
from ada_loss.datasets import safe_pickle

#: Environment variable consulted when ``get_cifar`` gets no ``root``.
CIFAR_ROOT_ENV = 'ADA_LOSS_CIFAR_ROOT'

#: Folder under Chainer's dataset root where ``python -m
#: ada_loss.datasets.fetch cifar10`` puts the files when no folder is named
#: (:func:`cifar_default_root`); looked in last.
CIFAR_FOLDER = 'cifar'

CIFAR_URL = 'https://www.cs.toronto.edu/~kriz/cifar.html'

_ROW_BYTES = 3 * 32 * 32
#: the CIFAR files read from one archive, in bytes (the official ones hold
#: 186 MB for CIFAR-10, 193 MB for CIFAR-100)
_MAX_ARCHIVE_BYTES = 2 * safe_pickle.MAX_FILE_BYTES
_TRAIN_BATCH = re.compile(r'^data_batch_(\d+)$')


class _Spec(object):

    def __init__(self, name, title, archive, folder, train, test, meta,
                 labels, names_key):
        self.name = name            # 'cifar10' / 'cifar100'
        self.title = title
        self.archive = archive      # name of the official .tar.gz
        self.folder = folder        # folder the archive extracts to
        self.train = train          # fixed training file name or None (batches)
        self.test = test
        self.meta = meta
        self.labels = labels        # label kind -> (pickle key, n classes)
        self.names_key = names_key  # label kind -> meta key of class names

    def train_files(self, names):
        if self.train is not None:
            return [self.train] if self.train in names else []
        batches = [(int(m.group(1)), n) for n in names
                   for m in [_TRAIN_BATCH.match(n)] if m]
        return [n for _, n in sorted(batches)]

    def gaps(self, names):
        """The training batches missing below the highest one of ``names``
        (``data_batch_1 .. data_batch_k`` with none skipped; [] for
        CIFAR-100's single file). An interrupted ``tar -x`` of the
        publisher's archive, whose members come ``data_batch_4``,
        ``readme.html``, ``test_batch``, ``data_batch_3``, ...,
        ``data_batch_1``, leaves a folder holding the test batch and never
        ``data_batch_1``: read as it is, it would train on a fifth of the
        set without a word."""
        if self.train is not None:
            return []
        have = {int(_TRAIN_BATCH.match(n).group(1))
                for n in self.train_files(names)}
        return ['data_batch_%d' % i for i in range(1, max(have, default=0))
                if i not in have]

    def check_complete(self, names, location):
        """Raises DatasetNotFoundError naming what ``location`` lacks: a
        training file, the test file, or a batch below the highest."""
        if not self.train_files(names) or self.test not in names:
            raise DatasetNotFoundError(_not_found(
                self, '{} lacks the training or test file (found: {})'
                .format(location, ', '.join(sorted(names)) or 'nothing')))
        gaps = self.gaps(names)
        if gaps:
            raise DatasetNotFoundError(_not_found(
                self, '{} lacks {} beside {} (a half-done extraction?)'
                .format(location, ', '.join(gaps),
                        self.train_files(names)[-1])))

    def wanted(self, name):
        return (name in (self.train, self.test, self.meta)
                or (self.train is None and bool(_TRAIN_BATCH.match(name))))

    def layout(self):
        train = self.train or 'data_batch_1, data_batch_2, ...'
        return ('{} (or its extracted folder {}/ holding {}, {} and '
                'optionally {})'.format(self.archive, self.folder, train,
                                        self.test, self.meta))


def cifar_default_root():
    """``<Chainer's dataset root>/ada_loss/cifar``: where a fetch with no
    folder named puts CIFAR-10 and CIFAR-100, and where :func:`get_cifar`
    looks when given no ``root`` and ``$ADA_LOSS_CIFAR_ROOT`` is unset."""
    return default_root(CIFAR_FOLDER)


def cifar_layout(name):
    """``(archive, folder, test file)`` of ``'cifar10'`` or ``'cifar100'``:
    the official archive's name, the folder it extracts to and the file
    whose presence marks that folder as read by :func:`get_cifar`."""
    spec = _SPECS[name]
    return spec.archive, spec.folder, spec.test


_SPECS = {
    'cifar10': _Spec('cifar10', 'CIFAR-10', 'cifar-10-python.tar.gz',
                     'cifar-10-batches-py', None, 'test_batch',
                     'batches.meta', {'fine': ('labels', 10)},
                     {'fine': 'label_names'}),
    'cifar100': _Spec('cifar100', 'CIFAR-100', 'cifar-100-python.tar.gz',
                      'cifar-100-python', 'train', 'test', 'meta',
                      {'fine': ('fine_labels', 100),
                       'coarse': ('coarse_labels', 20)},
                      {'fine': 'fine_label_names',
                       'coarse': 'coarse_label_names'}),
}


def get_cifar(name, root=None, label='fine'):
    """Loads CIFAR-10 or CIFAR-100 from local files.

    Args:
        name (str): ``'cifar10'`` or ``'cifar100'``.
        root (str or os.PathLike): any of

            * the archive itself (``cifar-10-python.tar.gz`` /
              ``cifar-100-python.tar.gz``; read in place, not extracted),
            * the extracted folder (``cifar-10-batches-py/`` /
              ``cifar-100-python/``),
            * a folder containing the archive or the extracted folder.

            If ``None``, the environment variable ``ADA_LOSS_CIFAR_ROOT`` is
            used, else the folder a fetch with no folder named fills
            (:func:`cifar_default_root`) when it exists.
        label (str): ``'fine'`` (default; the only kind CIFAR-10 has) or
            ``'coarse'`` (the 20 CIFAR-100 superclasses).

    Returns:
        tuple: ``(train, test)``, two :class:`ImageLabelDataset` whose examples
        are ``(image, label)``: a ``float32`` ``(3, 32, 32)`` RGB image in
        [0, 1] and an ``int32`` label. ``.images`` holds the ``uint8``
        ``(N, 3, 32, 32)`` array, ``.labels`` the ``int32`` labels and
        ``.label_names`` the class names (``None`` without a meta file).

    Raises:
        DatasetNotFoundError: (a ``FileNotFoundError``) no data at ``root``.
        DatasetFormatError: (a ``ValueError``) a file is not a valid CIFAR
            file.
    """
    if name not in _SPECS:
        raise ValueError('unknown CIFAR dataset {!r}; expected one of {}'
                         .format(name, ', '.join(sorted(_SPECS))))
    spec = _SPECS[name]
    if label not in spec.labels:
        raise ValueError('{} has no {!r} labels; expected one of {}'.format(
            spec.title, label, ', '.join(sorted(spec.labels))))
    files = _find_files(spec, root)
    label_key, n_classes = spec.labels[label]
    spec.check_complete(files.names, files.location)
    train_names = spec.train_files(files.names)

    def load(names):
        parts = [_parse_batch(files.load(n), label_key, n_classes,
                              files.where(n)) for n in names]
        return (numpy.concatenate([p[0] for p in parts]),
                numpy.concatenate([p[1] for p in parts]))

    label_names = None
    if spec.meta in files.names:
        label_names = _parse_label_names(
            files.load(spec.meta), spec.names_key[label],
            files.where(spec.meta))
    return tuple(ImageLabelDataset(images, labels, scale=1.0 / 255,
                                   label_names=label_names)
                 for images, labels in (load(train_names), load([spec.test])))


def _not_found(spec, reason):
    # one line: the command line prints it as its one ``error:`` line
    return ('{} not found: {}. Expected {}, given as `root` (the config key '
            'data.cifar_root) or through the environment variable {}; `root` '
            'may also be a folder containing either. Fetch it with `python -m '
            'ada_loss.datasets.fetch {} [--root DIR]` (or `--set '
            'data.download=true` on an entry), or download {} ("{} python '
            'version") from {} yourself; this loader never downloads.'.format(
                spec.title, reason, spec.layout(), CIFAR_ROOT_ENV, spec.name,
                spec.archive, spec.title, CIFAR_URL))


class _Files(object):
    """The CIFAR files of one folder, on disk or inside an archive."""

    def __init__(self, location, contents):
        self.location = location
        self._contents = contents   # base name -> path on disk or bytes
        self.names = set(contents)

    def where(self, name):
        item = self._contents[name]
        return item if isinstance(item, str) else '{} in {}'.format(
            name, self.location)

    def load(self, name):
        item = self._contents[name]
        try:
            if isinstance(item, str):
                with open(item, 'rb') as f:
                    return safe_pickle.load(f)
            return safe_pickle.loads(item)
        except DatasetFormatError as e:     # no code of it ran
            raise type(e)('{} is not a CIFAR pickle: it {}'.format(
                self.where(name), e) if isinstance(
                    e, safe_pickle.UnsafePickleError) else
                '{} is {}'.format(self.where(name), e)) from e


def _find_files(spec, root):
    kind, path = _resolve(spec, root)
    return (_archive_files if kind == 'archive' else _folder_files)(spec,
                                                                    path)


def _resolve(spec, root):
    """``('archive' | 'folder', path)``: where ``root`` (or the environment
    variable) leads."""
    if root is None:
        root = os.environ.get(CIFAR_ROOT_ENV)
        if not root and os.path.isdir(cifar_default_root()):
            root = cifar_default_root()
        if not root:
            raise DatasetNotFoundError(_not_found(
                spec, 'no `root` was given, {} is not set and {} does not '
                'exist'.format(CIFAR_ROOT_ENV, cifar_default_root())))
    root = os.path.expanduser(os.fspath(root))
    if os.path.isfile(root):
        return 'archive', root
    if not os.path.isdir(root):
        raise DatasetNotFoundError(_not_found(
            spec, '{} does not exist'.format(root)))
    if os.path.isfile(os.path.join(root, spec.test)):
        return 'folder', root
    if os.path.isdir(os.path.join(root, spec.folder)):
        return 'folder', os.path.join(root, spec.folder)
    if os.path.isfile(os.path.join(root, spec.archive)):
        return 'archive', os.path.join(root, spec.archive)
    raise DatasetNotFoundError(_not_found(spec, 'nothing usable in {}'.format(
        root)))


def cifar_files(name, root=None):
    """The files :func:`get_cifar` reads for ``name`` and ``root`` (None:
    ``$ADA_LOSS_CIFAR_ROOT``), as absolute paths, sorted: the archive, or
    the extracted folder's batches, test and meta files. Reads none of
    them (what a run records of its data: ``ada_loss.experiment``).

    Raises:
        DatasetNotFoundError: as :func:`get_cifar`.
    """
    if name not in _SPECS:
        raise ValueError('unknown CIFAR dataset {!r}; expected one of {}'
                         .format(name, ', '.join(sorted(_SPECS))))
    spec = _SPECS[name]
    kind, path = _resolve(spec, root)
    if kind == 'archive':
        return [os.path.abspath(path)]
    names = [n for n in os.listdir(path) if spec.wanted(n)]
    spec.check_complete(names, path)
    return sorted(os.path.abspath(os.path.join(path, n)) for n in names)


def _folder_files(spec, folder):
    return _Files(folder, {n: os.path.join(folder, n)
                           for n in os.listdir(folder) if spec.wanted(n)})


def _archive_files(spec, path):
    """Reads the wanted members of a tar archive in one pass, in memory."""
    by_folder = {}
    total = 0
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                name = posixpath.basename(member.name)
                if member.isfile() and spec.wanted(name):
                    # a compressed archive inflates at will: no member
                    # larger than safe_pickle reads from a file, and no
                    # more than the largest official archive holds, twice
                    total += member.size
                    if (member.size > safe_pickle.MAX_FILE_BYTES
                            or total > _MAX_ARCHIVE_BYTES):
                        raise DatasetFormatError(
                            '{}: {} is {} bytes (at most {} per file and {} '
                            'in all are read)'.format(
                                path, member.name, member.size,
                                safe_pickle.MAX_FILE_BYTES,
                                _MAX_ARCHIVE_BYTES))
                    folder = posixpath.dirname(member.name)
                    data = tar.extractfile(member).read()
                    by_folder.setdefault(folder, {})[name] = data
    except (tarfile.TarError, EOFError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise DatasetFormatError('{} is not a readable tar archive ({}); '
                                 'expected {}'.format(path, one_line(e),
                                                      spec.layout())) from e
    folders = sorted((f for f in by_folder if spec.test in by_folder[f]),
                     key=lambda f: posixpath.basename(f) != spec.folder)
    if not folders:
        raise DatasetNotFoundError(_not_found(
            spec, 'the archive {} holds no {} file'.format(path, spec.test)))
    folder = folders[0]
    return _Files('{}:{}'.format(path, folder), by_folder[folder])


def _str_keys(obj, where):
    if not isinstance(obj, dict):
        raise DatasetFormatError('{} holds a {}, expected a dict'.format(
            where, type(obj).__name__))
    return {k.decode('latin1') if isinstance(k, bytes) else k: v
            for k, v in obj.items()}


def _parse_batch(obj, label_key, n_classes, where):
    batch = _str_keys(obj, where)
    missing = [k for k in ('data', label_key) if k not in batch]
    if missing:
        raise DatasetFormatError('{} lacks key(s) {}; it has {}'.format(
            where, ', '.join(missing), ', '.join(sorted(map(str, batch)))))
    data = batch['data']
    if not isinstance(data, numpy.ndarray):
        # numpy.asarray of a list of texts would allocate rows x the longest
        # text: a small file could ask for terabytes
        raise DatasetFormatError("{}: 'data' is a {}, expected a uint8 array "
                                 "of shape (N, {})".format(
                                     where, type(data).__name__, _ROW_BYTES))
    if data.ndim != 2 or data.shape[1] != _ROW_BYTES:
        raise DatasetFormatError(
            "{}: 'data' has shape {}, expected (N, {}) (rows of 1024 R, 1024 "
            "G, 1024 B bytes)".format(where, data.shape, _ROW_BYTES))
    if data.dtype != numpy.uint8:
        if (data.dtype.kind not in 'iu'
                or (data.size and (data.min() < 0 or data.max() > 255))):
            raise DatasetFormatError("{}: 'data' must hold bytes 0..255, got "
                                     "dtype {}".format(where, data.dtype))
        data = data.astype(numpy.uint8)
    labels = batch[label_key]
    if not isinstance(labels, numpy.ndarray) and not (
            isinstance(labels, (list, tuple)) and all(
                isinstance(v, (int, numpy.integer)) for v in labels)):
        raise DatasetFormatError('{}: {!r} must be {} integers (one per row), '
                                 'got a {} holding other values'.format(
                                     where, label_key, len(data),
                                     type(labels).__name__))
    labels = numpy.asarray(labels)
    if labels.shape != (len(data),) or (labels.size
                                        and labels.dtype.kind not in 'iu'):
        raise DatasetFormatError('{}: {!r} must be {} integers (one per row), '
                                 'got shape {} of dtype {}'.format(
                                     where, label_key, len(data),
                                     labels.shape, labels.dtype))
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise DatasetFormatError('{}: {!r} must lie in [0, {}), got [{}, {}]'
                                 .format(where, label_key, n_classes,
                                         labels.min(), labels.max()))
    return (data.reshape(-1, 3, 32, 32),
            labels.astype(numpy.int32).reshape(-1))


def _parse_label_names(obj, key, where):
    meta = _str_keys(obj, where)
    if key not in meta:
        raise DatasetFormatError('{} lacks key {!r}; it has {}'.format(
            where, key, ', '.join(sorted(map(str, meta)))))
    names = meta[key]
    if not isinstance(names, (list, tuple)) or not all(
            isinstance(n, (str, bytes)) for n in names):
        raise DatasetFormatError('{}: {!r} must be a list of class names '
                                 '(text)'.format(where, key))
    return [n.decode('latin1') if isinstance(n, bytes) else n for n in names]
