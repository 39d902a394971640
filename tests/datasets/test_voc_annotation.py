"""VOC annotations read by :func:`read_annotation`: the same arrays as
ChainerCV's parser on real-layout files; entity bombs and external
entities refused before any expansion; every malformed file one
DatasetFormatError naming the file (a property over mutated files)."""
import os
import time

import numpy
import pytest
from chainercv.datasets import VOCBboxDataset
from hypothesis import given, settings, strategies as st

from ada_loss.datasets import DatasetFormatError
from ada_loss.datasets.voc import voc_bbox_dataset
from ada_loss.datasets.voc_annotation import read_annotation

from property_helpers import assert_specific, examples


def _annotation_files(voc_root):
    folder = os.path.join(voc_root, 'VOCdevkit', 'VOC2007', 'Annotations')
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder))]


@pytest.mark.parametrize('use_difficult', [False, True])
def test_the_same_arrays_as_chainercv(voc_root, use_difficult):
    ours = voc_bbox_dataset(voc_root, '2007', 'test', use_difficult)
    theirs = VOCBboxDataset(os.path.join(voc_root, 'VOCdevkit', 'VOC2007'),
                            'trainval', use_difficult=use_difficult,
                            return_difficult=True)
    assert len(ours) == len(theirs) == 2
    for i in range(len(ours)):
        want = theirs._get_annotations(i)
        got = ours._get_annotations(i)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            numpy.testing.assert_array_equal(g, w)


BOMB = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lollollollollollollollollollol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<annotation><object><name>&lol9;</name><difficult>0</difficult>
<bndbox><xmin>1</xmin><ymin>1</ymin><xmax>2</xmax><ymax>2</ymax></bndbox>
</object></annotation>
"""
EXTERNAL = """<?xml version="1.0"?>
<!DOCTYPE a [<!ENTITY secret SYSTEM "file:///etc/hostname">]>
<annotation><object><name>&secret;</name></object></annotation>
"""


@pytest.mark.parametrize('text, encoding', [
    (BOMB, 'utf-8'), (EXTERNAL, 'utf-8'),
    (BOMB.replace('<?xml version="1.0"?>',
                  '<?xml version="1.0" encoding="UTF-16"?>'), 'utf-16'),
    ('<!DOCTYPE annotation><annotation/>', 'utf-8')])
def test_doctype_and_entities_are_refused_unexpanded(tmp_path, text,
                                                     encoding):
    path = str(tmp_path / '000001.xml')
    with open(path, 'wb') as f:
        f.write(text.encode(encoding))
    t0 = time.perf_counter()
    with pytest.raises(DatasetFormatError, match='DOCTYPE') as e:
        read_annotation(path)
    assert time.perf_counter() - t0 < 1.0
    assert path in str(e.value)
    assert_specific(e.value)


@pytest.mark.parametrize('body, reason', [
    ('<annotation><object><name>dog</name><difficult>0</difficult>'
     '</object></annotation>', 'lacks <bndbox>'),
    ('<annotation><object><name>dragon</name><difficult>0</difficult>'
     '</object></annotation>', "<name> is 'dragon'"),
    ('<annotation><object><name>dog</name><difficult>x</difficult>'
     '</object></annotation>', '<difficult> is'),
    ('<annotation><object><name>dog</name><difficult>0</difficult><bndbox>'
     '<xmin>1.5</xmin></bndbox></object></annotation>', 'lacks <ymin>'),
    ('<annotation><object>', 'not well-formed'),
    ('', 'not well-formed'),
])
def test_malformed_annotations_name_the_file(tmp_path, body, reason):
    path = str(tmp_path / '000002.xml')
    with open(path, 'w') as f:
        f.write(body)
    with pytest.raises(DatasetFormatError) as e:
        read_annotation(path)
    assert reason in str(e.value) and path in str(e.value), str(e.value)


def test_a_huge_file_is_refused_unread(tmp_path):
    path = str(tmp_path / 'big.xml')
    with open(path, 'wb') as f:
        f.truncate(2 << 20)
    with pytest.raises(DatasetFormatError, match='at most'):
        read_annotation(path)


@st.composite
def _mutated(draw, sources):
    data = bytearray(draw(st.sampled_from(sources)))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(['cut', 'flip', 'insert']))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == 'cut':
            del data[i:i + draw(st.integers(1, 40))]
        elif how == 'flip' and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        else:
            data[i:i] = draw(st.sampled_from(
                [b'<!DOCTYPE a>', b'&lol;', b'<object>', b'</name>', b'\x00',
                 b'<name>cat</name>', b'-1', b'\xff\xfe']) | st.binary(
                    max_size=8))
    return bytes(data)


def test_mutated_annotations_read_or_name_the_file(voc_root, tmp_path):
    sources = []
    for p in _annotation_files(voc_root):
        with open(p, 'rb') as f:
            sources.append(f.read())
    path = str(tmp_path / 'mutant.xml')

    @settings(max_examples=examples(500))
    @given(_mutated(sources))
    def check(data):
        with open(path, 'wb') as f:
            f.write(data)
        try:
            bbox, label, difficult = read_annotation(path, True)
        except DatasetFormatError as e:
            assert path in str(e)
            assert_specific(e)
        else:
            assert bbox.shape == (len(label), 4) and bbox.dtype == \
                numpy.float32
            assert label.dtype == numpy.int32 and difficult.dtype == bool
            assert ((0 <= label) & (label < 20)).all()
    check()
