"""Shared by the GPU tests (``pytest -m gpu``; run on a GPU machine by
``scripts/gpu_check.sh``): ``requires_gpu`` skips, with the reason, where
CuPy, a CUDA device or Chainer's CUDA backend is missing."""
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
