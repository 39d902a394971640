"""A run's folder at its start and at its end: :func:`open_run` writes
``config.yaml`` and the first ``run.json`` (status ``running``),
:func:`run_trainer` runs the training loop and writes the final
``run.json`` (and ``loss_scales.png``). Only rank 0 writes
(:func:`is_writer`); every file is replaced atomically
(:mod:`ada_loss.atomic`)."""
import datetime
import os
import shutil

import threadpoolctl

from ada_loss import atomic
from ada_loss.experiment import runinfo as R
from ada_loss.experiment.plots import plot_loss_scales
from ada_loss.errors import NonFiniteGradientError
from ada_loss.training.faults import fault_point
from ada_loss.training.snapshot import snapshot_candidates


def now():
    return datetime.datetime.now().isoformat(timespec='seconds')


def is_writer(comm):
    return comm is None or comm.rank == 0


def open_run(folder, fields, description, config_text, resume=False,
             comm=None):
    """Starts a run: returns ``(info, resuming)``.

    ``info`` is the ``run.json`` dict: ``fields`` (name, table, model, ...,
    dtype, in order) then git commit, status ``running``, world size, start
    time (kept from the old ``run.json`` when resuming), ``resumed`` and
    ``description``. ``resuming`` is ``resume`` and a snapshot exists. On
    rank 0 the folder is created (replaced unless resuming) with
    ``config.yaml`` (``config_text``) and ``run.json``.
    """
    resuming = bool(resume and snapshot_candidates(folder))
    old = R.read_run(folder) if resuming else None
    info = dict(fields)
    info.update([
        ('git_commit', R.git_commit()), ('status', R.RUNNING),
        ('world_size', 1 if comm is None else comm.size),
        ('started', (old or {}).get('started', now())),
        ('resumed', bool(resuming)), ('description', description),
        ('environment', R.environment())])
    if is_writer(comm):
        if not resuming and os.path.isdir(folder):
            shutil.rmtree(folder)
        os.makedirs(folder, exist_ok=True)
        atomic.write_text(os.path.join(folder, R.CONFIG_YAML), config_text)
        R.write_run(folder, info)
    return info, resuming


def run_trainer(trainer, updater, info, folder, finalize, log_cfg,
                comm=None, threads=1):
    """Runs the trainer; a NonFiniteGradientError ends it as diverged.

    BLAS and OpenMP use ``threads`` threads during the run (recorded as
    ``blas_threads``): a reduction's result depends on how it is split over
    threads, so a fixed count makes the numbers independent of ``--jobs``
    and of whether the run is in a worker process or not. ``resumed_from``
    records the snapshot the run continued from (None: from the start).

    On rank 0 ``finalize(info, error)`` (``error``: the message or None)
    completes ``info`` (see :func:`summarize`), which is written to
    ``run.json``; other ranks only set status and iterations. Returns
    ``info``. A finished run of a layer-wise mode also gets
    ``loss_scales.png`` (if ``log.plot``).
    """
    error = None
    info['blas_threads'] = threads
    try:
        with threadpoolctl.threadpool_limits(limits=threads):
            trainer.run(show_loop_exception_msg=False)
    except NonFiniteGradientError as e:
        error = str(e)
    fault_point('run_end')
    snapshot = trainer.get_extension('snapshot')
    info['resumed_from'] = snapshot.loaded_from
    info['resumed'] = snapshot.loaded_from is not None
    if not is_writer(comm):
        info.update(status=R.DIVERGED if error else R.FINISHED,
                    iterations=updater.iteration)
        return info
    finalize(info, error)
    R.write_run(folder, info)
    scales = os.path.join(folder, 'loss_scales.csv')
    if log_cfg.plot and info['status'] == R.FINISHED and \
            os.path.exists(scales):
        plot_loss_scales(scales, os.path.join(folder, 'loss_scales.png'),
                         title=info['name'])
    return info
