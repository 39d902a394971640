"""Datasets fetched on request and verified::

    python -m ada_loss.datasets.fetch NAME [--root DIR] [--mirror URL]
                                           [--timeout S]

NAME is one of ``cifar10``, ``cifar100``, ``fashion_mnist``, ``voc2007``,
``voc2012``, ``voc`` (both years: the SSD recipe's "07+12"), ``kjv`` and
``imagenet`` (manual: the error says how). Each publisher's file
(:mod:`~ada_loss.datasets.sources`) is written to a temporary name in
``DIR``, its MD5 checked against the publisher's, then renamed
(:mod:`~ada_loss.datasets.download`); archives are then extracted into
the layout the loaders read, a half-done extraction never under a name
they read (:mod:`~ada_loss.datasets.unpack`). A file already there and
verified is not fetched again; data already extracted (by hand, say) is
left as it is. Any failure -- a wrong checksum, a download cut short or
stalled (``--timeout``, seconds without a byte; default 60), no network,
no space -- ends with one ``error:`` line and exit status 1, and leaves
nothing that a later run would take for data.

Without ``--root``, the data goes where the entries look when no folder is
configured: for CIFAR ``$ADA_LOSS_CIFAR_ROOT``, else
``<Chainer's dataset root>/ada_loss/cifar`` (``~/.chainer/dataset`` unless
``$CHAINER_DATASET_ROOT`` says otherwise), which :func:`get_cifar` looks
in last; for VOC ``$ADA_LOSS_VOC_ROOT``, else ``.../ada_loss/voc``; for
Fashion-MNIST ``.../ada_loss/fashion-mnist`` (an entry reads it from
``data.fashion_mnist_root``: the last line printed says what to set); for
the KJV text ``$ADA_LOSS_KJV_ROOT``, else ``.../ada_loss/kjv``.
``--mirror URL`` fetches the same file names from another server (a lab's
cache, a local ``http.server``; ``file://`` URLs work too).

Nothing here runs at import; the entries fetch only with ``--set
data.download=true`` (:func:`ada_loss.experiment.data.load_datasets`).
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

from ada_loss import atomic
from ada_loss.datasets import download as DL
from ada_loss.datasets import sources as S
from ada_loss.datasets import unpack
from ada_loss.datasets.cifar import CIFAR_ROOT_ENV
from ada_loss.datasets.cifar import cifar_default_root
from ada_loss.datasets.cifar import cifar_layout
from ada_loss.datasets.errors import DatasetFetchError
from ada_loss.datasets.errors import one_line
from ada_loss.datasets.roots import default_root

#: ImageNet's licence lets only registered users download it: the exact
#: steps, as one line (the layout: ada_loss/datasets/imagenet.py)
IMAGENET_MANUAL = (
    'ImageNet (ILSVRC2012) cannot be fetched: its terms of access let only '
    'a registered user download it. Sign in at '
    'https://image-net.org/download-images, accept the terms, download '
    'ILSVRC2012_img_train.tar (138 GB, MD5 1d675b47d978889d74fa0da5fadfb00e) '
    'and ILSVRC2012_img_val.tar (6.3 GB, MD5 29b22e2961454d5413ddabcf34fc5622) '
    'into ROOT and check them with `md5sum`; then `mkdir ROOT/train && tar '
    '-xf ILSVRC2012_img_train.tar -C ROOT/train && for t in ROOT/train/*.tar; '
    'do mkdir "${t%.tar}" && tar -xf "$t" -C "${t%.tar}" && rm "$t"; done` '
    '(one folder per wnid), `mkdir ROOT/val && tar -xf ILSVRC2012_img_val.tar '
    '-C ROOT/val`, and put the validation labels in ROOT/val.txt, one '
    '"ILSVRC2012_val_00000001.JPEG n01751748" line per image (a wnid, or a '
    '0-based index into the sorted wnids as in Caffe\'s val.txt; Kaggle\'s '
    'LOC_val_solution.csv is read too); point ADA_LOSS_IMAGENET_ROOT (or '
    '--set data.imagenet_root=ROOT) at ROOT.')

#: The KJV text: Debian's bible-kjv prints the whole book, one verse a
#: line (``Ge1:1 In the beginning God created the heaven and the earth.``),
#: into ``kjv.txt`` -- the file, name and environment variable of the
#: corpus loader of issue 48 (``ada_loss/datasets/kjv.py`` on its branch),
#: which makes it the same way; nothing is downloaded. bible-kjv 4.38 prints
#: 4,404,412 bytes (SHA-256 cd45f0c9...f47229d); another version may format
#: a line differently, so what is checked is the KJV's 31,102 verses, from
#: Genesis 1:1 to Revelation 22:21.
KJV_FILE = 'kjv.txt'
KJV_ROOT_ENV = 'ADA_LOSS_KJV_ROOT'
KJV_COMMAND = ('bible', '-f', 'Gen1:1-Rev22:21')
KJV_VERSES = 31102
_VERSE = re.compile(r'^[1-3]?[A-Za-z]+\d+:\d+ ')


def check_kjv(text, where):
    """Raises DatasetFetchError unless ``text`` is the whole KJV, one verse
    a line."""
    lines = text.splitlines()
    verses = sum(1 for line in lines if _VERSE.match(line))
    if (verses != KJV_VERSES or not lines[0].startswith('Ge1:1 ')
            or not lines[-1].startswith('Rev22:21 ')):
        raise DatasetFetchError(
            '{} is not the whole KJV text: {} verse lines from {!r} to {!r}, '
            'expected {} from Ge1:1 to Rev22:21'.format(
                where, verses, lines[0][:12] if lines else '',
                lines[-1][:12] if lines else '', KJV_VERSES))


def _fetch_kjv(root, log, timeout=600):
    path = os.path.join(root, KJV_FILE)
    if os.path.isfile(path):
        with open(path, encoding='utf-8', errors='replace') as f:
            check_kjv(f.read(), path)
        log('{}: already there, {} verses; not made again'.format(
            path, KJV_VERSES))
        return
    program = shutil.which(KJV_COMMAND[0])
    if program is None:
        raise DatasetFetchError(
            "the KJV text comes from Debian's bible-kjv package, whose "
            '`bible` program is not on PATH: install it with `apt-get '
            'install bible-kjv`, then fetch kjv again (nothing is downloaded '
            'here)')
    command = ' '.join(KJV_COMMAND)
    try:
        # stdin closed: bible would otherwise wait for input on a terminal
        done = subprocess.run((program,) + KJV_COMMAND[1:],
                              stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise DatasetFetchError('`{}` did not finish within {} s'.format(
            command, timeout)) from None
    if done.returncode != 0:
        raise DatasetFetchError('`{}` failed with status {}: {}'.format(
            command, done.returncode, one_line(done.stderr.decode(
                errors='replace'))[:200] or 'no message'))
    check_kjv(done.stdout.decode('utf-8', errors='replace'),
              'the output of `{}`'.format(command))
    atomic.write_bytes(path, done.stdout)
    log('{}: {} verses from `{}`'.format(path, KJV_VERSES, command))


#: NAME -> one-line description (the command's --help)
NAMES = {
    'cifar10': 'CIFAR-10: cifar-10-python.tar.gz, 163 MiB, extracted',
    'cifar100': 'CIFAR-100: cifar-100-python.tar.gz, 161 MiB, extracted',
    'fashion_mnist': 'Fashion-MNIST: its four IDX .gz files, 29 MiB',
    'voc2007': 'PASCAL VOC2007: the trainval and test tarballs, 0.9 GiB, '
               'extracted',
    'voc2012': 'PASCAL VOC2012: the trainval tarball, 1.9 GiB, extracted',
    'voc': 'voc2007 and voc2012, the SSD recipe\'s 07+12',
    'kjv': 'the KJV text from Debian\'s bible-kjv program, no network',
    'imagenet': 'not fetched, its licence: the error says how to get it',
}
_ALIASES = {'fashion-mnist': 'fashion_mnist', 'voc0712': 'voc'}


def default_fetch_root(name):
    """The folder ``fetch NAME`` fills when no ``--root`` is given."""
    name = _ALIASES.get(name, name)
    if name in ('cifar10', 'cifar100'):
        return os.environ.get(CIFAR_ROOT_ENV) or cifar_default_root()
    if name.startswith('voc'):
        from ada_loss.datasets.voc import VOC_ROOT_ENV, voc_default_root
        return os.environ.get(VOC_ROOT_ENV) or voc_default_root()
    if name == 'kjv' and os.environ.get(KJV_ROOT_ENV):
        return os.environ[KJV_ROOT_ENV]
    return default_root({'fashion_mnist': 'fashion-mnist'}.get(name, name))


def _file(source, root, mirror, timeout, log):
    """``root/<source.name>``, verified, downloaded if it is not there."""
    path = os.path.join(root, source.name)
    md5 = S.CHECKSUMS[source.name]
    if DL.verified(path, md5):
        log('{}: already there, MD5 verified; not fetched again'.format(path))
        return path
    return DL.download(S.url_of(source, mirror), path, md5, timeout, log)


#: the files of each publisher's extracted CIFAR folder that the loader
#: reads: all there is what "already extracted" means (a folder holding the
#: test batch alone is what an interrupted ``tar -x`` of cifar-10 leaves,
#: whose members come data_batch_4, readme.html, test_batch, ...)
CIFAR_FILES = {
    'cifar10': ['data_batch_%d' % i for i in range(1, 6)] + ['test_batch',
                                                            'batches.meta'],
    'cifar100': ['train', 'test', 'meta'],
}


def _fetch_cifar(name, root, mirror, timeout, log):
    archive, folder, test = cifar_layout(name)
    extracted = all(os.path.isfile(os.path.join(root, folder, n))
                    for n in CIFAR_FILES[name])
    if extracted and not os.path.exists(os.path.join(root, archive)):
        log('{}: already extracted (no archive beside it to verify); not '
            'fetched again'.format(os.path.join(root, folder)))
        return
    path = _file(S.CIFAR[name], root, mirror, timeout, log)
    if not extracted:
        log('extracted to {}'.format(unpack.unpack_folder(
            path, root, folder, last=test)))


def _fetch_fashion_mnist(root, mirror, timeout, log):
    for source in S.FASHION_MNIST:
        plain = os.path.join(root, source.name[:-len('.gz')])
        if (not os.path.exists(os.path.join(root, source.name))
                and os.path.isfile(plain)):
            log('{}: an uncompressed copy is there (nothing to verify it '
                'against); not fetched again'.format(plain))
            continue
        _file(source, root, mirror, timeout, log)


def _fetch_voc(years, root, mirror, timeout, log):
    for year, split, source in S.VOC:
        if year not in years:
            continue
        marker = os.path.join(root, 'VOCdevkit', 'VOC' + year, 'ImageSets',
                              'Main', split + '.txt')
        if os.path.isfile(marker):
            log('VOC{} {}: already extracted ({}); not fetched again'.format(
                year, split, marker))
            continue
        path = _file(source, root, mirror, timeout, log)
        unpack.unpack_merged(path, root)
        log('VOC{} {}: extracted into {}'.format(
            year, split, os.path.join(root, 'VOCdevkit', 'VOC' + year)))


def fetch(name, root=None, mirror=None, timeout=DL.DEFAULT_TIMEOUT,
          log=None):
    """Fetches dataset ``name`` into ``root`` (default:
    :func:`default_fetch_root`); returns the folder to give the loader.

    Raises:
        DatasetFetchError: one-line message; nothing a loader would take
            for data is left behind.
        ValueError: an unknown name, or a timeout not in (0,
            :data:`~ada_loss.datasets.download.MAX_TIMEOUT`].
    """
    log = log or (lambda text: None)
    name = _ALIASES.get(name, name)
    if name not in NAMES:
        raise ValueError('unknown dataset {!r} to fetch; expected one of {}'
                         .format(name, ', '.join(NAMES)))
    if name == 'imagenet':
        raise DatasetFetchError(IMAGENET_MANUAL)
    DL.check_timeout(timeout)
    root = os.path.abspath(os.path.expanduser(
        os.fspath(root) if root is not None else default_fetch_root(name)))
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as e:
        raise DatasetFetchError('cannot create {}: {}; fetch into another '
                                'folder (--root)'.format(root, e.strerror))
    try:
        if name in ('cifar10', 'cifar100'):
            _fetch_cifar(name, root, mirror, timeout, log)
        elif name == 'fashion_mnist':
            _fetch_fashion_mnist(root, mirror, timeout, log)
        elif name == 'kjv':
            _fetch_kjv(root, log)
        else:
            years = {'voc2007': ('2007',), 'voc2012': ('2012',)}.get(
                name, ('2007', '2012'))
            _fetch_voc(years, root, mirror, timeout, log)
    except DatasetFetchError:
        raise
    except OSError as e:     # reading or moving files: still one line
        raise DatasetFetchError('cannot fetch {} into {}: {}'.format(
            name, root, one_line(e))) from None
    return root


def _where_read(name, root):
    """The last line: how an entry reads what was fetched."""
    if name in ('cifar10', 'cifar100'):
        if root == os.path.abspath(cifar_default_root()) and not \
                os.environ.get(CIFAR_ROOT_ENV):
            return 'the entries find it there with no setting'
        return '--set data.cifar_root={} (or {}={})'.format(
            root, CIFAR_ROOT_ENV, root)
    if name == 'fashion_mnist':
        return '--set data.fashion_mnist_root={}'.format(root)
    if name.startswith('voc'):
        return '--set data.voc_root={} (or ADA_LOSS_VOC_ROOT={})'.format(
            root, root)
    return 'read by the KJV corpus loader with {}={}'.format(
        KJV_ROOT_ENV, root)


def main(argv=None):
    """The command line; returns the exit status (0, 1 on a fetch error,
    130 when interrupted)."""
    p = argparse.ArgumentParser(
        prog='python -m ada_loss.datasets.fetch',
        description='Fetch a dataset and verify it against its publisher\'s '
                    'checksums.',
        epilog='NAME -- ' + '; '.join('{} = {}'.format(k, v)
                                      for k, v in NAMES.items()))
    p.add_argument('name', metavar='NAME', choices=sorted(
        list(NAMES) + list(_ALIASES)), help=', '.join(NAMES))
    p.add_argument('--root', help='folder to fetch into (default: where the '
                   'entries look when no folder is configured)')
    p.add_argument('--mirror', metavar='URL', help='fetch the same file '
                   'names from this server instead of the publisher\'s')
    p.add_argument('--timeout', type=float, default=DL.DEFAULT_TIMEOUT,
                   metavar='S', help='give up after S seconds without a byte '
                   '(default: %(default)g)')
    args = p.parse_args(argv)
    if not 0 < args.timeout <= DL.MAX_TIMEOUT:     # False for NaN too
        p.error('--timeout must be a number of seconds above 0 and at most '
                '{:g}'.format(DL.MAX_TIMEOUT))

    def log(text):
        print('[fetch] ' + text, flush=True)
    try:
        root = fetch(args.name, args.root, args.mirror, args.timeout, log)
    except (DatasetFetchError, ValueError) as e:
        print('error: {}'.format(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print('\ninterrupted: nothing half-written was kept; the same '
              'command fetches again', file=sys.stderr)
        return 130
    name = _ALIASES.get(args.name, args.name)
    log('{} ready in {}; {}'.format(name, root, _where_read(name, root)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
