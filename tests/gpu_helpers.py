"""Shared by the GPU tests (``pytest -m gpu``; run on a GPU machine by
``scripts/gpu_check.sh``): ``requires_gpu`` skips, with the reason, where
CuPy, a CUDA device or Chainer's CUDA backend is missing; and the
diagnostics of whether code waits for the device
(:func:`count_synchronizations`, :func:`waits_for_device`; also used by
``scripts/bench_gpu.py``)."""
import pytest


def _gpu_skip_reason():
    try:
        import cupy
    except Exception as e:      # not installed, or its libraries missing
        return 'CuPy is not importable ({}: {})'.format(type(e).__name__, e)
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return 'no CUDA device ({}: {})'.format(type(e).__name__, e)
    if n < 1:
        return 'no CUDA device'
    import ada_loss  # NOQA (applies the compatibility patches)
    from chainer.backends import cuda
    if not cuda.available:
        return 'chainer.backends.cuda.available is False: {!r}'.format(
            getattr(cuda, '_resolution_error', None))
    return None


GPU_SKIP_REASON = _gpu_skip_reason()

#: marks a test as a GPU test and skips it, with the reason, without one
requires_gpu = [pytest.mark.gpu,
                pytest.mark.skipif(GPU_SKIP_REASON is not None,
                                   reason=GPU_SKIP_REASON or '')]


def to_gpu(a):
    import cupy
    return cupy.asarray(a)


def to_cpu(a):
    import cupy
    return cupy.asnumpy(a)


# -- diagnostics: does code wait for the device? (tests, scripts/bench_gpu.py)
SPIN = r'''
extern "C" __global__ void ada_loss_spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
'''


def count_synchronizations(fn):
    """Runs ``fn()``; returns the number of device synchronizations CuPy
    declared meanwhile (``cupy._core.syncdetect``: device-to-host copies,
    ``float()``/``bool()`` of device arrays, stream synchronizations)."""
    from cupy._core import syncdetect
    count = [0]
    original = syncdetect._declare_synchronize

    def counting():
        count[0] += 1
        return original()
    syncdetect._declare_synchronize = counting
    try:
        fn()
    finally:
        syncdetect._declare_synchronize = original
    return count[0]


def waits_for_device(fn, seconds=1.0):
    """Runs ``fn()`` behind a kernel that spins for ``seconds`` on the same
    stream; True if the host waited for the device during ``fn`` (any
    synchronization, declared by CuPy or not, waits for the spin)."""
    import cupy
    spin = cupy.RawKernel(SPIN, 'ada_loss_spin')
    rate = cupy.cuda.runtime.getDeviceProperties(
        cupy.cuda.Device().id)['clockRate'] * 1e3     # kHz -> Hz
    done = cupy.cuda.Event()
    cupy.cuda.Device().synchronize()
    spin((1,), (1,), (cupy.int64(int(rate * seconds)),))
    done.record()
    fn()
    waited = done.done
    cupy.cuda.Device().synchronize()
    return waited
