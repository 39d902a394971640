"""Deterministic crash points for the resume tests.

``ADA_LOSS_KILL_AT=<point>:<n>[,<point>:<n>...]`` makes the process send
itself SIGKILL the ``n``-th time it reaches ``<point>`` -- a real,
uncatchable kill at a chosen moment, not a simulated one. The points:

* ``train_batch``: a training batch was drawn (the update has not run);
* ``eval_batch``: an evaluation batch was drawn (mid-evaluation);
* ``snapshot_write``: the new snapshot is written to its temporary file
  but not yet in place;
* ``snapshot_rotate``: the previous snapshot was kept, the new one not yet
  in place;
* ``snapshot_done``: the new snapshot is in place (after the last one:
  ``run.json`` and the TensorBoard session end not yet written);
* ``run_end``: the training loop ended, ``run.json`` is not yet final.

Unset (always, outside the tests) it costs one dictionary lookup.
"""
import os
import signal

ENV = 'ADA_LOSS_KILL_AT'
_counts = {}


def _plan():
    text = os.environ.get(ENV, '')
    plan = {}
    for item in filter(None, (s.strip() for s in text.split(','))):
        point, _, n = item.partition(':')
        plan[point] = int(n or 1)
    return plan


def fault_point(name):
    """Kills this process with SIGKILL if ``ADA_LOSS_KILL_AT`` says so."""
    if ENV not in os.environ:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _plan().get(name) == _counts[name]:
        os.kill(os.getpid(), signal.SIGKILL)
