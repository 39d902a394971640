"""The publishers' files of each dataset that can be fetched, and their
checksums.

Every file is fetched from its publisher's folder (or from a mirror
holding the same file names, ``--mirror``) and kept only when its MD5 is
the one below: the checksums the publishers give, as also written in
torchvision's ``datasets/cifar.py``, ``mnist.py`` and ``voc.py`` and in
other independent downloaders (checked against them when these constants
were written). MD5 here identifies the published files; it does not
defend against a malicious server, which HTTPS (CIFAR) does.

* CIFAR-10 / CIFAR-100 (Krizhevsky 2009): the "python version" tarballs
  of https://www.cs.toronto.edu/~kriz/cifar.html.
* Fashion-MNIST (Xiao et al. 2017): the four gzipped IDX files of
  https://github.com/zalandoresearch/fashion-mnist (README, "Get the
  Data"), served from the publisher's S3 site.
* PASCAL VOC 2007 / 2012 (Everingham et al.): the three tarballs of the
  SSD recipe's "07+12", the ones ChainerCV's ``get_voc``
  (``chainercv/datasets/voc/voc_utils.py``) downloads, from the same
  server.
"""
import collections

#: file name -> MD5 hex digest of the publisher's file (the tests replace
#: entries with their generated files' digests)
CHECKSUMS = {
    'cifar-10-python.tar.gz': 'c58f30108f718f92721af3b95e74349a',
    'cifar-100-python.tar.gz': 'eb9058c3a382ffc7106e4002c42a8d85',
    'train-images-idx3-ubyte.gz': '8d4fb7e6c68d591d4c3dfef9ec88bf0d',
    'train-labels-idx1-ubyte.gz': '25c81989df183df01b3e8a0aad5dffbe',
    't10k-images-idx3-ubyte.gz': 'bef4ecab320f06d8554ea6380940ec79',
    't10k-labels-idx1-ubyte.gz': 'bb300cfdad3c16e7a12a480ee83cd310',
    'VOCtrainval_06-Nov-2007.tar': 'c52e279531787c972589f7e41ab4ae64',
    'VOCtest_06-Nov-2007.tar': 'b6e924de25625d8de591ea690078ad9f',
    'VOCtrainval_11-May-2012.tar': '6cd6e144f989b92b3379bac3b3de84fd',
}

CIFAR_BASE = 'https://www.cs.toronto.edu/~kriz/'
FASHION_MNIST_BASE = 'http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/'
VOC_BASE = 'http://host.robots.ox.ac.uk/pascal/VOC/voc{}/'

#: one published file: its name and the publisher's folder (a URL ending
#: in ``/``); the file's URL is the two joined
Source = collections.namedtuple('Source', 'name base')


def url_of(source, mirror=None):
    """The URL of ``source``: in its publisher's folder, or in ``mirror``
    (a server holding the same file names)."""
    base = source.base if mirror is None else mirror.rstrip('/') + '/'
    return base + source.name


CIFAR = {
    'cifar10': Source('cifar-10-python.tar.gz', CIFAR_BASE),
    'cifar100': Source('cifar-100-python.tar.gz', CIFAR_BASE),
}

FASHION_MNIST = tuple(Source(name, FASHION_MNIST_BASE) for name in (
    'train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
    't10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'))

#: (year, split, tarball): each tarball extracts to VOCdevkit/VOC<year>/
#: and brings ImageSets/Main/<split>.txt
VOC = (
    ('2007', 'trainval', Source('VOCtrainval_06-Nov-2007.tar',
                                VOC_BASE.format(2007))),
    ('2007', 'test', Source('VOCtest_06-Nov-2007.tar', VOC_BASE.format(2007))),
    ('2012', 'trainval', Source('VOCtrainval_11-May-2012.tar',
                                VOC_BASE.format(2012))),
)
