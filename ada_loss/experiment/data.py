"""The datasets of an experiment, preprocessed for training and testing.

* ``cifar10`` / ``cifar100``: the paper's Table 1 (§4.1); per-channel
  normalization, and for training the augmentation of He et al. (2016,
  §4.2): 4-pixel padding, random 32x32 crop, random horizontal flip.
* ``digits``: scikit-learn's 8x8 digits upsampled (no download needed): the
  mini reproduction. Normalized only (flipping digits changes their class).
* ``fashion_mnist``: the Debian ``dataset-fashion-mnist`` files when present.
  Normalized only.

The *selection split* (``data.val_size``, issue 47): images of the training
set, never of the test set and never trained on, on which anything a table
tunes is chosen (the depth study's held-out fixed scale), so that the
images a choice is scored on are not the ones it was made on. Drawn from the
training images outside ``data.train_size``'s subset where there are enough
(the training subset is then exactly what it was without a selection
split), otherwise taken out of the training set first.

Nothing is downloaded unless the ``data`` section says ``download: true``
(``--set data.download=true``): then data that is missing is fetched and
verified first (:mod:`ada_loss.datasets.fetch`, from ``data.mirror`` when
set) into the folder it is read from: ``data.cifar_root`` (else
``$ADA_LOSS_CIFAR_ROOT``, else Chainer's dataset root), or
``data.fashion_mnist_root``. Data already there is read as it is.
"""
import os

import numpy

import chainer

from ada_loss import datasets as D
from ada_loss.datasets.cifar import cifar_files
from ada_loss.datasets.digits import digits_files
from ada_loss.datasets.errors import DatasetNotFoundError
from ada_loss.datasets.fashion_mnist import fashion_mnist_files
from ada_loss.experiment import provenance

#: name -> (number of classes, input channels)
DATASETS = {
    'cifar10': (10, 3),
    'cifar100': (100, 3),
    'digits': (10, 1),
    'fashion_mnist': (10, 1),
}


def dataset_info(name):
    """``(num_classes, in_channels)`` of a dataset name."""
    if name not in DATASETS:
        raise ValueError('unknown dataset {!r}; expected one of: {}'.format(
            name, ', '.join(sorted(DATASETS))))
    return DATASETS[name]


def subset_indices(n, size, seed):
    """The indices (into n examples) of the subset of ``size`` that
    ``data.train_size`` / ``data.test_size`` select with ``seed`` (all n
    when size is None or not smaller)."""
    if size is None or size >= n:
        return numpy.arange(n)
    return numpy.random.RandomState(seed).permutation(n)[:size]


#: offset of the selection split's seed from ``data.split_seed`` (the
#: training subset uses the seed itself, the test subset seed + 1)
SELECTION_SEED_OFFSET = 2


def split_indices(n, train_size, val_size, seed):
    """``(train, selection)``: indices into n training examples of the
    training subset and of the selection split (empty without one),
    disjoint. Without a selection split the training subset is
    :func:`subset_indices`'s; with one it still is wherever at least
    ``val_size`` examples lie outside it (the selection split is drawn
    from those), else the selection split is drawn first from all n and
    the training subset from the rest."""
    train = subset_indices(n, train_size, seed)
    if not val_size:
        return train, numpy.arange(0)
    if val_size >= n:
        raise ValueError('data.val_size must be below the {} training '
                         'examples, got {}'.format(n, val_size))
    pick = numpy.random.RandomState(seed + SELECTION_SEED_OFFSET)
    rest = numpy.setdiff1d(numpy.arange(n), train)
    if len(rest) >= val_size:
        return train, rest[pick.permutation(len(rest))[:val_size]]
    val = pick.permutation(n)[:val_size]
    keep = numpy.setdiff1d(numpy.arange(n), val)
    return keep[subset_indices(len(keep), train_size, seed)], val


def _taken(dataset, indices):
    """The examples ``indices`` of ``dataset``, in that order (Chainer's
    SubDataset wants an order over all of it: the rest go after)."""
    rest = numpy.setdiff1d(numpy.arange(len(dataset)), indices)
    return chainer.datasets.SubDataset(
        dataset, 0, len(indices), order=numpy.concatenate([indices, rest]))


def _subset(dataset, size, seed):
    if size is None or size >= len(dataset):
        return dataset
    order = numpy.random.RandomState(seed).permutation(len(dataset))
    return chainer.datasets.SubDataset(dataset, 0, size, order=order)


def _read(name, data_cfg):
    """The dataset's ``(train, test)`` as its loader reads it."""
    if name in ('cifar10', 'cifar100'):
        return D.get_cifar(name, data_cfg.cifar_root)
    if name == 'digits':
        return D.get_digits(size=data_cfg.digits_size,
                            seed=data_cfg.split_seed)
    return D.get_fashion_mnist(data_cfg.fashion_mnist_root)


def _fetched(name, data_cfg):
    """``_read``, fetching the data first when it is missing and the
    section says ``download: true``."""
    try:
        return _read(name, data_cfg)
    except DatasetNotFoundError:
        if not getattr(data_cfg, 'download', False):
            raise
    # imported here: nothing of the fetcher runs unless asked
    from ada_loss.datasets.fetch import fetch
    root = (data_cfg.fashion_mnist_root if name == 'fashion_mnist'
            else data_cfg.cifar_root)
    root = fetch(name, root, mirror=getattr(data_cfg, 'mirror', None),
                 log=lambda text: print('[fetch] ' + text, flush=True))
    if name == 'fashion_mnist':
        return D.get_fashion_mnist(root)
    return D.get_cifar(name, root)


def load_datasets(name, data_cfg, selection=False):
    """``(train, test)`` for dataset ``name`` and the ``data`` config section (any object with its attributes);
    with ``selection``, ``(train, test, selection split)`` (None without
    ``data.val_size``), preprocessed as the test set.

    Raises:
        ada_loss.datasets.DatasetNotFoundError: files missing (and
            ``data_cfg.download`` false or absent).
        ada_loss.datasets.DatasetFetchError: the fetch of missing files
            failed (one-line message; nothing half-written kept).
    """
    dataset_info(name)
    train, test = _fetched(name, data_cfg)
    if name in ('cifar10', 'cifar100'):
        mean, std = ((D.CIFAR10_MEAN, D.CIFAR10_STD) if name == 'cifar10'
                     else (D.CIFAR100_MEAN, D.CIFAR100_STD))
        train_tf = (D.cifar_train_transform(mean, std) if data_cfg.augment
                    else D.cifar_test_transform(mean, std))
    else:
        mean, std = D.channel_stats(train.images)
        if train.images.dtype != numpy.uint8:
            mean, std = mean * train.scale, std * train.scale
        train_tf = D.cifar_test_transform(mean, std)
    test_tf = D.cifar_test_transform(mean, std)
    seed = data_cfg.split_seed
    val_size = getattr(data_cfg, 'val_size', None)
    val = None
    if val_size:
        train_idx, val_idx = split_indices(len(train), data_cfg.train_size,
                                           val_size, seed)
        val, train = _taken(train, val_idx), _taken(train, train_idx)
    else:
        train = _subset(train, data_cfg.train_size, seed)
    test = _subset(test, data_cfg.test_size, seed + 1)
    out = (D.transform_dataset(train, train_tf),
           D.transform_dataset(test, test_tf))
    if selection:
        out += (val if val is None else D.transform_dataset(val, test_tf),)
    return out


def data_files(name, data_cfg):
    """``(roots, files)``: the resolved root of each data setting
    :func:`load_datasets` uses for ``name`` ({setting: absolute path}) and
    the files it reads (absolute paths); reads none of them.

    Raises:
        ada_loss.datasets.DatasetNotFoundError: as :func:`load_datasets`.
    """
    dataset_info(name)
    if name in ('cifar10', 'cifar100'):
        files = cifar_files(name, data_cfg.cifar_root)
        root = files[0] if len(files) == 1 else os.path.dirname(files[0])
        return {'cifar_root': root}, files
    if name == 'digits':
        files = [os.path.realpath(f) for f in digits_files()]
        return {'digits': os.path.dirname(files[0])}, files
    root = os.path.abspath(os.fspath(data_cfg.fashion_mnist_root))
    files = fashion_mnist_files(root)
    if len(files) < 4:
        D.get_fashion_mnist(root)       # raises, naming what is missing
    return {'fashion_mnist_root': root}, files


def data_record(name, data_cfg):
    """What a run on dataset ``name`` records of its data (``run.json``:
    ``data``; :func:`ada_loss.experiment.provenance.data_record`)."""
    return provenance.data_record(*data_files(name, data_cfg))
