"""What a run's numbers depend on besides its config: the data files it
read and the number of data-parallel ranks — recorded in ``run.json`` and
compared before a run is continued (``--resume``) or reused (a finished
run skipped by a plain rerun).

``config.yaml`` holds the config as written: ``data.cifar_root: null``
means "``$ADA_LOSS_CIFAR_ROOT``", so two runs of one config may read two
different folders (issue 50 item 8). ``run.json``'s ``data`` holds instead
what was resolved (:func:`data_record`)::

    "data": {"roots": {"cifar_root": "/abs/path/cifar-10-batches-py"},
             "files": {"data_batch_1": {"size": 31035704,
                                        "sha256": "54636561..."}, ...},
             "fingerprint": "9f0c..."}

``roots``: each data setting's resolved path; ``files``: every file the
loader reads, by its name under its root, with its size and the SHA-256
of its content; ``fingerprint``: the SHA-256 of the sorted ``name size
sha256`` lines. ``world_size`` (the MPI ranks) is a field of ``run.json``
already.

**Cost.** Hashing reads every byte once: 178 MB (CIFAR-10's six
batches) took 0.97 s on the project's 2-core machine, from the page cache.
A digest is cached in the process per (real path, size, modification
time, status-change time, inode), so a grid of many cells hashes each file once per process
(``--jobs`` workers hash again, once each). Sizes and modification times
alone would be cheaper but miss a file rewritten with new content in the
same size (e.g. another random fixture) — the content is what the numbers
depend on.

**Comparison** (:func:`check`): a run whose ``fingerprint`` differs from
the current files', or whose ``world_size`` differs from the current
one, is refused, naming what changed (old → new); equal files under
another root are the same data (noted, not refused). A ``run.json``
written before these records (no ``data``) cannot be checked: it is
reused or continued as before, and the reason printed says ``data
unverified``; a run so continued records the data of its continuation
marked ``earlier_iterations_unverified`` (:func:`run_data`).
"""
import hashlib
import os

from ada_loss.experiment import runinfo as R
from ada_loss.training.snapshot import snapshot_candidates

#: (real path, size, mtime_ns, ctime_ns, inode) -> sha256 hex digest,
#: this process
_DIGESTS = {}
_CHUNK = 1 << 22


def file_sha256(path):
    """The SHA-256 of the file ``path`` (hex), cached in this process while
    its size, modification time, status-change time and inode stay the
    same. The status-change time is what a rewrite in place changes even
    when the modification time is put back (``touch -r``, ``os.utime``):
    no call sets it."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = (real, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    digest = _DIGESTS.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(real, 'rb') as f:
            for chunk in iter(lambda: f.read(_CHUNK), b''):
                h.update(chunk)
        digest = _DIGESTS[key] = h.hexdigest()
    return digest


def data_record(roots, files):
    """The ``run.json`` ``data`` field of a run that reads ``files`` (paths)
    resolved from ``roots`` ({setting: resolved path or a description,
    e.g. the bundled data of a package}). A file is named by its path
    relative to the root it lies under (else its base name)."""
    dirs = [os.path.abspath(r) for r in roots.values()
            if isinstance(r, str) and os.path.isdir(r)]
    entries = {}
    for path in files:
        path = os.path.abspath(path)
        under = [d for d in dirs if path.startswith(d + os.sep)]
        name = (os.path.relpath(path, max(under, key=len)) if under
                else os.path.basename(path))
        entries[name] = {'size': os.path.getsize(path),
                         'sha256': file_sha256(path)}
    lines = ''.join('{} {} {}\n'.format(n, e['size'], e['sha256'])
                    for n, e in sorted(entries.items()))
    return {'roots': dict(roots), 'files': entries,
            'fingerprint': hashlib.sha256(lines.encode()).hexdigest()}


#: in a ``data`` record: the run was continued from a snapshot whose
#: run.json held no record, so its earlier iterations' data are unknown
EARLIER_UNVERIFIED = 'earlier_iterations_unverified'


def run_data(record, folder, resume):
    """The ``data`` field a run writes as it starts in ``folder``:
    ``record`` (None: the study records none), marked
    :data:`EARLIER_UNVERIFIED` when the run continues (``resume`` and a
    snapshot there) from a ``run.json`` without a record, or with that
    mark (so that a record never vouches for iterations it did not see)."""
    if record is None or not (resume and snapshot_candidates(folder)):
        return record
    old = (R.read_run(folder) or {}).get('data')
    if not well_formed(old) or old.get(EARLIER_UNVERIFIED):
        return dict(record, **{EARLIER_UNVERIFIED: True})
    return record


def well_formed(record):
    """Whether ``record`` (a ``run.json`` ``data`` field as read) has the
    shape :func:`data_record` gives it: a dict whose ``fingerprint`` is
    text, ``roots`` a dict and ``files`` a dict of {name: {'size': int,
    'sha256': text}}."""
    if not isinstance(record, dict) or \
            not isinstance(record.get('fingerprint'), str) or \
            not isinstance(record.get('roots'), dict) or \
            not isinstance(record.get('files'), dict):
        return False
    return all(isinstance(e, dict) and isinstance(e.get('size'), int) and
               isinstance(e.get('sha256'), str)
               for e in record['files'].values())


def _short(digest):
    return (digest or '?')[:12] + '…'


def data_changes(old, new):
    """What differs between two ``data`` records (texts ``old → new``),
    the roots first, then up to 3 files; [] when their files are the
    same."""
    if old.get('fingerprint') == new.get('fingerprint'):
        return []
    out = ['{} {} → {}'.format(k, old.get('roots', {}).get(k),
                               new.get('roots', {}).get(k))
           for k in sorted(set(old.get('roots', {})) | set(new['roots']))
           if old.get('roots', {}).get(k) != new['roots'].get(k)]
    a, b = old.get('files', {}), new.get('files', {})
    files = []
    for name in sorted(set(a) | set(b)):
        if name not in b:
            files.append('{} no longer read'.format(name))
        elif name not in a:
            files.append('{} read now'.format(name))
        elif a[name].get('size') != b[name]['size']:
            files.append('{} size {} → {}'.format(name, a[name].get('size'),
                                                  b[name]['size']))
        elif a[name].get('sha256') != b[name]['sha256']:
            files.append('{} sha256 {} → {}'.format(
                name, _short(a[name].get('sha256')),
                _short(b[name]['sha256'])))
    if len(files) > 3:
        files = files[:3] + ['{} more files'.format(len(files) - 3)]
    return out + (files or ['fingerprint {} → {}'.format(
        _short(old.get('fingerprint')), _short(new.get('fingerprint')))])


def check(info, current_data, world_size):
    """``(problem, note)`` for reusing or continuing the run of ``info``
    (its ``run.json``; None: lost) now that the data read would be
    ``current_data()`` (a record; None where the study records none) and
    the ranks ``world_size``.

    ``problem``: None, or one text naming what changed (old → new): the
    run must not be reused or continued. ``note``: None, or what could not
    be checked (``data unverified``: a run.json older than these records,
    or data that cannot be found now), or a root that moved with the same
    files.
    """
    info = info or {}
    old_size = info.get('world_size')
    if old_size is not None and old_size != world_size:
        return ('MPI world size changed since it ran ({} → {} '
                'ranks)'.format(old_size, world_size), None)
    try:
        new, missing = current_data(), None
    except (OSError, ValueError) as e:     # DatasetNotFoundError, ...
        new, missing = None, ' '.join(str(e).split())[:160]
    if new is None and missing is None:
        return None, None                   # the study records no data
    old = info.get('data')
    if old is None:
        return None, 'data unverified: {}'.format(
            'its run.json predates the data records' if info
            else 'its run.json is missing')
    if not well_formed(old):
        return ('its run.json\'s data record is not one this code writes '
                '(edited or damaged), so the data it ran on are unknown'), \
            None
    if missing is not None:
        return None, 'data unverified: ' + missing
    changes = data_changes(old, new)
    if changes:
        return 'data changed since it ran ({})'.format('; '.join(changes)), \
            None
    notes = (['same data files under another root']
             if old.get('roots') != new['roots'] else []) + \
        (['data unverified before its resume from a run.json without data '
          'records'] if old.get(EARLIER_UNVERIFIED) else [])
    return None, '; '.join(notes) or None
