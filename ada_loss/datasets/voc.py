"""PASCAL VOC detection data from local VOCdevkit folders (paper §4.3).

The SSD recipe (Liu et al. 2016; ChainerCV's ``examples/ssd``) trains on
VOC2007 trainval + VOC2012 trainval ("07+12") and tests on VOC2007 test with
difficult objects kept and flagged. Nothing is downloaded here: ChainerCV's
:class:`~chainercv.datasets.VOCBboxDataset` downloads when ``data_dir='auto'``,
so a folder is always required here. ``root`` may be the ``VOCdevkit`` folder
or its parent; each year needs::

    VOCdevkit/VOC2007/ImageSets/Main/{trainval,test}.txt
    VOCdevkit/VOC2007/Annotations/<id>.xml
    VOCdevkit/VOC2007/JPEGImages/<id>.jpg
    VOCdevkit/VOC2012/... (trainval only)

Examples are ChainerCV's: ``(img, bbox, label)`` (``img`` RGB ``float32``
``CHW`` in [0, 255], ``bbox`` ``(R, 4)`` ``(y_min, x_min, y_max, x_max)``,
``label`` ``int32`` index into :data:`VOC_LABEL_NAMES`), plus ``difficult``
(bool) for the test set.

:mod:`ada_loss.datasets.fetch` (``python -m ada_loss.datasets.fetch voc``)
fetches and verifies the three tarballs on request; with no folder named
it fills :func:`voc_default_root`, which :func:`resolve_voc_root` looks in
last.
"""
import os

from chainercv.chainer_experimental.datasets.sliceable import \
    ConcatenatedDataset
from chainercv.datasets import VOCBboxDataset

from ada_loss.datasets.errors import DatasetNotFoundError
from ada_loss.datasets.roots import default_root
from ada_loss.datasets.voc_annotation import (  # NOQA: F401 (re-exported)
    VOC_LABEL_NAMES, read_annotation)

VOC_ROOT_ENV = 'ADA_LOSS_VOC_ROOT'

#: Folder under Chainer's dataset root that a fetch with no folder named
#: fills (:func:`voc_default_root`).
VOC_FOLDER = 'voc'

_LAYOUT = ('expected the PASCAL VOC layout <root>/VOCdevkit/VOC<year>/'
           '{ImageSets/Main/<split>.txt, Annotations/<id>.xml, '
           'JPEGImages/<id>.jpg} (root may also be the VOCdevkit folder '
           'itself). The loaders never download: fetch the data with '
           '`python -m ada_loss.datasets.fetch voc [--root DIR]` (or `--set '
           'data.download=true` on an entry), or extract '
           'VOCtrainval_06-Nov-2007.tar, VOCtest_06-Nov-2007.tar and '
           'VOCtrainval_11-May-2012.tar into <root> yourself.')


def _not_found(problem):
    return DatasetNotFoundError('PASCAL VOC: {}; {}'.format(problem, _LAYOUT))


def voc_year_dir(root, year):
    """The ``VOC<year>`` folder under ``root`` (a VOCdevkit or its parent)."""
    if root is None or root == 'auto':
        raise _not_found('a local root folder is required (got {!r}; '
                         'downloading is disabled)'.format(root))
    root = os.path.expanduser(os.fspath(root))
    if not os.path.isdir(root):
        raise _not_found('{} does not exist'.format(root))
    for base in (root, os.path.join(root, 'VOCdevkit')):
        path = os.path.join(base, 'VOC{}'.format(year))
        if os.path.isdir(path):
            return path
    raise _not_found('no VOC{} folder in {} or {}/VOCdevkit'.format(
        year, root, root))


def voc_bbox_dataset(root, year, split, use_difficult=False,
                     return_difficult=False):
    """ChainerCV's ``VOCBboxDataset`` on a checked local folder."""
    data_dir = voc_year_dir(root, year)
    needed = [os.path.join(data_dir, 'ImageSets', 'Main', split + '.txt'),
              os.path.join(data_dir, 'Annotations'),
              os.path.join(data_dir, 'JPEGImages')]
    missing = [p for p in needed if not os.path.exists(p)]
    if missing:
        raise _not_found('VOC{} {} is incomplete: missing {}'.format(
            year, split, ', '.join(missing)))
    return CheckedVOCBboxDataset(data_dir=data_dir, split=split,
                                 year=str(year), use_difficult=use_difficult,
                                 return_difficult=return_difficult)


class CheckedVOCBboxDataset(VOCBboxDataset):
    """ChainerCV's ``VOCBboxDataset`` whose annotations are read by
    :func:`~ada_loss.datasets.voc_annotation.read_annotation` (no DOCTYPE
    or entities; each bad file a DatasetFormatError naming it)."""

    def _get_annotations(self, i):
        return read_annotation(
            os.path.join(self.data_dir, 'Annotations', self.ids[i] + '.xml'),
            self.use_difficult)


def get_voc_detection_train(root, years=('2007', '2012'), split='trainval'):
    """VOC07+12 trainval (difficult objects excluded, as in ChainerCV's SSD
    training): ``(img, bbox, label)``."""
    parts = [voc_bbox_dataset(root, y, split) for y in years]
    return parts[0] if len(parts) == 1 else ConcatenatedDataset(*parts)


def get_voc_detection_test(root, year='2007', split='test'):
    """VOC2007 test with difficult objects flagged:
    ``(img, bbox, label, difficult)``."""
    return voc_bbox_dataset(root, year, split, use_difficult=True,
                            return_difficult=True)


def voc_default_root():
    """``<Chainer's dataset root>/ada_loss/voc``: where a fetch with no
    folder named puts VOC."""
    return default_root(VOC_FOLDER)


def resolve_voc_root(root=None):
    """``root``, else the ``ADA_LOSS_VOC_ROOT`` environment variable, else
    :func:`voc_default_root` when it exists."""
    root = root or os.environ.get(VOC_ROOT_ENV)
    if not root and os.path.isdir(voc_default_root()):
        root = voc_default_root()
    if not root:
        raise _not_found('no root folder given, {} is not set and {} does '
                         'not exist'.format(VOC_ROOT_ENV, voc_default_root()))
    return root
