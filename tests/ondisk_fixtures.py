"""Tiny datasets written in the real on-disk formats (JPEG + VOC XML,
ILSVRC2012 folders and val labels files)."""
import os

import numpy
from PIL import Image

WNIDS = ('n01440764', 'n01443537', 'n01484850')


def write_jpeg(path, size=(48, 40), seed=0, mode='RGB'):
    """A random JPEG of ``size`` = (width, height)."""
    rng = numpy.random.RandomState(seed)
    w, h = size
    shape = (h, w, 3) if mode == 'RGB' else (h, w)
    Image.fromarray(rng.randint(0, 256, shape).astype(numpy.uint8),
                    mode).save(path, 'JPEG')


def make_imagenet(root, flat_val=False, label_style='index', n_per_class=2):
    """ILSVRC2012 layout with 3 classes; returns the root."""
    seed = 0
    for wnid in WNIDS:
        d = os.path.join(root, 'train', wnid)
        os.makedirs(d)
        for i in range(n_per_class):
            write_jpeg(os.path.join(d, '{}_{}.JPEG'.format(wnid, i)),
                       (50 + 7 * i, 40), seed)
            seed += 1
    val = os.path.join(root, 'val')
    os.makedirs(val)
    lines = []
    for k, wnid in enumerate(reversed(WNIDS)):    # labels 2, 1, 0
        label = len(WNIDS) - 1 - k
        name = 'ILSVRC2012_val_{:08d}.JPEG'.format(k + 1)
        if flat_val:
            write_jpeg(os.path.join(val, name), (30, 60), seed,
                       mode='L' if k == 0 else 'RGB')
            lines.append('{} {}'.format(
                name, label if label_style == 'index' else wnid))
        else:
            os.makedirs(os.path.join(val, wnid))
            write_jpeg(os.path.join(val, wnid, name), (30, 60), seed)
        seed += 1
    if flat_val:
        with open(os.path.join(root, 'val.txt'), 'w') as f:
            f.write('\n'.join(lines) + '\n')
    return root


_XML_OBJECT = """  <object>
    <name>{name}</name>
    <pose>Unspecified</pose>
    <truncated>0</truncated>
    <difficult>{difficult}</difficult>
    <bndbox>
      <xmin>{xmin}</xmin>
      <ymin>{ymin}</ymin>
      <xmax>{xmax}</xmax>
      <ymax>{ymax}</ymax>
    </bndbox>
  </object>
"""

_XML = """<annotation>
  <folder>VOC{year}</folder>
  <filename>{id}.jpg</filename>
  <size>
    <width>{width}</width>
    <height>{height}</height>
    <depth>3</depth>
  </size>
  <segmented>0</segmented>
{objects}</annotation>
"""

#: (id, (width, height), objects [(name, difficult, xmin, ymin, xmax, ymax)])
VOC_IMAGES = (
    ('000005', (80, 64), [('dog', 0, 10, 8, 60, 50),
                          ('chair', 1, 50, 30, 78, 62)]),
    ('000007', (72, 80), [('car', 0, 5, 20, 70, 75)]),
)


def make_vocdevkit(root, years=('2007', '2012'),
                   splits=('trainval', 'test')):
    """``root/VOCdevkit/VOC<year>`` with the 2 images of :data:`VOC_IMAGES`
    in every split (VOC2012 gets trainval only); returns ``root``."""
    for year in years:
        base = os.path.join(root, 'VOCdevkit', 'VOC' + year)
        for sub in ('Annotations', 'JPEGImages', 'ImageSets/Main'):
            os.makedirs(os.path.join(base, sub))
        for n, (id_, size, objects) in enumerate(VOC_IMAGES):
            write_jpeg(os.path.join(base, 'JPEGImages', id_ + '.jpg'), size,
                       seed=n)
            objs = ''.join(_XML_OBJECT.format(
                name=o[0], difficult=o[1], xmin=o[2], ymin=o[3], xmax=o[4],
                ymax=o[5]) for o in objects)
            with open(os.path.join(base, 'Annotations', id_ + '.xml'),
                      'w') as f:
                f.write(_XML.format(year=year, id=id_, width=size[0],
                                    height=size[1], objects=objs))
        for split in splits:
            if year == '2012' and split == 'test':
                continue
            with open(os.path.join(base, 'ImageSets', 'Main',
                                   split + '.txt'), 'w') as f:
                f.write(''.join(i[0] + '\n' for i in VOC_IMAGES))
    return root


def make_cifar10(parent, n_train=48, n_test=16, batches=2, seed=0):
    """``cifar-10-batches-py/`` under ``parent`` in the official python
    format (random pixels and labels; ``n_train`` split over ``batches``
    files); returns the folder."""
    import pickle
    folder = os.path.join(str(parent), 'cifar-10-batches-py')
    os.makedirs(folder)
    rng = numpy.random.RandomState(seed)

    def dump(name, n):
        with open(os.path.join(folder, name), 'wb') as f:
            pickle.dump({'data': rng.randint(0, 256, (n, 3072)).astype(
                numpy.uint8), 'labels': [int(v) for v in rng.randint(
                    0, 10, n)]}, f, protocol=2)
    for i in range(batches):
        dump('data_batch_%d' % (i + 1), n_train // batches)
    dump('test_batch', n_test)
    return folder
