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
  finished ones whose stop point was raised). A run whose data files or
  MPI world size changed since (``run.json``'s ``data``, ``world_size``:
  :mod:`ada_loss.experiment.provenance`) is neither continued nor reused:
  refused, naming what changed (``--force`` retrains it).
* ``--only`` (repeatable; a cell matching any is run): ``key=value`` items
  joined by ``,``, with the keys of the study's cells (e.g. model, dataset,
  mode, seed) and values of one key joined by ``|``. A mode's own options
  may contain commas (``mode=adaptive:t_uf=0.001,update_interval=10``).
* A run folder is locked while a process trains in it
  (:class:`RunFolderLock`): a second process gets an error naming the
  folder and the holder's pid.
* A bad config, a bad ``--only``, missing data, an unwritable results
  folder or a refused run (:func:`decide`) ends the command with one
  ``error:`` line (exit status 2) before anything is created; Ctrl-C ends
  it with one line on how to continue (``--resume``).
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
from ada_loss.experiment import provenance
from ada_loss.experiment import runinfo as R
from ada_loss.training.distributed import create_communicator
from ada_loss.training.safe_npz import UnsafeNpzError
from ada_loss.training.snapshot import (SnapshotMismatchError,
                                         snapshot_candidates)


class Study(object):
    """What an entry runs. Subclasses set :attr:`Config` and :attr:`Cell`
    and implement :meth:`cells`, :meth:`run` and :meth:`write_tables`."""

    #: the config dataclass (:mod:`ada_loss.experiment.config`)
    Config = None
    #: the cell type: a namedtuple whose fields are the ``--only`` keys
    Cell = None
    #: ``--only`` key aliases, e.g. ``{'batch': 'batchsize'}``
    only_aliases = {}
    #: ``--only`` keys whose text is parsed by a config value type (as the
    #: config parses the cells' values), e.g. ``{'format': C.FormatName}``
    #: (modes and precisions are found from the cells' values)
    only_types = {}

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

    #: dotted keys of the run config that change none of its numbers
    #: besides :data:`PRESENTATION` (e.g. a study's own settings of what it
    #: draws after the grid): not compared on a rerun
    not_compared = ()
    #: dotted keys of the run config that say where training stops:
    #: ``--resume`` continues a finished run when they changed, and they may
    #: change under ``--resume`` (any other key may not)
    stop_keys = ()

    def data_record(self, cfg, cell):
        """What the cell's run reads as data
        (:func:`ada_loss.experiment.provenance.data_record`): recorded in
        its ``run.json`` (``data``) and compared before the run is
        continued or reused; None (the default): nothing recorded or
        compared. Reads the files' bytes (cached per process), loads
        nothing."""
        return None

    def preload(self, cfg, cells):
        """Loads what the cells need (missing files fail here, before any
        training); the result is passed to :meth:`run` as ``cache``."""
        return None

    def run(self, cfg, cell, out, resume=False, comm=None, cache=None):
        """Trains (or computes) one cell, writes its folder, returns its
        ``run.json`` dict."""
        raise NotImplementedError

    def write_tables(self, cfg, out, quiet=False, train=True):
        """Builds the study's tables from ``<out>/<table>/``; returns the
        main one (or None). ``train`` False (``--table-only``): a study
        whose outputs need runs of their own (the depth study's Fig. 4)
        trains none and says what is missing."""
        return None

    def runs_elsewhere(self, cfg):
        """Whether ``--table-only`` has runs to tabulate even where the
        table's folder has none (the depth study's ``study.runs_from``)."""
        return False

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


def _normalize(key, value, example, parsed=None):
    """A ``--only`` value as the cells hold it: parsed as the config parses
    the cells' values (``parsed``, or a mode, a precision:
    :func:`C.value_type_of`), or as a bool, int or float like the cells'
    values."""
    # a key whose cells hold None (a grid without precisions) still parses
    # its values, so that a bad one is named with its reason
    parsed = parsed or C.value_type_of(example) or _ONLY_TYPES.get(key)
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


def parse_only(text, cells, aliases=None, types=None):
    """``'model=resnet20,mode=adaptive|fp32,seed=0'`` -> {field: set of
    values}, keys being the cells' fields (or ``aliases`` of them), values
    parsed by ``types[field]`` where given."""
    aliases, types = aliases or {}, types or {}
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
        out[key] = {_normalize(key, v, example, types.get(key))
                    for value in values for v in value.split('|')}
    return out


def select(cells, only=(), aliases=None, types=None):
    """Cells matching any of the ``--only`` texts (all cells if none).

    Raises:
        ValueError: a bad item, or a filter that matches no cell (naming the
            grid's values).
    """
    if not only:
        return list(cells)
    chosen = []
    for text in only:
        filters = parse_only(text, cells, aliases, types)
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
#: keys of a run config that do not change its numbers: free text, the
#: table layout, and the log section (what is recorded and shown: the
#: console, intervals, plots, a probe or TensorBoard may change for the
#: rest of a run, docs/fp8_diagnosis.md); not compared on a rerun
PRESENTATION = ('description', 'layout', 'log')
#: keys that say how a run's data is obtained, not which data (a fetch keeps
#: only files with the publishers' checksums): not compared on a rerun
#: either, so that runs made before they existed are not "changed"
FETCHING = ('data.download', 'data.mirror')


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


def config_changes(saved, current, ignored=()):
    """The dotted keys that determine a run's numbers and differ between
    its ``config.yaml`` (``saved``) and the current config (presentation
    keys, :data:`PRESENTATION`, the fetch settings, :data:`FETCHING`, and
    ``ignored`` left out)."""
    skip = PRESENTATION + FETCHING + tuple(ignored)
    return [k for k in changed_keys(saved, current)
            if not any(k == p or k.startswith(p + '.') for p in skip)]


class RunRefused(ValueError):
    """Runs that the command would continue or restart against what it
    was told (a changed config, an unfinished run without ``--resume``)."""


class TableRefused(ValueError):
    """A table that would pool what does not belong together (issue 47,
    item 3: e.g. a peer's run of another model shape or corpus): the
    entry prints its one ``error:`` line instead of a table."""


def _keys_text(keys):
    return ', '.join(keys[:6]) + (', …' if len(keys) > 6 else '')


def decide(study, cfg, cell, out, resume, force, world_size=1):
    """``('run' | 'resume' | 'skip' | 'refuse', reason)`` for one cell.

    A finished (or diverged) run is skipped, naming the keys changed since
    (``--force`` reruns); with ``--resume`` it continues when only its
    stop point (:attr:`Study.stop_keys`) changed. An unfinished run (status
    ``running`` or ``interrupted``, or snapshots without ``run.json``)
    continues with ``--resume`` when its config is the same but for the
    stop point, and is refused otherwise (``--force`` restarts it): one
    behaviour for every entry, and never two configs in one run.

    A run to be skipped or continued is refused when the data files it
    read (:meth:`Study.data_record`) or its MPI world size differ from
    the current ones (``world_size``), naming what changed
    (:func:`ada_loss.experiment.provenance.check`); a run recorded before
    the data records is reused or continued with ``data unverified`` in
    its reason.
    """
    action, reason = _decide_by_config(study, cfg, cell, out, resume, force)
    if action not in ('skip', 'resume'):
        return action, reason
    info = R.read_run(study.folder(out, cfg, cell))
    problem, note = provenance.check(
        info, lambda: study.data_record(cfg, cell), world_size)
    if problem is not None:
        return 'refuse', '{}: {}; {}: undo the change, or --force {} ' \
            'it'.format(study.run_name(cfg, cell), problem,
                        'reusing it would report numbers of other inputs'
                        if action == 'skip' else 'continuing it would mix '
                        'two inputs in one run',
                        'retrains' if action == 'skip' else 'restarts')
    return action, reason + ('; ' + note if note else '')


def _decide_by_config(study, cfg, cell, out, resume, force):
    """:func:`decide` by status and ``config.yaml`` alone."""
    folder = study.folder(out, cfg, cell)
    info = R.read_run(folder)
    status = info and info.get('status')
    if force:
        return 'run', 'new' if status is None else 'forced'
    if status is None and not snapshot_candidates(folder):
        return 'run', 'new'
    name = study.run_name(cfg, cell)
    path = os.path.join(folder, R.CONFIG_YAML)
    try:
        saved = C.read_yaml(path)
    except C.ConfigError:
        saved = None
    current = C.to_plain(study.run_config(cfg, cell))
    if saved is None:
        changed, note = None, '; its config.yaml is missing or unreadable, ' \
            '--force reruns'
    else:
        changed = config_changes(saved, current, study.not_compared)
        note = '' if not changed else '; config changed since ({}), ' \
            '--force reruns'.format(_keys_text(changed))
    moved = [k for k in changed or () if k in study.stop_keys]
    other = None if changed is None else [k for k in changed
                                          if k not in study.stop_keys]
    if status == R.DIVERGED:
        return 'skip', 'diverged before' + note
    if status == R.FINISHED:
        if resume and moved and not other:
            return 'resume', 'stop point changed'
        return 'skip', 'finished' + note
    # unfinished: a run that stopped (or lost its run.json) mid-way
    what = 'unfinished' if status else 'unfinished (run.json missing)'
    if not resume:
        return 'refuse', ('{}: {}; --resume continues it from its snapshot, '
                          '--force restarts it'.format(name, what))
    if other is None:
        return 'refuse', ('{}: {}, and its config.yaml is missing or '
                          'unreadable, so --resume cannot check that the '
                          'config is the same; --force restarts it'.format(
                              name, what))
    if other:
        return 'refuse', ('{}: config changed since it started ({}); '
                          '--resume would continue it under another config: '
                          'undo the change, or --force restarts it'.format(
                              name, _keys_text(other)))
    return 'resume', what


def plan_cells(study, cfg, cells, out, resume=False, force=False,
               world_size=1):
    """``[(cell, action, reason)]`` of :func:`decide` (``world_size``: the
    MPI ranks the runs would train on).

    Raises:
        RunRefused: naming every refused run, before anything runs.
    """
    plan = [(c,) + decide(study, cfg, c, out, resume, force, world_size)
            for c in cells]
    refused = [reason for _, action, reason in plan if action == 'refuse']
    if refused:
        raise RunRefused('{} run{} not run: {}{}'.format(
            len(refused), 's' if len(refused) > 1 else '',
            ' | '.join(refused[:4]), ' | and {} more'.format(
                len(refused) - 4) if len(refused) > 4 else ''))
    return plan


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
              jobs=1, log=print, cache=None, plan=None):
    """Runs the cells that :func:`decide` does not skip, ``jobs`` at a time
    (worker processes) or in turn; returns their run.json dicts.
    ``cache``: what :meth:`Study.preload` returned (loaded here if None);
    ``plan``: what :func:`plan_cells` returned (made here if None)."""
    rank0 = comm is None or comm.rank == 0
    if plan is None:
        plan = plan_cells(study, cfg, cells, out, resume, force,
                          1 if comm is None else comm.size)
    todo = [(c, action) for c, action, _ in plan if action != 'skip']
    reasons = {c: reason for c, _, reason in plan}
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
                log('[{}/{}] {} {}{}'.format(
                    i + 1, len(todo), action, study.run_name(cfg, cell),
                    ' ({})'.format(reasons[cell]) if action == 'resume'
                    else ''))
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
    cells = select(study.cells(cfg), args.only, study.only_aliases,
                   study.only_types)
    if args.jobs < 1:
        raise ValueError('--jobs must be >= 1')
    if getattr(cfg, 'distributed', False) and args.jobs != 1:
        raise ValueError('--jobs cannot be combined with --mpi/distributed')
    return cfg, cells


def _error(e):
    print('error: {}'.format(e), file=sys.stderr)
    return 2


def check_writable(path):
    """Raises ValueError unless ``path`` (or, where it does not exist yet,
    the folder it would be made in) can be written: one error line before
    anything is created, not a PermissionError half-way."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise ValueError('cannot write results under {}: {} is not a '
                         'folder'.format(path, probe))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ValueError('cannot write results under {}: {} is not '
                         'writable'.format(path, probe))


def main(study, argv=None, default_config=None, description=None,
         defaults=None, after=None):
    """The entry point of every ``experiments/*.py``: parse, check, run the
    cells, build the tables. ``after(cfg, args, table)`` runs on rank 0 at
    the end. Returns the exit status: 0, 2 for a user error (one
    ``error:`` line, before anything is created), 130 when interrupted
    (Ctrl-C: one line saying how to continue)."""
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
    table_dir = os.path.join(args.out, cfg.table)
    comm = None
    if args.table_only:
        if not R.find_runs(table_dir) and not study.runs_elsewhere(cfg):
            return _error('no runs under {} to build tables from (--table-'
                          'only trains nothing; leave it out to train the '
                          'grid)'.format(table_dir))
    else:
        if getattr(cfg, 'distributed', False):
            # first: the world size is what a rerun is checked against
            comm = create_communicator('naive')
        try:
            plan = plan_cells(study, cfg, cells, args.out, args.resume,
                              args.force, 1 if comm is None else comm.size)
            check_writable(table_dir)
            cache = study.preload(cfg, [c for c, action, _ in plan
                                        if action != 'skip'])
        except (OSError, ValueError) as e:   # refused; DatasetNotFoundError
            return _error(e)
        try:
            run_cells(study, cfg, cells, args.out, args.resume, args.force,
                      comm, args.jobs, cache=cache, plan=plan)
        except (RunFolderLocked, C.ConfigError, PermissionError,
                SnapshotMismatchError, UnsafeNpzError) as e:
            return _error(e)          # lock; ranks; permissions; --resume
        except KeyboardInterrupt:
            print('\ninterrupted: the run stopped at its last snapshot (its '
                  'run.json says "interrupted"); the same command with '
                  '--resume continues it', file=sys.stderr)
            return 130
    if comm is not None and comm.rank != 0:
        return 0
    table = None
    if not args.no_table:
        try:
            table = study.write_tables(cfg, args.out,
                                       train=not args.table_only)
        except TableRefused as e:   # the runs are kept; only the table is not
            return _error(e)
    if after is not None:
        after(cfg, args, table)
    return 0
