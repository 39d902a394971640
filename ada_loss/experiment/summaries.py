"""What ``run.json`` holds at the end of a run: the last logged value of a
key (:func:`last`), whether a value is finite (:func:`finite`) and the
final fields (:func:`summarize`)."""
import math

from ada_loss.experiment import runinfo as R
from ada_loss.experiment.run_folder import now
from ada_loss.functions.scales import host_float


def last(log, key):
    """The last value of ``key`` in a LogReport log (None if never)."""
    for entry in reversed(log):
        if key in entry:
            return entry[key]
    return None


def finite(x):
    return x is not None and math.isfinite(x)


def summarize(info, trainer, updater, scaling, error, metrics, epoch=True):
    """Fills ``info`` at the end of a run: status (``diverged`` when
    ``error`` is not None), ``metrics(diverged)`` (an ordered list of
    ``(key, value)``), skipped steps, iterations, epoch (if ``epoch``), wall
    time, final loss scale, error and update time."""
    diverged = error is not None
    info['status'] = R.DIVERGED if diverged else R.FINISHED
    info.update(metrics(diverged))
    info.update(skipped_steps=updater.skipped_steps,
                skipped_by_layer=dict(updater.skipped_by_layer),
                iterations=updater.iteration)
    if epoch:
        info['epoch'] = updater.epoch_detail
    info.update(wall_time_s=trainer.elapsed_time,
                loss_scale=host_float(scaling.scale),
                error=error, updated=now())
    return info
