"""Verified tar archives extracted so that a half-done extraction is never
taken for data.

Everything is extracted into a temporary folder beside the target (same
file system) with :mod:`tarfile`'s ``'data'`` filter (no absolute paths,
no ``..``, no device files; and no link at all, which the publishers'
archives never hold), then moved into
place: a whole folder by one rename (:func:`unpack_folder`, CIFAR; file
by file, its test batch last, into a half-done folder already there), or
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


def _only_files_and_folders(archive, members):
    """Raises DatasetFetchError for a member that is neither a regular file
    nor a folder. The publishers' archives hold no links; a link is refused
    even where the ``'data'`` filter would keep it (one pointing at a
    sibling inside the temporary folder points, once its folder is moved
    into ``root``, at a file of ``root`` outside that folder)."""
    for m in members:
        if not (m.isfile() or m.isdir()):
            raise DatasetFetchError(
                '{} holds {!r}, a {}: the publisher\'s archive holds only '
                'files and folders; refused, nothing extracted'.format(
                    archive, m.name, 'symbolic link' if m.issym() else
                    'hard link' if m.islnk() else 'device or pipe'))


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
            _only_files_and_folders(archive, chosen)
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


def _move_files(source, target, last):
    """Moves every file under ``source`` to the same place under
    ``target`` (replacing one of the same name), those whose relative path
    has a part ``last`` after all others."""
    paths = []
    for folder, _, names in os.walk(source):
        paths.extend(os.path.relpath(os.path.join(folder, n), source)
                     for n in names)
    paths.sort(key=lambda p: (last in p.split(os.sep), p))
    for rel in paths:
        path = os.path.join(target, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.replace(os.path.join(source, rel), path)


def unpack_folder(archive, root, folder, last=None):
    """Extracts ``folder/`` of ``archive`` to ``root/folder``; returns that
    path. By one rename where ``root/folder`` is not there (or empty);
    into a folder already there (a half-done extraction by hand, or a
    concurrent fetch that renamed first) file by file, the file named
    ``last`` -- the one a loader takes as the sign of the folder, CIFAR's
    test batch -- removed first and moved in after all others, so that an
    interruption never leaves the folder looking complete."""
    tmp = _extract(archive, root, lambda name: name == folder or
                   name.startswith(folder + '/'))
    try:
        target = os.path.join(root, folder)
        try:
            os.rename(os.path.join(tmp, folder), target)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or \
                    not os.path.isdir(target):
                raise
            if last is not None:
                # until every other file is in, the folder must not look
                # complete (a stale test batch beside data_batch_1..4
                # moved in before an interruption would)
                try:
                    os.remove(os.path.join(target, last))
                except FileNotFoundError:
                    pass
            _move_files(os.path.join(tmp, folder), target, last)
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
        _move_files(tmp, root, last)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
