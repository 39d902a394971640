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
* **Checking against the trainer** (:func:`load_checked`): a readable
  snapshot whose keys, shapes or dtypes do not fit the trainer (written by
  another config, model or version; a bit flip in the archive's names) is a
  :class:`SnapshotMismatchError` naming the key, what the trainer expected
  and what the file holds. Loading falls back to ``snapshot_previous`` as
  for an unreadable file; when no snapshot fits, the run stops with that
  error instead of starting afresh, so that a snapshot of another run is
  never overwritten.
* **No code from a file**: snapshots are read by
  :mod:`ada_loss.training.safe_npz` (``allow_pickle=False``, every member's
  header checked first): a file holding pickled objects is no damaged
  snapshot but one this project never writes, so loading stops with an
  :class:`~ada_loss.training.safe_npz.UnsafeNpzError` naming the file
  (no fallback, nothing overwritten, nothing unpickled).
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
from ada_loss.training.safe_npz import (
    CheckingDeserializer, NpzKeyMissing, NpzMismatchError, UnsafeNpzError,
    open_npz)

LATEST = 'snapshot_latest'
PREVIOUS = 'snapshot_previous'
#: a key every trainer snapshot holds (the updater's iteration counter)
_REQUIRED_KEY = 'updater/iteration'


def check_snapshot(path):
    """``None`` if ``path`` is a complete, readable trainer snapshot, else
    the reason it is not (a short text).

    Raises:
        UnsafeNpzError: the file holds pickled objects (not a damaged
            snapshot: no run of this project writes one).
    """
    try:
        with open_npz(path) as npz:
            names = list(npz.files)
            for name in names:      # streams and CRC-checks every array
                npz.verify(name)    # (never a whole one in memory)
    except FileNotFoundError:
        return 'missing'
    except UnsafeNpzError:
        raise
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile,
            zlib.error) as e:
        return '{}: {}'.format(type(e).__name__, e)
    if _REQUIRED_KEY not in names:
        return 'not a trainer snapshot (no {})'.format(_REQUIRED_KEY)
    return None


#: a readable snapshot that does not fit the trainer it is loaded into
#: (``key``: the serializer key at fault)
SnapshotMismatchError = NpzMismatchError
#: a key the trainer holds is not in the snapshot (a KeyError too)
SnapshotKeyMissing = NpzKeyMissing


def _update_rules(trainer):
    """[(update rule, its state)] of every parameter the trainer's
    optimizers update."""
    rules = []
    for opt in trainer.updater.get_all_optimizers().values():
        for param in opt.target.params():
            rule = getattr(param, 'update_rule', None)
            if rule is not None:
                rules.append((rule, rule._state))
    return rules


def load_checked(path, trainer):
    """Loads the snapshot ``path`` into ``trainer`` after a dry run that
    checks every value against the trainer (raises
    :class:`SnapshotMismatchError` before any array is copied in)."""
    with open_npz(path) as npz:
        # Chainer's UpdateRule.serialize sets its state to {} before asking
        # for its entries: put back what a failed dry run left
        rules = _update_rules(trainer)
        try:
            CheckingDeserializer(npz, holder='trainer').load(trainer)
        except BaseException as e:
            for rule, state in rules:
                rule._state = state
            if isinstance(e, SnapshotMismatchError) or not isinstance(
                    e, Exception):
                raise
            # a serialize method that could not use what the file holds
            # (e.g. the random streams' state of corrupted text)
            raise SnapshotMismatchError('', 'does not load ({}: {})'.format(
                type(e).__name__, ' '.join(str(e).split())[:200])) from e
        try:
            chainer.serializers.NpzDeserializer(npz).load(trainer)
        except (KeyError, TypeError, ValueError) as e:  # past the dry run
            raise SnapshotMismatchError('', 'does not load ({}: {})'.format(
                type(e).__name__, e))


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

    Raises:
        SnapshotMismatchError: readable snapshots exist but none fits the
            trainer (they are left as they are).
    """
    log = log or (lambda text: print(text, file=sys.stderr, flush=True))
    tried, mismatch, fresh = [], None, None
    for name in (LATEST, PREVIOUS):
        path = os.path.join(folder, name)
        problem = check_snapshot(path)
        if problem is None:
            if fresh is None:
                fresh = _state_of(trainer)
            try:
                load_checked(path, trainer)
            except SnapshotMismatchError as e:
                # what the dry run took of it is undone: the next candidate
                # (or the error) starts from the trainer as built
                chainer.serializers.NpzDeserializer(
                    fresh, strict=False).load(trainer)
                log('[resume] {}: {} does not fit this run: {}'.format(
                    folder, name, e))
                mismatch = mismatch or e
                tried.append(name)
                continue
            if tried:
                log('[resume] {}: falling back to {} (iteration {})'.format(
                    folder, name, trainer.updater.iteration))
            return name
        if problem != 'missing':
            log('[resume] {}: {} is unreadable ({})'.format(folder, name,
                                                            problem))
        tried.append(name)
    if mismatch is not None:
        # a snapshot of another config: starting afresh would overwrite it
        raise SnapshotMismatchError(mismatch.key, '{}: cannot resume: {} '
                                    'does not fit this run ({}); the run '
                                    'was not started and its snapshots are '
                                    'kept (another config? --force starts '
                                    'afresh)'.format(folder, LATEST, mismatch))
    log('[resume] {}: no readable snapshot ({}): starting afresh'.format(
        folder, ', '.join(tried)))
    return None


def _state_of(trainer):
    """A copy of every array a save of ``trainer`` holds (its state as
    built, before a load)."""
    saver = chainer.serializers.DictionarySerializer()
    try:
        saver.save(trainer)
    except RuntimeError:
        # a trainer not started yet (a direct call, not Snapshot.initialize)
        # has no elapsed time, which Trainer.serialize writes last: every
        # other array is saved
        pass
    return {k: numpy.array(v, copy=True) for k, v in saver.target.items()}


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
