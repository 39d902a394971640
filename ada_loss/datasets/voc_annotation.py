"""PASCAL VOC annotation files read so that a file cannot expand entities
or reach outside itself, each bad file one clear error.

ChainerCV's ``VOCBboxDataset`` reads annotations with ElementTree
(``ET.parse``), which expands internal entities (Expat's amplification
limit makes a "billion laughs" file an error, not unbounded memory, but a
file of thousands of entity references still costs before it) and raises
``ParseError``, ``AttributeError`` (a missing ``<bndbox>``), ``ValueError``
(a class name that is not VOC's) with no file name. VOC annotations have no
document type declaration, so :func:`read_annotation`:

* refuses a file above :data:`MAX_BYTES`, and any ``<!DOCTYPE`` (hence any
  entity declaration) before building a tree — Expat reports the
  declaration in its first pass, in any encoding the file declares;
* checks each ``<object>``: a ``<name>`` of :data:`VOC_LABEL_NAMES`, a
  ``<difficult>`` 0 or 1, a ``<bndbox>`` of four integers;
* names the file and what was expected in a :class:`DatasetFormatError`.

It returns what ChainerCV's ``_get_annotations`` returns, for the same
files (an image whose objects are all dropped as difficult gets empty
arrays, where ChainerCV's ``np.stack`` fails).
"""
import os
import xml.etree.ElementTree as ET
from xml.parsers import expat

import numpy
from chainercv.datasets import voc_bbox_label_names

from ada_loss.datasets.errors import DatasetFormatError

VOC_LABEL_NAMES = tuple(voc_bbox_label_names)
#: VOC's annotations are a few kB; a larger file is not one
MAX_BYTES = 1 << 20
_COORDS = ('ymin', 'xmin', 'ymax', 'xmax')


class _Refused(Exception):
    pass


def _refuse_doctype(*args):
    raise _Refused()


def _check_no_doctype(data, path):
    """Expat's pass over the raw bytes: well-formed, no DOCTYPE."""
    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = _refuse_doctype
    parser.EntityDeclHandler = _refuse_doctype
    try:
        parser.Parse(data, True)
    except _Refused:
        raise DatasetFormatError(
            '{}: holds a document type declaration (<!DOCTYPE ...>, where '
            'entities are declared); a VOC annotation has none, so it is not '
            'read'.format(path))
    except expat.ExpatError as e:
        raise DatasetFormatError('{}: not well-formed XML ({}); expected a '
                                 'VOC annotation'.format(path, e))


def _text(element, tag, path, where):
    child = element.find(tag)
    if child is None or child.text is None or not child.text.strip():
        raise DatasetFormatError('{}: {} lacks <{}>'.format(path, where, tag))
    return child.text.strip()


def _integer(element, tag, path, where):
    text = _text(element, tag, path, where)
    try:
        return int(text)
    except ValueError:
        raise DatasetFormatError('{}: {} <{}> is {!r}, expected an integer'
                                 .format(path, where, tag, text[:40]))


def read_annotation(path, use_difficult=False):
    """``(bbox, label, difficult)`` of one VOC annotation file, as
    ChainerCV's ``VOCBboxDataset`` gives them (bbox ``(R, 4)`` float32
    ``(y_min, x_min, y_max, x_max)`` 0-based, label int32, difficult
    bool).

    Raises:
        DatasetFormatError: the file is too large, declares a DOCTYPE, is
            not well-formed, or an object lacks what VOC's objects hold.
    """
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        raise DatasetFormatError('{}: {} bytes, expected a VOC annotation of '
                                 'at most {}'.format(path, size, MAX_BYTES))
    with open(path, 'rb') as f:
        data = f.read()
    _check_no_doctype(data, path)
    root = ET.fromstring(data)
    bbox, label, difficult = [], [], []
    for i, obj in enumerate(root.findall('object')):
        where = 'object {}'.format(i)
        flag = _integer(obj, 'difficult', path, where)
        if flag not in (0, 1):
            raise DatasetFormatError('{}: {} <difficult> is {}, expected 0 '
                                     'or 1'.format(path, where, flag))
        if flag and not use_difficult:
            continue
        name = _text(obj, 'name', path, where).lower()
        if name not in VOC_LABEL_NAMES:
            raise DatasetFormatError('{}: {} <name> is {!r}, expected one of '
                                     'the 20 VOC classes ({}, ...)'.format(
                                         path, where, name[:40],
                                         ', '.join(VOC_LABEL_NAMES[:3])))
        box = obj.find('bndbox')
        if box is None:
            raise DatasetFormatError('{}: {} lacks <bndbox>'.format(path,
                                                                    where))
        # VOC's pixel indexes start at 1 (ChainerCV subtracts 1, as here)
        bbox.append([_integer(box, t, path, where + ' <bndbox>') - 1
                     for t in _COORDS])
        label.append(VOC_LABEL_NAMES.index(name))
        difficult.append(bool(flag))
    return (numpy.array(bbox, numpy.float32).reshape(-1, 4),
            numpy.array(label, numpy.int32),
            numpy.array(difficult, bool))
