"""Command line of the table scripts: run a grid (or some cells) of a config.

::

    python experiments/table1.py --config configs/table1.yaml \\
        [--only model=resnet20,dataset=cifar10,mode=adaptive,seed=0] \\
        [--set train.lr=0.05 --set grid.seeds=[0,1]] [--resume] [--force] \\
        [--out results] [--mpi] [--jobs N] [--list] [--help-config]

Runs already finished (or diverged) are skipped, so the same command can be
re-run after a crash; ``--resume`` continues unfinished runs from their last
snapshot (and finished ones whose stop point was raised); ``--force`` reruns
everything selected. After the runs the table of the config's ``layout`` is
built from ``<out>/<table>/`` and printed.

Under ``mpiexec -n P`` with ``--mpi`` (or ``distributed: true``) every cell
is trained data-parallel on P ranks with ChainerMN; rank 0 writes.
"""
import argparse
import os
import sys
import time

from ada_loss.experiment import config as C
from ada_loss.experiment import grid as G
from ada_loss.experiment import runinfo as R


def _switches(parser, *flags):
    """``store_true`` flags, each ``(flag, help)``."""
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
                   help='run only matching cells: model=..,dataset=..,'
                        'mode=..,seed=.. (values joined by |); repeatable')
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
              ('--no-table', 'do not build the table at the end'),
              ('--help-config', 'print the config schema and exit'))
    return p


def prepare(args):
    """Config and selected cells from parsed arguments (raises ConfigError
    or ValueError before anything runs)."""
    cfg = C.load_config(args.config, args.set)
    if args.mpi:
        cfg['distributed'] = True
    cells = G.select(G.expand_grid(cfg), args.only)
    if args.jobs < 1:
        raise ValueError('--jobs must be >= 1')
    if cfg['distributed'] and args.jobs != 1:
        raise ValueError('--jobs cannot be combined with --mpi/distributed')
    return cfg, cells


def _stop_point(cfg):
    t = cfg.get('train') or {}
    return t.get('max_iterations'), t.get('epochs')


def _changed_keys(old, new, prefix=''):
    keys = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += _changed_keys(a, b, prefix + str(k) + '.')
        elif a != b:
            keys.append(prefix + str(k))
    return keys


def decide(cfg, cell, out, resume, force):
    """``('run' | 'resume' | 'skip', reason)`` for one cell."""
    from ada_loss.experiment.run import run_config, run_folder
    folder = run_folder(out, cfg, cell)
    info = R.read_run(folder)
    status = info and info.get('status')
    if force or status is None:
        return 'run', 'new' if status is None else 'forced'
    try:
        saved = C.read_yaml(os.path.join(folder, R.CONFIG_YAML))
    except C.ConfigError:
        saved = {}
    current = run_config(cfg, cell)
    changed = [k for k in _changed_keys(saved, current)
               if k != 'description']
    note = '' if not changed else '; config changed since ({}), --force ' \
        'reruns'.format(', '.join(changed[:4]))
    if status == R.DIVERGED:
        return 'skip', 'diverged before' + note
    if status == R.FINISHED:
        if resume and _stop_point(saved) != _stop_point(current):
            return 'resume', 'stop point changed'
        return 'skip', 'finished' + note
    return ('resume', 'unfinished') if resume else ('run', 'restart')


def preload(cfg, cells):
    """Loads every dataset the cells need (missing files fail here, before
    any training). Returns {(dataset, data section repr): (train, test)}."""
    from ada_loss.experiment.data import load_datasets
    cache = {}
    for cell in cells:
        data = C.config_for_model(cfg, cell.model)['data']
        key = (cell.dataset, repr(sorted(data.items())))
        if key not in cache:
            cache[key] = load_datasets(cell.dataset, data)
    return cache


def _datasets_for(cache, cfg, cell):
    data = C.config_for_model(cfg, cell.model)['data']
    return cache[(cell.dataset, repr(sorted(data.items())))]


def summary_line(info):
    acc = info.get('final_test_accuracy')
    best = info.get('best_test_accuracy')
    text = '{:<40s} {:<9s}'.format(info['name'], info['status'])
    if acc is not None:
        text += ' test acc {:6.2f}% (best {:6.2f}%)'.format(100 * acc,
                                                            100 * best)
    text += ' skipped {:d}, {:d} it, {:.1f} s'.format(
        info.get('skipped_steps') or 0, info.get('iterations') or 0,
        info.get('wall_time_s') or 0.0)
    if info['status'] == R.DIVERGED and info.get('error'):
        text += '\n      ' + info['error'].split('. ')[0]
    return text


def _run_cell_in_worker(cfg, cell, out, resume):
    """Entry of a ``--jobs`` worker process."""
    import io
    import contextlib
    from ada_loss.experiment.run import run_one
    cfg['log']['progress'] = 'none'
    with contextlib.redirect_stdout(io.StringIO()):
        return run_one(cfg, cell, out, resume=resume)


def run_cells(cfg, cells, out, resume=False, force=False, comm=None,
              jobs=1, log=print, cache=None):
    """Runs the cells (see :func:`decide`); returns their run.json dicts.
    ``cache``: datasets from :func:`preload` (loaded here if None)."""
    from ada_loss.experiment.run import run_one
    rank0 = comm is None or comm.rank == 0
    plan = [(c,) + decide(cfg, c, out, resume, force) for c in cells]
    todo = [(c, action) for c, action, _ in plan if action != 'skip']
    if rank0:
        log('[grid] {} runs selected: {} to train, {} skipped'.format(
            len(cells), len(todo), len(cells) - len(todo)))
        for c, action, reason in plan:
            if action == 'skip':
                log('[skip] {} ({})'.format(G.run_name(c), reason))
    if cache is None:
        cache = preload(cfg, [c for c, _ in todo])
    results = []
    t0 = time.time()
    if jobs == 1:
        for i, (cell, action) in enumerate(todo):
            if rank0:
                log('[{}/{}] {} {}'.format(i + 1, len(todo), action,
                                           G.run_name(cell)))
            info = run_one(cfg, cell, out, resume=(action == 'resume'),
                           comm=comm,
                           datasets=_datasets_for(cache, cfg, cell))
            if rank0:
                log('[{}/{}] {}  (grid {:.0f} s)'.format(
                    i + 1, len(todo), summary_line(info), time.time() - t0))
            results.append(info)
        return results
    import concurrent.futures
    import multiprocessing
    for var in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'):
        os.environ.setdefault(var, '1')
    ctx = multiprocessing.get_context('spawn')
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as ex:
        futures = {ex.submit(_run_cell_in_worker, cfg, cell, out,
                             action == 'resume'): cell
                   for cell, action in todo}
        log('[grid] training {} runs, {} at a time'.format(len(todo), jobs))
        for i, fut in enumerate(concurrent.futures.as_completed(futures)):
            info = fut.result()
            log('[{}/{}] {}  (grid {:.0f} s)'.format(
                i + 1, len(todo), summary_line(info), time.time() - t0))
            results.append(info)
    return results


def parse_args(argv, default_config=None, description=None, defaults=None):
    """The grid runner's command line; ``defaults`` overrides argument
    defaults (e.g. ``{'jobs': 2}``)."""
    parser = build_parser(description, default_config)
    parser.set_defaults(**(defaults or {}))
    return parser.parse_args(argv)


def main(argv=None, default_config=None, description=None, defaults=None,
         after=None):
    """Entry point of ``experiments/table1.py``, ``table4.py`` and the mini
    reproduction. ``defaults`` overrides argument defaults (e.g.
    ``{'jobs': 2}``); ``after(cfg, args, table)`` runs on rank 0 at the
    end."""
    args = parse_args(argv, default_config, description, defaults)
    if args.help_config:
        print(C.describe_schema())
        return 0
    try:
        cfg, cells = prepare(args)
    except ValueError as e:        # ConfigError is a ValueError
        print('error: {}'.format(e), file=sys.stderr)
        return 2
    if args.list:
        from ada_loss.experiment.run import run_folder
        for c in cells:
            info = R.read_run(run_folder(args.out, cfg, c))
            print('{:<40s} {}'.format(G.run_name(c),
                                      (info or {}).get('status', '-')))
        return 0
    try:
        cache = preload(cfg, cells)
    except (OSError, ValueError) as e:   # DatasetNotFoundError, bad files
        print('error: {}'.format(e), file=sys.stderr)
        return 2
    comm = None
    if cfg['distributed']:
        from ada_loss.training.distributed import create_communicator
        comm = create_communicator('naive')
    run_cells(cfg, cells, args.out, args.resume, args.force, comm, args.jobs,
              cache=cache)
    if comm is not None and comm.rank != 0:
        return 0
    table = None
    if not args.no_table:
        from ada_loss.experiment.tables import write_tables
        table = write_tables(os.path.join(args.out, cfg['table']),
                             cfg['layout'])
    if after is not None:
        after(cfg, args, table)
    return 0


# -- Tables 2, 3 and 5: one process runs the selected cells in turn ----------
def build_table_parser(description, default_config, only_help=None):
    """The command line of ``experiments/table2_imagenet.py`` and
    ``experiments/table3_ssd.py``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument('--config', default=default_config)
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE')
    p.add_argument('--only', action='append', default=[], help=only_help)
    p.add_argument('--out', default='results')
    _switches(p, *((flag, None) for flag in (
        '--resume', '--force', '--mpi', '--list', '--table-only')))
    return p


def load_or_exit(load_config, args):
    """``load_config(args.config, args.set)``; a ConfigError exits."""
    try:
        return load_config(args.config, args.set)
    except C.ConfigError as e:
        raise SystemExit('error: {}'.format(e))


def run_table_cells(args, cfg, cells, name_of, run, write_table):
    """Runs the cells not finished or diverged (all with ``--force``; none
    with ``--table-only``; ``--list`` prints their status instead), then
    ``write_table(<out>/<table>)`` on rank 0. ``run(cfg, cell, out,
    resume=, comm=)`` trains one cell, ``name_of(cell)`` is its folder."""
    results = os.path.join(args.out, cfg['table'])
    comm = None
    if args.mpi or cfg['distributed']:
        from ada_loss.training.distributed import create_communicator
        comm = create_communicator()
    for cell in cells:
        status = (R.read_run(os.path.join(results, name_of(cell))) or
                  {}).get('status', 'missing')
        if args.list:
            print('{:45s} {}'.format(name_of(cell), status))
            continue
        if args.table_only or (status in (R.FINISHED, R.DIVERGED)
                               and not args.force):
            continue
        run(cfg, cell, args.out, resume=args.resume, comm=comm)
    if not args.list and (comm is None or comm.rank == 0):
        write_table(results)
    return 0
