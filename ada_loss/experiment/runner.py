"""The one run path of every entry: a study's cells, run or skipped, then its
tables.

An entry (``experiments/*.py``) names a :class:`Study` — its config class,
its cells, how one cell trains and which tables it builds — and calls
:func:`main`::

    python experiments/<entry>.py [--config FILE] [--set key=value ...] \\
        [--only key=v1|v2,key=v ...] [--out results] [--resume] [--force] \\
        [--mpi] [--jobs N] [--list] [--table-only] [--no-table] \\
        [--help-config]

* A cell's run lives in its folder (``Study.folder``) with ``config.yaml``
  and ``run.json`` (:mod:`ada_loss.experiment.runinfo`). Runs already
  finished (or diverged) are skipped, so the same command can be re-run
  after a crash; a changed config is named (``--force`` reruns);
  ``--resume`` continues unfinished runs from their last snapshot (and
  finished ones whose stop point was raised).
* ``--only`` (repeatable; a cell matching any is run): ``key=value`` items
  joined by ``,``, with the keys of the study's cells (e.g. model, dataset,
  mode, seed) and values of one key joined by ``|``. A mode's own options
  may contain commas (``mode=adaptive:t_uf=0.001,update_interval=10``).
* A run folder is locked while a process trains in it
  (:class:`RunFolderLock`): a second process gets an error naming the
  folder and the holder's pid.
* A bad config, a bad ``--only`` or missing data ends the command with one
  ``error:`` line (exit status 2) before anything trains.
* Under ``mpiexec -n P`` with ``--mpi`` (or ``distributed: true``) every
  cell is trained data-parallel on P ranks with ChainerMN; rank 0 writes.
"""
import argparse
import concurrent.futures
import contextlib
import fcntl
import io
import multiprocessing
import os
import sys
import time

from ada_loss.experiment import config as C
from ada_loss.experiment import runinfo as R
from ada_loss.training.distributed import create_communicator
from ada_loss.training.snapshot import SnapshotMismatchError


class Study(object):
    """What an entry runs. Subclasses set :attr:`Config` and :attr:`Cell`
    and implement :meth:`cells`, :meth:`run` and :meth:`write_tables`."""

    #: the config dataclass (:mod:`ada_loss.experiment.config`)
    Config = None
    #: the cell type: a namedtuple whose fields are the ``--only`` keys
    Cell = None
    #: ``--only`` key aliases, e.g. ``{'batch': 'batchsize'}``
    only_aliases = {}

    def load_config(self, path, overrides):
        """The checked config of a file and ``--set`` overrides."""
        return C.load(self.Config, path, overrides)

    def cells(self, cfg):
        """Every cell of the config's grid, in the order they run."""
        raise NotImplementedError

    def run_name(self, cfg, cell):
        """The name of a cell's run folder."""
        raise NotImplementedError

    def folder(self, out, cfg, cell):
        return os.path.join(out, cfg.table, self.run_name(cfg, cell))

    def run_config(self, cfg, cell):
        """What a run's ``config.yaml`` holds (compared to detect a changed
        config): the whole config by default."""
        return C.to_dict(cfg)

    @staticmethod
    def cell_config(cfg, cell, **run):
        """A run config made of the cell (``run``, with ``run`` extra keys)
        and every section of ``cfg`` but the grid."""
        out = {'run': C.to_plain(dict(cell._asdict(), **run))}
        out.update((k, v) for k, v in C.to_dict(cfg).items() if k != 'grid')
        return out

    def stop_point(self, run_config):
        """The part of a run config that says where training stops
        (``--resume`` continues a finished run when it changed)."""
        return None

    def preload(self, cfg, cells):
        """Loads what the cells need (missing files fail here, before any
        training); the result is passed to :meth:`run` as ``cache``."""
        return None

    def run(self, cfg, cell, out, resume=False, comm=None, cache=None):
        """Trains (or computes) one cell, writes its folder, returns its
        ``run.json`` dict."""
        raise NotImplementedError

    def write_tables(self, cfg, out, quiet=False):
        """Builds the study's tables from ``<out>/<table>/``; returns the
        main one (or None)."""
        return None

    def summary(self, info):
        """One console line for a run that ended."""
        text = '{:<40s} {:<9s}'.format(info['name'], info['status'])
        acc = info.get('final_test_accuracy')
        if acc is not None:
            best = info.get('best_test_accuracy')
            text += ' test acc {:6.2f}%'.format(100 * acc)
            if best is not None:
                text += ' (best {:6.2f}%)'.format(100 * best)
        text += ' skipped {:d}, {:d} it, {:.1f} s'.format(
            info.get('skipped_steps') or 0, info.get('iterations') or 0,
            info.get('wall_time_s') or 0.0)
        if info['status'] == R.DIVERGED and info.get('error'):
            text += '\n      ' + info['error'].split('. ')[0]
        return text


# -- --only -------------------------------------------------------------------------
#: the value types of --only keys named alike in every study
_ONLY_TYPES = {'mode': C.Mode, 'precision': C.PrecisionName}


def _normalize(key, value, example):
    """A ``--only`` value as the cells hold it: parsed as the config parses
    the cells' values (a mode, a precision: :func:`C.value_type_of`), or as
    a bool, int or float like the cells' values."""
    # a key whose cells hold None (a grid without precisions) still parses
    # its values, so that a bad one is named with its reason
    parsed = C.value_type_of(example) or _ONLY_TYPES.get(key)
    if parsed is not None:
        try:
            return parsed.parse(value, key)
        except C.ConfigError as e:
            raise ValueError('bad --only {}={!r}: {}'.format(
                key, value, str(e).split(': ', 1)[-1]))
    if isinstance(example, bool):
        if value.lower() in ('true', 'yes', '1'):
            return True
        if value.lower() in ('false', 'no', '0'):
            return False
        raise ValueError('--only {} must be true or false, got {!r}'.format(
            key, value))
    if isinstance(example, int):
        try:
            return int(value)
        except ValueError:
            raise ValueError('--only {} must be an integer, got {!r}'.format(
                key, value))
    if isinstance(example, float):
        try:
            return float(value)
        except ValueError:
            raise ValueError('--only {} must be a number, got {!r}'.format(
                key, value))
    return value


def parse_only(text, cells, aliases=None):
    """``'model=resnet20,mode=adaptive|fp32,seed=0'`` -> {field: set of
    values}, keys being the cells' fields (or ``aliases`` of them)."""
    aliases = aliases or {}
    fields = cells[0]._fields if cells else ()
    keys = tuple(fields) + tuple(aliases)
    filters, last = {}, None
    for token in text.split(','):
        key, eq, value = token.partition('=')
        key = aliases.get(key.strip(), key.strip())
        if eq and key in fields:
            last = key
            filters.setdefault(key, []).append(value.strip())
        elif last is not None and token.strip() and getattr(
                C.value_type_of(getattr(cells[0], last))
                or _ONLY_TYPES.get(last), 'commas', False):
            filters[last][-1] += ',' + token.strip()
        elif token.strip():
            raise ValueError('bad --only item {!r}: expected key=value with '
                             'key one of {}'.format(token, ', '.join(keys)))
    out = {}
    for key, values in filters.items():
        example = getattr(cells[0], key)
        out[key] = {_normalize(key, v, example) for value in values
                    for v in value.split('|')}
    return out


def select(cells, only=(), aliases=None):
    """Cells matching any of the ``--only`` texts (all cells if none).

    Raises:
        ValueError: a bad item, or a filter that matches no cell (naming the
            grid's values).
    """
    if not only:
        return list(cells)
    chosen = []
    for text in only:
        filters = parse_only(text, cells, aliases)
        match = [c for c in cells
                 if all(getattr(c, k) in v for k, v in filters.items())]
        if not match:
            values = {k: sorted({str(getattr(c, k)) for c in cells})
                      for k in (cells[0]._fields if cells else ())}
            raise ValueError('--only {!r} matches no run of the grid; the '
                             'grid has {}'.format(text, '; '.join(
                                 '{}={}'.format(k, '|'.join(v))
                                 for k, v in values.items())))
        chosen.extend(c for c in match if c not in chosen)
    return [c for c in cells if c in chosen]


# -- the lock of a run folder ---------------------------------------------------------
class RunFolderLocked(RuntimeError):
    """Another process trains in this run folder."""


class RunFolderLock(object):
    """An exclusive ``fcntl`` lock on ``.<run name>.lock`` beside a run
    folder, held while a process trains in it. The kernel releases it when
    the process exits or is killed, so a crashed run never leaves a stale
    lock; the file holds the holder's pid for the message."""

    def __init__(self, folder):
        folder = os.path.normpath(folder)
        self.folder = folder
        self.path = os.path.join(os.path.dirname(folder),
                                 '.{}.lock'.format(os.path.basename(folder)))
        self._fd = None

    def acquire(self):
        os.makedirs(os.path.dirname(self.path) or '.', exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 64).decode(errors='replace').strip() or '?'
            os.close(fd)
            raise RunFolderLocked(
                'run folder {} is in use: process {} is training in it (lock '
                'file {}); wait for it to end or stop it'.format(
                    self.folder, holder, self.path))
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def release(self):
        if self._fd is not None:
            os.close(self._fd)      # closing the descriptor unlocks
            self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


# -- deciding and running cells ----------------------------------------------------
def changed_keys(old, new, prefix=''):
    """Dotted keys whose values differ between two nested dicts."""
    keys = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += changed_keys(a, b, prefix + str(k) + '.')
        elif a != b:
            keys.append(prefix + str(k))
    return keys


def decide(study, cfg, cell, out, resume, force):
    """``('run' | 'resume' | 'skip', reason)`` for one cell."""
    folder = study.folder(out, cfg, cell)
    info = R.read_run(folder)
    status = info and info.get('status')
    if force or status is None:
        return 'run', 'new' if status is None else 'forced'
    try:
        saved = C.read_yaml(os.path.join(folder, R.CONFIG_YAML))
    except C.ConfigError:
        saved = {}
    current = study.run_config(cfg, cell)
    changed = [k for k in changed_keys(saved, current)
               if k != 'description']
    note = '' if not changed else '; config changed since ({}), --force ' \
        'reruns'.format(', '.join(changed[:4]))
    if status == R.DIVERGED:
        return 'skip', 'diverged before' + note
    if status == R.FINISHED:
        if resume and study.stop_point(saved) != study.stop_point(current):
            return 'resume', 'stop point changed'
        return 'skip', 'finished' + note
    return ('resume', 'unfinished') if resume else ('run', 'restart')


def run_locked(study, cfg, cell, out, resume=False, comm=None, cache=None):
    """:meth:`Study.run` under the run folder's lock (rank 0 holds it)."""
    if comm is not None and comm.rank != 0:
        return study.run(cfg, cell, out, resume=resume, comm=comm,
                         cache=cache)
    with RunFolderLock(study.folder(out, cfg, cell)):
        return study.run(cfg, cell, out, resume=resume, comm=comm,
                         cache=cache)


def _run_in_worker(study, cfg, cell, out, resume, cache):
    """Entry of a ``--jobs`` worker process (console output dropped)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return run_locked(study, cfg, cell, out, resume=resume, cache=cache)


def run_cells(study, cfg, cells, out, resume=False, force=False, comm=None,
              jobs=1, log=print, cache=None):
    """Runs the cells that :func:`decide` does not skip, ``jobs`` at a time
    (worker processes) or in turn; returns their run.json dicts.
    ``cache``: what :meth:`Study.preload` returned (loaded here if None)."""
    rank0 = comm is None or comm.rank == 0
    plan = [(c,) + decide(study, cfg, c, out, resume, force) for c in cells]
    todo = [(c, action) for c, action, _ in plan if action != 'skip']
    if rank0:
        log('[grid] {} runs selected: {} to train, {} skipped'.format(
            len(cells), len(todo), len(cells) - len(todo)))
        for c, action, reason in plan:
            if action == 'skip':
                log('[skip] {} ({})'.format(study.run_name(cfg, c), reason))
    if cache is None:
        cache = study.preload(cfg, [c for c, _ in todo])
    results = []
    t0 = time.time()
    if jobs == 1:
        for i, (cell, action) in enumerate(todo):
            if rank0:
                log('[{}/{}] {} {}'.format(i + 1, len(todo), action,
                                           study.run_name(cfg, cell)))
            info = run_locked(study, cfg, cell, out, action == 'resume',
                              comm, cache)
            if rank0:
                log('[{}/{}] {}  (grid {:.0f} s)'.format(
                    i + 1, len(todo), study.summary(info), time.time() - t0))
            results.append(info)
        return results
    for var in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'):
        os.environ.setdefault(var, '1')
    ctx = multiprocessing.get_context('spawn')
    quiet = quiet_config(cfg)
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as ex:
        futures = {ex.submit(_run_in_worker, study, quiet, cell, out,
                             action == 'resume', cache): cell
                   for cell, action in todo}
        log('[grid] training {} runs, {} at a time'.format(len(todo), jobs))
        for i, fut in enumerate(concurrent.futures.as_completed(futures)):
            info = fut.result()
            log('[{}/{}] {}  (grid {:.0f} s)'.format(
                i + 1, len(todo), study.summary(info), time.time() - t0))
            results.append(info)
    return results


def quiet_config(cfg):
    """The config with console progress off (worker processes)."""
    log = getattr(cfg, 'log', None)     # a training study's Log section
    if log is None:
        return cfg
    return C.replace(cfg, log=C.replace(log, progress='none'))


# -- the command line ---------------------------------------------------------------
def _switches(parser, *flags):
    for flag, text in flags:
        parser.add_argument(flag, action='store_true', help=text)


def build_parser(description=None, default_config=None):
    p = argparse.ArgumentParser(
        description=description or __doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--config', default=default_config,
                   required=default_config is None,
                   help='YAML config (default: %(default)s)')
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                   help='override a config key, value parsed as YAML '
                        '(e.g. train.lr=0.05, grid.seeds=[0,1]); repeatable')
    p.add_argument('--only', action='append', default=[], metavar='FILTER',
                   help="run only matching cells: key=value items joined by "
                        "',' with the cells' keys (values joined by |); "
                        "repeatable")
    p.add_argument('--out', default='results',
                   help='results root; runs go to OUT/<table>/<run>/ '
                        '(default: %(default)s)')
    _switches(p, ('--resume', 'continue unfinished runs from their snapshot'),
              ('--force', 'rerun selected runs even if finished'),
              ('--mpi', 'ChainerMN data parallelism (run under mpiexec)'))
    p.add_argument('--jobs', type=int, default=1,
                   help='runs trained at once in separate processes '
                        '(not with --mpi; default 1)')
    _switches(p, ('--list', 'print the selected runs and their status, '
                  'then exit'),
              ('--table-only', 'build the tables from the runs there are, '
                               'train nothing'),
              ('--no-table', 'do not build the tables at the end'),
              ('--help-config', 'print the config schema and exit'))
    return p


def parse_args(argv, default_config=None, description=None, defaults=None):
    """The command line; ``defaults`` overrides argument defaults (e.g.
    ``{'jobs': 2}``)."""
    parser = build_parser(description, default_config)
    parser.set_defaults(**(defaults or {}))
    return parser.parse_args(argv)


def prepare(study, args):
    """Config and selected cells (raises ConfigError or ValueError before
    anything runs)."""
    cfg = study.load_config(args.config, args.set)
    if args.mpi:
        cfg = C.replace(cfg, distributed=True)
    cells = select(study.cells(cfg), args.only, study.only_aliases)
    if args.jobs < 1:
        raise ValueError('--jobs must be >= 1')
    if getattr(cfg, 'distributed', False) and args.jobs != 1:
        raise ValueError('--jobs cannot be combined with --mpi/distributed')
    return cfg, cells


def _error(e):
    print('error: {}'.format(e), file=sys.stderr)
    return 2


def main(study, argv=None, default_config=None, description=None,
         defaults=None, after=None):
    """The entry point of every ``experiments/*.py``: parse, check, run the
    cells, build the tables. ``after(cfg, args, table)`` runs on rank 0 at
    the end. Returns the exit status."""
    args = parse_args(argv, default_config, description, defaults)
    if args.help_config:
        print('\n'.join(C.describe(study.Config) + list(
            getattr(study, 'help_notes', ()))))
        return 0
    try:
        cfg, cells = prepare(study, args)
    except ValueError as e:        # ConfigError is a ValueError
        return _error(e)
    if args.list:
        for c in cells:
            info = R.read_run(study.folder(args.out, cfg, c))
            print('{:<45s} {}'.format(study.run_name(cfg, c),
                                      (info or {}).get('status', '-')))
        return 0
    comm = None
    if not args.table_only:
        try:
            cache = study.preload(cfg, cells)
        except (OSError, ValueError) as e:   # DatasetNotFoundError, files
            return _error(e)
        if getattr(cfg, 'distributed', False):
            comm = create_communicator('naive')
        try:
            run_cells(study, cfg, cells, args.out, args.resume, args.force,
                      comm, args.jobs, cache=cache)
        except (RunFolderLocked, C.ConfigError,
                SnapshotMismatchError) as e:   # lock; ranks; --resume
            return _error(e)
    if comm is not None and comm.rank != 0:
        return 0
    table = None
    if not args.no_table:
        table = study.write_tables(cfg, args.out)
    if after is not None:
        after(cfg, args, table)
    return 0
