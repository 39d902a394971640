"""Helpers shared by the benchmark scripts (``scripts/bench_*.py``).

Machine description, a timer, and one CIFAR ResNet-20 training step built the
same way as training does (``Classifier`` + ``setup_optimizer`` +
``MixedPrecisionUpdater`` with a loss-scaling mode).
"""
import contextlib
import io
import os
import platform
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import numpy  # NOQA: E402

import chainer  # NOQA: E402

from ada_loss import atomic  # NOQA: E402


class _Tee(io.TextIOBase):
    """stdout that also keeps what was written."""

    def __init__(self, stream):
        self.stream, self.kept = stream, io.StringIO()

    def write(self, text):
        self.kept.write(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


def run_with_output(main, name):
    """Runs ``main()`` (which parses ``sys.argv``) and writes what it printed
    to ``--out FILE`` too (default ``benchmarks/cpu/<name>.txt``; ``--out
    -`` for none): the raw output behind the figures in docs/speed.md."""
    out = os.path.join(_ROOT, 'benchmarks', 'cpu', name + '.txt')
    argv = sys.argv[1:]
    if '--out' in argv:
        i = argv.index('--out')
        out = argv[i + 1] if i + 1 < len(argv) else '-'
        del argv[i:i + 2]
        sys.argv[1:] = argv
    if out == '-':
        return main()
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        result = main()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    atomic.write_text(out, '$ python scripts/{}.py {}\n{}'.format(
        name, ' '.join(argv), tee.kept.getvalue()))
    print('[{}] output written to {}'.format(name, out))
    return result


def blas_brief():
    """A one-line description of NumPy's BLAS (name, library, threads)."""
    name, lib = '?', '?'
    try:    # NumPy 2: the build's dependency table
        blas = numpy.show_config(mode='dicts')['Build Dependencies']['blas']
        name, lib = blas.get('name', '?'), blas.get('version', '?')
    except Exception:
        pass
    try:
        cfg = numpy.__config__
        for key in ('openblas64__info', 'openblas_info', 'blas_ilp64_opt_info',
                    'blas_opt_info', 'mkl_info', 'blis_info'):
            info = getattr(cfg, key, None)
            if info is None:
                info = getattr(cfg, 'get_info', lambda k: {})(key)
            if info and name == '?':
                name = key.replace('_info', '')
                lib = ','.join(sorted(set(info.get('libraries', []))))
                break
    except Exception:
        pass
    threads = []
    try:
        from threadpoolctl import threadpool_info
        for d in threadpool_info():
            if d.get('user_api') == 'blas':
                where = os.path.basename(os.path.dirname(
                    d.get('filepath', '')))      # numpy.libs, scipy.libs
                threads.append('{} {} ({}) {} threads'.format(
                    d.get('internal_api'), d.get('version'), where,
                    d.get('num_threads')))
    except Exception:
        pass
    env = ['{}={}'.format(k, os.environ[k]) for k in
           ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS')
           if k in os.environ]
    text = '{} ({})'.format(name, lib)
    if threads:
        text += '; ' + '; '.join(threads)
    if env:
        text += '; ' + ' '.join(env)
    return text


def cpu_model():
    from ada_loss.experiment.runinfo import cpu_model as model_name
    return model_name() or platform.machine()


def machine_info():
    """Lines describing the machine and the software versions."""
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count()
    load = load_average()
    return [
        'machine : {} ({}), {} usable cores (os.cpu_count {}), load avg {}'
        .format(cpu_model(), platform.machine(), ncpu, os.cpu_count(), load),
        'python  : {} | numpy {} | chainer {}'.format(
            platform.python_version(), numpy.__version__, chainer.__version__),
        'blas    : {}'.format(blas_brief()),
    ]


def load_average():
    try:
        return ' '.join('{:.2f}'.format(x) for x in os.getloadavg())
    except OSError:
        return '?'


def print_machine_info():
    for line in machine_info():
        print(line)
    sys.stdout.flush()


def median(xs):
    return statistics.median(xs)


def timed(fn):
    """Seconds one call of ``fn()`` takes (wall clock)."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def fmt_s(t):
    return '{:.3f}'.format(t)


# ---------------------------------------------------------------------------
# One ResNet-20 training step
# ---------------------------------------------------------------------------
class ResNetStep(object):
    """A CIFAR ResNet-20 with its optimizer and loss-scaling mode.

    ``step()`` runs one training iteration on a fixed random batch
    (batch x 3 x 32 x 32 float32 images, int32 labels): forward through
    :class:`ada_loss.training.Classifier`, the mode's backward, the finite
    check and the MomentumSGD update, i.e. ``MixedPrecisionUpdater.update()``.

    Args:
        mode (str): loss-scaling mode (``fp32``, ``fixed:128``, ``adaptive``,
            ``adaptive:update_interval=100`` ...).
        batch (int): batch size.
        fp16_gemm (str): ``'emulated'`` or ``'native'`` (FP16 GEMMs on CPU).
        seed (int): seed for the weights and the batch.
    """

    def __init__(self, mode, batch=128, fp16_gemm='emulated', seed=0,
                 num_classes=10, precision=None, device=None, model='resnet20',
                 insize=32, in_channels=3, model_kwargs=None):
        from ada_loss.models import build_model
        from ada_loss.scaling import make_loss_scaling, resolve_precision
        from ada_loss.training import (
            Classifier, MixedPrecisionUpdater, dtype_config, setup_optimizer)

        self.mode = mode
        self.fp16_gemm = fp16_gemm
        self.dtype = resolve_precision(mode, precision)
        numpy.random.seed(seed)
        with dtype_config(self.dtype):
            self.model = Classifier(build_model(
                model, num_classes, **dict(model_kwargs or {},
                                           **({'in_channels': in_channels}
                                              if in_channels != 3 else {}))),
                self.dtype)
        if device is not None:      # e.g. '@cupy:0'
            self.model.to_device(device)
        opt = setup_optimizer(chainer.optimizers.MomentumSGD(0.05), self.model,
                              self.dtype)
        rng = numpy.random.RandomState(seed)
        x = rng.standard_normal((batch, in_channels, insize,
                                 insize)).astype(
            numpy.float32)
        t = rng.randint(0, num_classes, size=batch).astype(numpy.int32)
        data = [(x[i], t[i]) for i in range(batch)]
        it = chainer.iterators.SerialIterator(data, batch, repeat=True,
                                              shuffle=False)
        self.scaling = make_loss_scaling(mode, self.dtype)
        # The updater binds the method to the model; adaptive prints the list
        # of converted layers then, which is not wanted in a benchmark table.
        with contextlib.redirect_stdout(io.StringIO()):
            self.updater = MixedPrecisionUpdater(it, opt, self.scaling,
                                                 mode=mode, device=device)
        self._reporter = chainer.reporter.Reporter()
        self._reporter.add_observer('main', self.model)
        #: seconds spent, last step, in the backward pass and (adaptive) in
        #: the per-GEMM loss-scale computation (Algorithm 4 statistics)
        self.last = {}
        self._instrument()

    def _instrument(self):
        scaling = self.scaling
        backward = scaling.backward

        def timed_backward(loss):
            t0 = time.perf_counter()
            backward(loss)
            self.last['backward'] = time.perf_counter() - t0
        scaling.backward = timed_backward

        ada = getattr(scaling, 'ada', None)
        if ada is not None:
            gemm_scale = ada._gemm_scale

            def timed_gemm_scale(*args):
                t0 = time.perf_counter()
                beta = gemm_scale(*args)
                self.last['gemm_scale'] = self.last.get('gemm_scale', 0.0) \
                    + time.perf_counter() - t0
                return beta
            ada._gemm_scale = timed_gemm_scale

    def step(self):
        self.last = {}
        with chainer.using_config('train', True), \
                chainer.using_config('fp16_gemm', self.fp16_gemm), \
                self._reporter.scope({}):
            self.updater.update()

    def time_step(self):
        return timed(self.step)
