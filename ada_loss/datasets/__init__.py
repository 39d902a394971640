"""Datasets read from local files and their transforms.

The loaders never download (nor does importing this package): data is
fetched on request, checksum-verified, by ``python -m
ada_loss.datasets.fetch NAME`` (:mod:`ada_loss.datasets.fetch`), or by an
entry run with ``--set data.download=true``.

Every image dataset yields ``(image, label)`` examples: a ``float32``
``CHW`` image in [0, 1] and an ``int32`` label.

* :func:`get_cifar` -- CIFAR-10/100 "python version" (root argument or the
  ``ADA_LOSS_CIFAR_ROOT`` environment variable).
* :func:`get_digits` -- scikit-learn's 8x8 digits, upsampled; always present.
* :func:`get_fashion_mnist` -- Fashion-MNIST IDX files.
* :func:`get_kjv` -- the King James Bible as a character-level corpus
  (:class:`CharCorpus`: ids, splits, batches; ``ADA_LOSS_KJV_ROOT``).
* :mod:`~ada_loss.datasets.transforms` -- CIFAR augmentation/normalization.
"""
from ada_loss.datasets.char_corpus import CharCorpus  # NOQA
from ada_loss.datasets.char_corpus import EVAL_ITERS  # NOQA
from ada_loss.datasets.char_corpus import EVAL_SEED  # NOQA
from ada_loss.datasets.cifar import CIFAR_ROOT_ENV  # NOQA
from ada_loss.datasets.cifar import get_cifar  # NOQA
from ada_loss.datasets.digits import get_digits  # NOQA
from ada_loss.datasets.errors import DatasetFormatError  # NOQA
from ada_loss.datasets.errors import DatasetNotFoundError  # NOQA
from ada_loss.datasets.fashion_mnist import FASHION_MNIST_ROOT  # NOQA
from ada_loss.datasets.fashion_mnist import fashion_mnist_available  # NOQA
from ada_loss.datasets.fashion_mnist import fashion_mnist_label_names  # NOQA
from ada_loss.datasets.fashion_mnist import get_fashion_mnist  # NOQA
from ada_loss.datasets.idx import parse_idx  # NOQA
from ada_loss.datasets.idx import read_idx  # NOQA
from ada_loss.datasets.image_label_dataset import ImageLabelDataset  # NOQA
from ada_loss.datasets.kjv import get_kjv  # NOQA
from ada_loss.datasets.kjv import KJV_ROOT_ENV  # NOQA
from ada_loss.datasets.kjv import KJV_SHA256  # NOQA
from ada_loss.datasets.transforms import CIFAR100_MEAN  # NOQA
from ada_loss.datasets.transforms import CIFAR100_STD  # NOQA
from ada_loss.datasets.transforms import CIFAR10_MEAN  # NOQA
from ada_loss.datasets.transforms import CIFAR10_STD  # NOQA
from ada_loss.datasets.transforms import channel_stats  # NOQA
from ada_loss.datasets.transforms import cifar_test_transform  # NOQA
from ada_loss.datasets.transforms import cifar_train_transform  # NOQA
from ada_loss.datasets.transforms import CifarTestTransform  # NOQA
from ada_loss.datasets.transforms import CifarTrainTransform  # NOQA
from ada_loss.datasets.transforms import normalize  # NOQA
from ada_loss.datasets.transforms import transform_dataset  # NOQA
from ada_loss.datasets.transforms import TransformDataset  # NOQA
