"""Where a run trains: the Chainer device of the ``device`` setting
(:func:`training_device`: CuPy, CUDA and GPU N checked there) and what a
run on a GPU cannot do, refused before anything runs
(:func:`check_device_config`)."""
import chainer

from ada_loss.experiment import config as C
from ada_loss.scaling import parse_mode


def check_device_config(device, modes, logs=(), distributed=False):
    """Raises a ConfigError, before anything runs, for what a run on
    ``device`` (the parsed ``device`` setting; None: the CPU, anything
    goes) cannot do, instead of failing minutes into a grid: ``modes``
    ``[(key, mode)]`` whose device path raises NotImplementedError
    (``style=authors``: its backward runs on CPU arrays only), observers of the backward (``logs``: ``[(key, log
    section or dict)]``, ``probe_every``/``record_every``: NumPy-only
    statistics, :mod:`ada_loss.analysis`), and ChainerMN (``distributed``:
    one GPU per rank is not wired, and the APS reduction is NumPy-only)."""
    if device is None:
        return
    cpu_only = 'runs on CPU arrays only; leave device at @numpy (the CPU)'
    if distributed:
        raise C.ConfigError('device', 'device {} with distributed '
                            '(ChainerMN, --mpi) is not supported: the '
                            'harness trains one process per GPU (use '
                            '--jobs); {}'.format(device, cpu_only))
    for key, mode in modes:
        spec = mode if isinstance(mode, C.Mode.parsed) else parse_mode(mode)
        options = spec.options or {}
        if options.get('style') == 'authors':
            raise C.ConfigError(key, 'mode {} on device {}: style=authors '
                                '{}'.format(spec, device, cpu_only))
    for key, log in logs:
        for name in ('probe_every', 'record_every'):
            value = log.get(name) if isinstance(log, dict) else \
                getattr(log, name, None)
            if value is not None:
                raise C.ConfigError('{}.{}'.format(key, name), 'the '
                                    'observers of the backward (probe, '
                                    'records) read gradients with NumPy: '
                                    'set it to null with device {}, or '
                                    'observe on the CPU'.format(device))


def training_device(spec):
    """The Chainer device of a ``device`` setting (None for the CPU).
    Raises a ConfigError naming the setting where CuPy, CUDA or GPU N is
    missing: checked before training (the studies' ``preload``) and again
    in each run (a ``--jobs`` worker initializes CUDA itself: the runner's
    workers are spawned, never forked from a parent holding CUDA)."""
    if spec is None:
        return None
    from chainer.backends import cuda
    if not cuda.available:
        raise C.ConfigError('device', 'device {} needs CuPy and a CUDA GPU, '
                            "but Chainer's CUDA backend is not available "
                            'here ({}); leave device at @numpy (the '
                            'CPU)'.format(spec, getattr(
                                cuda, '_resolution_error', None) or
                                'CuPy is not installed'))
    index = int(spec.split(':')[1])
    try:
        count = cuda.cupy.cuda.runtime.getDeviceCount()
    except Exception as e:      # a driver or runtime error
        raise C.ConfigError('device', 'device {}: no CUDA device usable '
                            '({}: {})'.format(spec, type(e).__name__, e))
    if index >= count:
        raise C.ConfigError('device', 'device {}: this machine has {} CUDA '
                            'device(s), @cupy:0 to @cupy:{}'.format(
                                spec, count, count - 1))
    return chainer.get_device(spec)
