"""The datasets of an experiment, preprocessed for training and testing.

* ``cifar10`` / ``cifar100``: the paper's Table 1 (§4.1); per-channel
  normalization, and for training the augmentation of He et al. (2016,
  §4.2): 4-pixel padding, random 32x32 crop, random horizontal flip.
* ``digits``: scikit-learn's 8x8 digits upsampled (no download needed): the
  mini reproduction. Normalized only (flipping digits changes their class).
* ``fashion_mnist``: the Debian ``dataset-fashion-mnist`` files when present.
  Normalized only.
"""
import numpy

import chainer

from ada_loss import datasets as D

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


def _subset(dataset, size, seed):
    if size is None or size >= len(dataset):
        return dataset
    order = numpy.random.RandomState(seed).permutation(len(dataset))
    return chainer.datasets.SubDataset(dataset, 0, size, order=order)


def load_datasets(name, data_cfg):
    """``(train, test)`` for dataset ``name`` and the ``data`` config section (any object with its attributes).

    Raises:
        ada_loss.datasets.DatasetNotFoundError: files missing (never
            downloads).
    """
    dataset_info(name)
    if name in ('cifar10', 'cifar100'):
        train, test = D.get_cifar(name, data_cfg.cifar_root)
        mean, std = ((D.CIFAR10_MEAN, D.CIFAR10_STD) if name == 'cifar10'
                     else (D.CIFAR100_MEAN, D.CIFAR100_STD))
        train_tf = (D.cifar_train_transform(mean, std) if data_cfg.augment
                    else D.cifar_test_transform(mean, std))
    else:
        if name == 'digits':
            train, test = D.get_digits(size=data_cfg.digits_size,
                                       seed=data_cfg.split_seed)
        else:
            train, test = D.get_fashion_mnist(data_cfg.fashion_mnist_root)
        mean, std = D.channel_stats(train.images)
        if train.images.dtype != numpy.uint8:
            mean, std = mean * train.scale, std * train.scale
        train_tf = D.cifar_test_transform(mean, std)
    test_tf = D.cifar_test_transform(mean, std)
    seed = data_cfg.split_seed
    train = _subset(train, data_cfg.train_size, seed)
    test = _subset(test, data_cfg.test_size, seed + 1)
    return (D.transform_dataset(train, train_tf),
            D.transform_dataset(test, test_tf))
