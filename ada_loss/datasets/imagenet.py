"""ILSVRC2012 (ImageNet-1k) from its standard local layout (paper §4.2).

Nothing is downloaded. ``root`` must hold::

    root/train/<wnid>/*.JPEG        one folder per class (1000 for ILSVRC2012)
    root/val/<wnid>/*.JPEG          validation images sorted into class folders
      -- or --
    root/val/*.JPEG                 the 50000 flat validation images, plus a
    root/val.txt (or val/val.txt,   labels file: "<file name> <label>", e.g.
     LOC_val_solution.csv)          "ILSVRC2012_val_00000001.JPEG 65" (0-based
                                    index into the sorted wnids) or
                                    "ILSVRC2012_val_00000001.JPEG n01751748";
                                    Kaggle's LOC_val_solution.csv is read too

Class indices are the positions of the wnids in the *sorted* list of
``train/`` folders (ChainerCV's :class:`DirectoryParsingLabelDataset` order),
which is also the order of Caffe's ``val.txt``. Examples are ``(image,
label)``: a ``float32`` RGB ``CHW`` image in [0, 255] and an ``int32`` label;
:class:`ImageNetTrainTransform` / :class:`ImageNetEvalTransform` turn them into
network inputs (He et al. 2016 preprocessing as in torchvision/ChainerCV's
ImageNet examples).
"""
import csv
import os

import chainer
from chainercv import transforms
import numpy
from chainercv.datasets import DirectoryParsingLabelDataset
from chainercv.datasets import directory_parsing_label_names
from chainercv.utils import read_image

from ada_loss.datasets.errors import DatasetFormatError
from ada_loss.datasets.errors import DatasetNotFoundError

#: Per-channel (R, G, B) mean and std of ImageNet, in the [0, 255] scale.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)

#: Names of the labels file of a flat ``val/`` folder, searched in order in
#: ``root`` then ``root/val``.
VAL_LABEL_FILES = ('val.txt', 'val_labels.txt', 'LOC_val_solution.csv')

IMAGE_EXTENSIONS = ('.jpeg', '.jpg', '.png')

#: Environment variable naming ``root`` when none is passed.
IMAGENET_ROOT_ENV = 'ADA_LOSS_IMAGENET_ROOT'

_LAYOUT = (
    'expected the ILSVRC2012 layout: {root}/train/<wnid>/*.JPEG and either '
    '{root}/val/<wnid>/*.JPEG or flat {root}/val/*.JPEG with a labels file '
    '({files}) whose lines read "ILSVRC2012_val_00000001.JPEG 65" (0-based '
    'class index) or "... n01751748" (wnid). The data is not downloadable '
    'here (its licence): obtain ILSVRC2012 from image-net.org and extract it '
    'locally; `python -m ada_loss.datasets.fetch imagenet` prints the exact '
    'steps.')


def _not_found(root, problem):
    return DatasetNotFoundError('ImageNet: {}; {}'.format(
        problem, _LAYOUT.format(root=root, files=', '.join(VAL_LABEL_FILES))))


def _subdirs(path):
    return sorted(d for d in os.listdir(path)
                  if os.path.isdir(os.path.join(path, d)))


def imagenet_label_names(root):
    """Sorted wnids of ``root/train`` (the class index order)."""
    train = os.path.join(root, 'train')
    if not os.path.isdir(train):
        raise _not_found(root, '{} does not exist'.format(train))
    names = directory_parsing_label_names(train)
    if not names:
        raise _not_found(root, '{} has no class folders'.format(train))
    return names


class FlatImageLabelDataset(chainer.dataset.DatasetMixin):
    """Images listed with their labels: ``(RGB float32 CHW, int32)``."""

    def __init__(self, img_paths, labels):
        self.img_paths = list(img_paths)
        self.labels = numpy.asarray(labels, numpy.int32)

    def __len__(self):
        return len(self.img_paths)

    def get_example(self, i):
        return read_image(self.img_paths[i], color=True), self.labels[i]


def _find_label_file(root):
    for folder in (root, os.path.join(root, 'val')):
        for name in VAL_LABEL_FILES:
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                return path
    return None


def read_val_labels(path, label_names=None):
    """{image file name: class index} from a validation labels file.

    Text files have one ``"<file name> <label>"`` per line, the label a
    0-based index or a wnid; a ``.csv`` (LOC_val_solution.csv) has columns
    ``ImageId,PredictionString`` whose first token is the wnid.
    """
    index = {n: i for i, n in enumerate(label_names or ())}

    def label_of(token, where):
        token = token.strip()
        if token.lstrip('-').isdecimal():     # isdigit() admits '²'
            value = int(token)
            if label_names and not 0 <= value < len(label_names):
                raise DatasetFormatError('{}: class index {} out of range '
                                         '[0, {})'.format(where, value,
                                                          len(label_names)))
            return value
        if token not in index:
            raise DatasetFormatError(
                '{}: label {!r} is neither an integer nor a wnid of train/'
                .format(where, token))
        return index[token]

    try:
        return _read_val_labels(path, label_of)
    except UnicodeDecodeError as e:
        raise DatasetFormatError('{}: not UTF-8 text (byte {} at offset {}); '
                                 'expected lines "<file name> <label>"'
                                 .format(path, e.object[e.start:e.start + 1],
                                         e.start)) from e
    except csv.Error as e:
        raise DatasetFormatError('{}: not a readable CSV file ({}); expected '
                                 'columns ImageId,PredictionString'.format(
                                     path, e)) from e


def _read_val_labels(path, label_of):
    labels = {}
    if path.lower().endswith('.csv'):
        with open(path, newline='', encoding='utf-8') as f:
            reader = csv.DictReader(f)
            if not {'ImageId', 'PredictionString'} <= set(
                    reader.fieldnames or ()):
                raise DatasetFormatError(
                    '{}: expected columns ImageId,PredictionString'.format(
                        path))
            for n, row in enumerate(reader, 2):
                # a short row holds None in its missing columns
                pred = (row['PredictionString'] or '').split()
                if not pred or not row['ImageId']:
                    raise DatasetFormatError('{}:{}: empty ImageId or '
                                             'PredictionString'.format(path,
                                                                       n))
                labels[row['ImageId']] = label_of(
                    pred[0], '{}:{}'.format(path, n))
        return {_stem(k): v for k, v in labels.items()}
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                raise DatasetFormatError(
                    '{}:{}: expected "<file name> <label>", got {!r}'.format(
                        path, n, line.rstrip('\n')))
            labels[_stem(parts[0])] = label_of(parts[1],
                                               '{}:{}'.format(path, n))
    return labels


def _stem(name):
    return os.path.splitext(os.path.basename(name))[0]


def _val_dataset(root, label_names):
    val = os.path.join(root, 'val')
    if not os.path.isdir(val):
        raise _not_found(root, '{} does not exist'.format(val))
    class_dirs = _subdirs(val)
    if class_dirs:
        unknown = sorted(set(class_dirs) - set(label_names))
        if unknown:
            raise DatasetFormatError(
                'ImageNet: {} has class folders not in train/: {}'.format(
                    val, ', '.join(unknown[:5])))
        dataset = DirectoryParsingLabelDataset(val)
        # Re-index from val's own folder order to train's wnid order.
        remap = numpy.array([label_names.index(d) for d in class_dirs],
                            numpy.int32)
        dataset.labels = remap[dataset.labels]
        return dataset
    files = sorted(f for f in os.listdir(val)
                   if f.lower().endswith(IMAGE_EXTENSIONS))
    if not files:
        raise _not_found(root, '{} holds neither class folders nor images'
                         .format(val))
    label_file = _find_label_file(root)
    if label_file is None:
        raise _not_found(root, 'flat {} has no labels file'.format(val))
    labels = read_val_labels(label_file, label_names)
    missing = [f for f in files if _stem(f) not in labels]
    if missing:
        raise DatasetFormatError(
            'ImageNet: {} lacks labels for {} of {} images (e.g. {})'.format(
                label_file, len(missing), len(files), missing[0]))
    return FlatImageLabelDataset([os.path.join(val, f) for f in files],
                                 [labels[_stem(f)] for f in files])


def get_imagenet(root=None, split='train'):
    """The raw ILSVRC2012 ``split`` ('train' or 'val') under ``root`` (or
    ``$ADA_LOSS_IMAGENET_ROOT``).

    Returns:
        A dataset of ``(image, label)``: RGB ``float32`` ``CHW`` in [0, 255]
        and ``int32``; its ``label_names`` attribute lists the wnids.

    Raises:
        DatasetNotFoundError: folders missing; the message gives the layout.
        DatasetFormatError: a malformed labels file or unknown classes.
    """
    root = root or os.environ.get(IMAGENET_ROOT_ENV)
    if not root:
        raise _not_found('<root>', 'no root folder was given and {} is not '
                         'set'.format(IMAGENET_ROOT_ENV))
    root = os.path.expanduser(os.fspath(root))
    if not os.path.isdir(root):
        raise _not_found(root, '{} does not exist'.format(root))
    label_names = imagenet_label_names(root)
    if split == 'train':
        dataset = DirectoryParsingLabelDataset(os.path.join(root, 'train'))
        if len(dataset) == 0:
            raise _not_found(root, 'no images in {}/train/<wnid>/'.format(
                root))
    elif split == 'val':
        dataset = _val_dataset(root, label_names)
    else:
        raise ValueError("split must be 'train' or 'val', got {!r}".format(
            split))
    dataset.label_names = tuple(label_names)
    return dataset


def _normalize(img, mean, std):
    mean = numpy.asarray(mean, numpy.float32).reshape(-1, 1, 1)
    std = numpy.asarray(std, numpy.float32).reshape(-1, 1, 1)
    return ((img - mean) / std).astype(numpy.float32, copy=False)


class ImageNetTrainTransform(object):
    """Random-resized crop (scale 0.08-1, ratio 3/4-4/3), resize to ``size``,
    random horizontal flip, per-channel normalization (ChainerCV transforms).
    """

    def __init__(self, size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                 scale_range=(0.08, 1.0), ratio_range=(3 / 4, 4 / 3)):
        self.size = int(size)
        self.mean, self.std = mean, std
        self.scale_range, self.ratio_range = scale_range, ratio_range

    def __call__(self, in_data):
        img, label = in_data
        img = transforms.random_sized_crop(
            img, scale_ratio_range=self.scale_range,
            aspect_ratio_range=self.ratio_range)
        img = transforms.resize(img, (self.size, self.size))
        img = transforms.random_flip(img, x_random=True)
        return _normalize(img, self.mean, self.std), label


class ImageNetEvalTransform(object):
    """Resize the shorter side to ``resize`` (256), center crop ``size``
    (224), per-channel normalization."""

    def __init__(self, size=224, resize=256, mean=IMAGENET_MEAN,
                 std=IMAGENET_STD):
        self.size, self.resize = int(size), int(resize)
        self.mean, self.std = mean, std

    def __call__(self, in_data):
        img, label = in_data
        img = transforms.scale(img, self.resize, fit_short=True)
        img = transforms.center_crop(img, (self.size, self.size))
        return _normalize(img, self.mean, self.std), label


def get_imagenet_datasets(root=None, size=224, resize=256):
    """(train, val) ILSVRC2012 with the training / evaluation transforms."""
    train = get_imagenet(root, 'train')
    val = get_imagenet(root, 'val')
    return (chainer.datasets.TransformDataset(
                train, ImageNetTrainTransform(size)),
            chainer.datasets.TransformDataset(
                val, ImageNetEvalTransform(size, resize)))
