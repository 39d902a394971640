"""The CuPy branches of APS (tests/communication/test_aps_gpu.py's checks)
run on the CPU through a NumPy stand-in for CuPy (numpy_as_cupy: device
arrays that are NumPy arrays, the exact kernels emulated by IEEE NumPy):
their logic — dispatch, indexing, order of the sums, the finish — gives the
NumPy path's bits, and every array they return is a "device" array. The
GPU's arithmetic itself is checked only by test_aps_gpu.py on a GPU."""
import numpy
import pytest

import numpy_as_cupy
import test_aps_gpu as T


@pytest.fixture
def device(monkeypatch):
    numpy_as_cupy.install(monkeypatch)

    def to_cpu(a):
        assert isinstance(a, numpy_as_cupy.DeviceArray), type(a)
        return numpy_as_cupy.asnumpy(a)
    monkeypatch.setattr(T, 'to_gpu', lambda a: numpy_as_cupy.dev(
        numpy.array(a)))
    monkeypatch.setattr(T, 'to_cpu', to_cpu)


@pytest.mark.parametrize('fmt', T.FORMATS)
@pytest.mark.parametrize('p', [1, 3, 8])
def test_simulator_reduction(device, fmt, p):
    T.test_simulator_reduction_equals_numpy(fmt, p)


@pytest.mark.parametrize('fmt', ['e5m2', 'e3m0', 'fp8_e4m3', 'bfloat16',
                                 'float32'])
def test_reduction_pieces(device, fmt):
    T.test_reduction_pieces_equal_numpy(fmt)


def test_fp32_sums(device):
    T.test_fp32_sums_keep_subnormals()


@pytest.mark.parametrize('fmt', T.FORMATS)
def test_codec(device, fmt):
    T.test_codec_equals_numpy(fmt)


def test_wire_mean(device):
    pytest.importorskip('mpi4py')
    T.test_wire_mean_takes_cupy_buffers()


def test_stand_in_is_undone():
    from ada_loss.formats.quantize import array_module
    assert array_module(numpy.zeros(3)) is numpy
