"""Trainer snapshots that survive a kill at any moment.

:class:`Snapshot` replaces Chainer's ``extensions.snapshot`` in every run:

* **Writing** (``__call__``): the trainer goes to a temporary file in the
  run folder, which is flushed to disk; the current ``snapshot_latest`` is
  kept as ``snapshot_previous`` (a hard link, so ``snapshot_latest`` never
  disappears) and the new file replaces ``snapshot_latest`` by
  ``os.replace``. A kill leaves either the old or the new snapshot in place,
  never a half-written one.
* **Loading** (``initialize`` with ``autoload``): ``snapshot_latest`` is
  read completely first (every array, so a truncated or corrupted file is
  found before anything is loaded into the trainer). If it is unreadable
  the run says so on stderr and falls back to ``snapshot_previous``; if
  that is unreadable (or missing) too it says so and starts afresh. Where
  it resumed from is ``loaded_from`` (``run.json``: ``resumed_from``).
"""
import os
import shutil
import sys
import tempfile
import zipfile
import zlib

import numpy

import chainer
from chainer.training import extension

from ada_loss.training.faults import fault_point

LATEST = 'snapshot_latest'
PREVIOUS = 'snapshot_previous'
#: a key every trainer snapshot holds (the updater's iteration counter)
_REQUIRED_KEY = 'updater/iteration'


class _KeyRecorder(chainer.serializer.Serializer):
    """Walks a target's ``serialize`` as ``save_npz`` would and records the
    key of every value, storing nothing (a save reads the state and
    changes none of it; a load reads the same keys back)."""

    def __init__(self, keys, path=''):
        self.keys, self.path = keys, path

    def __getitem__(self, key):
        return _KeyRecorder(self.keys, self.path + key.strip('/') + '/')

    def __call__(self, key, value):
        self.keys.add(self.path + key.lstrip('/'))
        return value


def needed_keys(target):
    """The keys of every array a snapshot must hold to load into
    ``target`` (a trainer: the model, optimizer, updater, extensions)."""
    keys = set()
    target.serialize(_KeyRecorder(keys))
    return keys


def check_snapshot(path, needed=None):
    """``None`` if ``path`` is a complete, readable trainer snapshot, else
    the reason it is not (a short text). ``needed``: the keys the trainer
    loads (:func:`needed_keys`); a file that lacks any is incomplete (as
    a truncated one: the caller falls back to the previous snapshot)."""
    try:
        with numpy.load(path, allow_pickle=False) as npz:
            names = list(npz.files)
            for name in names:      # reads and CRC-checks every array
                npz[name]
    except FileNotFoundError:
        return 'missing'
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile,
            zlib.error) as e:
        return '{}: {}'.format(type(e).__name__, e)
    if _REQUIRED_KEY not in names:
        return 'not a trainer snapshot (no {})'.format(_REQUIRED_KEY)
    missing = sorted(set(needed or ()) - set(names))
    if missing:
        return 'missing {} array{}: {}{}'.format(
            len(missing), 's' if len(missing) > 1 else '',
            ', '.join(missing[:3]), ', …' if len(missing) > 3 else '')
    return None


def snapshot_candidates(folder):
    """The snapshot files of a run folder, newest first (existing ones)."""
    return [p for p in (os.path.join(folder, LATEST),
                        os.path.join(folder, PREVIOUS)) if os.path.exists(p)]


def load_with_fallback(trainer, folder, log=None):
    """Loads the newest readable snapshot of ``folder`` into ``trainer``.

    Returns the file name loaded (``snapshot_latest`` or
    ``snapshot_previous``) or ``None`` (nothing readable: the trainer is
    left as built, i.e. the run starts afresh). Every unreadable file and
    the decision taken are reported through ``log`` (default: stderr).
    """
    log = log or (lambda text: print(text, file=sys.stderr, flush=True))
    tried = []
    needed = needed_keys(trainer)
    for name in (LATEST, PREVIOUS):
        path = os.path.join(folder, name)
        problem = check_snapshot(path, needed)
        if problem is None:
            chainer.serializers.load_npz(path, trainer)
            if tried:
                log('[resume] {}: falling back to {} (iteration {})'.format(
                    folder, name, trainer.updater.iteration))
            return name
        if problem != 'missing':
            log('[resume] {}: {} is unreadable ({})'.format(folder, name,
                                                            problem))
        tried.append(name)
    log('[resume] {}: no readable snapshot ({}): starting afresh'.format(
        folder, ', '.join(tried)))
    return None


def _remove_stale_temporaries(folder):
    """Temporary files of snapshots a kill interrupted."""
    for name in os.listdir(folder):
        if name.startswith('.tmp_snapshot'):
            try:
                os.remove(os.path.join(folder, name))
            except OSError:
                pass


def write_snapshot(trainer, folder):
    """Writes the trainer's snapshot as described in the module docstring."""
    latest = os.path.join(folder, LATEST)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp_snapshot.')
    try:
        with os.fdopen(fd, 'wb') as f:
            chainer.serializers.save_npz(f, trainer)
            fault_point('snapshot_write')
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(latest):
            keep = os.path.join(folder, '.tmp_snapshot_previous')
            if os.path.exists(keep):
                os.remove(keep)
            try:
                os.link(latest, keep)
            except OSError:     # no hard links on this file system
                shutil.copyfile(latest, keep)
            os.replace(keep, os.path.join(folder, PREVIOUS))
            fault_point('snapshot_rotate')
        os.replace(tmp, latest)
        fault_point('snapshot_done')
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class Snapshot(extension.Extension):
    """The trainer snapshot of a run (see the module docstring); register
    it with the snapshot trigger and ``name='snapshot'``.

    Args:
        autoload (bool): resume from the newest readable snapshot of the
            trainer's output folder when the trainer starts.
        log: ``log(text)`` for the resume messages (default: stderr).
    """

    priority = -100     # as Chainer's snapshot: after every other writer

    def __init__(self, autoload=False, log=None):
        self.autoload = autoload
        self.log = log
        self.loaded_from = None

    def initialize(self, trainer):
        if not os.path.isdir(trainer.out):
            return
        _remove_stale_temporaries(trainer.out)
        if self.autoload:
            self.loaded_from = load_with_fallback(trainer, trainer.out,
                                                  self.log)

    def __call__(self, trainer):
        os.makedirs(trainer.out, exist_ok=True)
        write_snapshot(trainer, trainer.out)
