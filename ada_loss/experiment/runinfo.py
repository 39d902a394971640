"""``run.json``: what one run was and how it ended.

Fields: ``name``, ``table``, ``model``, ``dataset``, ``mode`` (the mode
string with its options, ``str(parse_mode(mode))``), ``mode_name``,
``mode_options``, ``mode_resolved`` (the mode with every option's value,
defaults included, in the run's precision:
:func:`ada_loss.scaling.resolved_mode`; absent from runs recorded before
issue 47 moved ``adaptive``'s ``init_scale`` default from 1 to ``format``),
``seed``, ``precision`` (its canonical name),
``git_commit`` (``git rev-parse
HEAD`` or null), ``status`` (``running`` / ``finished`` / ``diverged`` /
``interrupted``: stopped by Ctrl-C),
``final_test_accuracy`` and ``best_test_accuracy`` (fractions in [0, 1];
null when diverged), ``final_test_loss``, ``final_train_loss``,
``skipped_steps``, ``iterations``, ``epoch``, ``wall_time_s``, ``world_size``,
``loss_scale`` (final; the initial α_{N+1} for adaptive), ``error`` (why it
diverged), ``started``/``updated`` (ISO times), ``blas_threads`` (BLAS /
OpenMP threads the run used), ``environment`` (:func:`environment`),
``resumed`` and ``resumed_from``
(``snapshot_latest``, ``snapshot_previous`` or null: the snapshot the last
process continued from), ``data`` (the resolved data roots and the files
read, with sizes and hashes, where the study records them:
:mod:`ada_loss.experiment.provenance`).

Every file of a run folder is replaced atomically (:mod:`ada_loss.atomic`).
"""
import json
import os
import platform
import subprocess

import chainer
import numpy
import threadpoolctl

from ada_loss import atomic

RUN_JSON = 'run.json'
CONFIG_YAML = 'config.yaml'
SNAPSHOT = 'snapshot_latest'

RUNNING, FINISHED, DIVERGED = 'running', 'finished', 'diverged'
#: a run stopped by Ctrl-C (KeyboardInterrupt): unfinished, not running
INTERRUPTED = 'interrupted'
STATUSES = (RUNNING, FINISHED, DIVERGED, INTERRUPTED)


def git_commit(cwd=None):
    """The checkout's ``HEAD`` commit, or ``None`` (no git, not a repo)."""
    if cwd is None:
        cwd = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=cwd,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.decode().strip()
    return commit or None


def cpu_model():
    """The CPU's model name (Linux), else platform.processor() or None."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment():
    """What a run's numbers depend on besides config and seed: Python,
    NumPy, Chainer, the BLAS libraries loaded, the CPU (``run.json``:
    ``environment``)."""
    blas = sorted({'{} {} ({})'.format(i.get('internal_api'),
                                       i.get('version'), i.get('prefix'))
                   for i in threadpoolctl.threadpool_info()})
    return {'python': platform.python_version(), 'numpy': numpy.__version__,
            'chainer': chainer.__version__, 'blas': blas,
            'machine': platform.machine(), 'cpu': cpu_model()}


def write_json_atomic(path, obj):
    atomic.write_text(path, json.dumps(obj, indent=2, sort_keys=False) +
                      '\n')


def read_run(folder):
    """The ``run.json`` of a run folder as a dict, or ``None``."""
    path = os.path.join(folder, RUN_JSON)
    try:
        with open(path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    # valid JSON of another shape (a list, a number: edited or damaged) is
    # no run record either, as invalid JSON is not
    return info if isinstance(info, dict) else None


def write_run(folder, info):
    write_json_atomic(os.path.join(folder, RUN_JSON), info)


def find_runs(root):
    """Every ``run.json`` below ``root`` (recursively), as dicts with an
    extra ``folder`` key, sorted by folder."""
    runs = []
    for dirpath, _, files in os.walk(root):
        if RUN_JSON in files:
            info = read_run(dirpath)
            if info is not None:
                info['folder'] = dirpath
                runs.append(info)
    return sorted(runs, key=lambda r: r['folder'])
