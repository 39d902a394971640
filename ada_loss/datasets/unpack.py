"""Verified tar archives extracted so that a half-done extraction is never
taken for data.

Everything is extracted into a temporary folder beside the target (same
file system) with :mod:`tarfile`'s ``'data'`` filter (no absolute paths,
no ``..``, no links out of the folder, no device files), then moved into
place: a whole folder by one rename (:func:`unpack_folder`, CIFAR), or
file by file with the files a loader checks for moved last
(:func:`unpack_merged`, VOC, whose trainval and test tarballs share
``VOCdevkit/VOC2007/``). A failure removes the temporary folder and
raises a one-line :class:`~ada_loss.datasets.errors.DatasetFetchError`.
"""
import errno
import os
import shutil
import tarfile
import tempfile

from ada_loss.datasets.errors import DatasetFetchError
from ada_loss.datasets.errors import one_line


def _extract_safely(tar, folder, members):
    """``tar.extractall`` with the ``'data'`` filter, or, on a Python
    without it (before 3.11.4), after refusing what it would refuse."""
    if hasattr(tarfile, 'data_filter'):
        tar.extractall(folder, members=members, filter='data')
        return
    for m in members:
        parts = m.name.split('/')
        if (m.issym() or m.islnk() or m.isdev() or m.name.startswith('/')
                or '..' in parts):
            raise tarfile.TarError('member {!r} is a link, a device or a '
                                   'path out of the folder'.format(m.name))
    tar.extractall(folder, members=members)


def _extract(archive, root, members=None):
    """The temporary folder under ``root`` holding ``archive``'s members
    (all, or those ``members(name)`` accepts)."""
    os.makedirs(root, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=root, prefix='.tmp_' + os.path.basename(
        archive) + '.')
    try:
        with tarfile.open(archive) as tar:
            chosen = [m for m in tar.getmembers()
                      if members is None or members(m.name)]
            if not chosen:
                raise DatasetFetchError('{} holds none of the expected files'
                                        .format(archive))
            _extract_safely(tar, tmp, chosen)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, (tarfile.TarError, EOFError)):
            raise DatasetFetchError('{} is not a readable tar archive ({})'
                                    .format(archive, one_line(e))) from None
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC,
                                                  errno.EDQUOT):
            raise DatasetFetchError(
                'no space left on the device of {} while extracting {} '
                '(the verified archive is kept); free some and fetch again'
                .format(root, os.path.basename(archive))) from None
        raise
    return tmp


def unpack_folder(archive, root, folder):
    """Extracts ``folder/`` of ``archive`` to ``root/folder`` by one
    rename; returns that path."""
    tmp = _extract(archive, root, lambda name: name == folder or
                   name.startswith(folder + '/'))
    try:
        target = os.path.join(root, folder)
        os.rename(os.path.join(tmp, folder), target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def unpack_merged(archive, root, last='ImageSets'):
    """Extracts ``archive`` into ``root``, merging with what is there:
    every file is moved into place (replacing one of the same name), those
    under a ``last`` folder after all others -- the split lists of VOC,
    which its loaders (this project's, ChainerCV's ``get_voc``) take as
    the sign that the images and annotations they list are there."""
    tmp = _extract(archive, root)
    try:
        paths = []
        for folder, _, names in os.walk(tmp):
            paths.extend(os.path.relpath(os.path.join(folder, n), tmp)
                         for n in names)
        paths.sort(key=lambda p: (last in p.split(os.sep), p))
        for rel in paths:
            target = os.path.join(root, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(os.path.join(tmp, rel), target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
