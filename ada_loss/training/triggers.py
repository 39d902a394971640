"""Stateless trainer triggers, safe to use across ``--resume``.

Chainer's ``IntervalTrigger`` remembers the previous iteration and fires only
when a multiple of its period is *crossed*: a run resumed at or past its end
would not stop. These triggers look only at the updater's (serialized)
iteration and epoch counters.
"""
import math


class StopAt(object):
    """Stop trigger: true once ``iteration >= iterations`` (if given), else
    once ``epoch_detail >= epochs``. Has ``get_training_length`` for
    ``ProgressBar``."""

    def __init__(self, epochs=None, iterations=None):
        if epochs is None and iterations is None:
            raise ValueError('StopAt needs epochs or iterations')
        self.epochs = epochs
        self.iterations = iterations

    def __call__(self, trainer):
        updater = trainer.updater
        if self.iterations is not None:
            return updater.iteration >= self.iterations
        return updater.epoch_detail >= self.epochs

    def get_training_length(self):
        if self.iterations is not None:
            return self.iterations, 'iteration'
        return self.epochs, 'epoch'


class IntervalOrEnd(object):
    """Fires every ``period`` ``unit`` (``'epoch'`` or ``'iteration'``) and
    at the last iteration of training (where ``stop`` fires), so the log,
    the evaluation and the snapshot always cover the end of a run."""

    def __init__(self, period, unit, stop=None):
        if unit not in ('epoch', 'iteration'):
            raise ValueError('unit must be epoch or iteration, got {!r}'
                             .format(unit))
        self.period = period
        self.unit = unit
        self.stop = stop

    def __call__(self, trainer):
        updater = trainer.updater
        if self.unit == 'iteration':
            fire = updater.iteration % self.period == 0
        else:
            previous = updater.previous_epoch_detail or 0.0
            fire = (math.floor(previous / self.period)
                    != math.floor(updater.epoch_detail / self.period))
        return fire or (self.stop is not None and self.stop(trainer))
