"""Where a fetched dataset goes when no folder is named.

Chainer's own datasets (``chainer.datasets.get_cifar10``) and ChainerCV's
cache theirs under Chainer's dataset root (``$CHAINER_DATASET_ROOT``,
default ``~/.chainer/dataset``); this project's go beside them, in
``<dataset root>/ada_loss/<folder>``. A folder named by the user (an
argument, a config key, an environment variable) always comes first.
"""
import os

from chainer.dataset import get_dataset_root


def default_root(folder):
    """``<Chainer's dataset root>/ada_loss/<folder>`` (not created here)."""
    return os.path.join(get_dataset_root(), 'ada_loss', folder)
