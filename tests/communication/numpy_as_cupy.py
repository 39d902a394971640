"""A NumPy-backed stand-in for CuPy, for CPU tests of the device branches of
:mod:`ada_loss.communication` (tests/communication/test_aps_device_route.py).

Arrays of :class:`DeviceArray` (an ``ndarray`` subclass whose module is
``cupy.*``) make ``array_module`` and ``formats.exact`` take their CuPy
branches; the module below offers the few ``cupy`` functions those branches
call, each returning device arrays; ``ElementwiseKernel`` emulates
``formats.exact``'s kernels by what they are meant to compute (IEEE float32
results, as NumPy's), and ``quantize``'s kernel by the NumPy rounding. So a
test checks the device branches' logic — which operations, in which order,
on which operands, with what indexing — not the GPU's arithmetic (that is
tests/communication/test_aps_gpu.py's job, on a GPU)."""
import types

import numpy

_F32 = numpy.float32


class DeviceArray(numpy.ndarray):
    pass


DeviceArray.__module__ = 'cupy._numpy_stand_in'


def dev(a):
    if isinstance(a, numpy.ndarray) and not isinstance(a, DeviceArray):
        return a.view(DeviceArray)
    return a


def asnumpy(a):
    return numpy.array(a).view(numpy.ndarray)


def _wrap(fn):
    def wrapped(*args, **kwargs):
        return dev(fn(*args, **kwargs))
    return wrapped


def _f32(b):
    return numpy.asarray(b).view(_F32)


_EXACT = {
    'mul': lambda a, b: numpy.multiply(_f32(a), _f32(b), dtype=_F32),
    'div': lambda a, b: numpy.divide(_f32(a), _f32(b), dtype=_F32),
    'add': lambda a, b: numpy.add(_f32(a), _f32(b), dtype=_F32),
    'sub': lambda a, b: numpy.subtract(_f32(a), _f32(b), dtype=_F32),
    'ldexp': lambda a, e: numpy.ldexp(_f32(a), numpy.asarray(e)).astype(
        _F32),
    'mul_f64': lambda a, f: (_f32(a).astype(numpy.float64) * numpy.asarray(
        f, numpy.float64)).astype(_F32),
}


class ElementwiseKernel(object):
    def __init__(self, params, out, body, name, preamble=''):
        self.op = name.replace('ada_loss_exact_', '')
        assert self.op in _EXACT, name

    def __call__(self, *args):
        for a in args:      # a kernel takes device arrays or scalars only
            assert isinstance(a, (DeviceArray, numpy.generic)), type(a)
        with numpy.errstate(all='ignore'):
            y = _EXACT[self.op](*args)
        return dev(numpy.array(y, _F32, copy=True, ndmin=1).reshape(
            numpy.shape(y)))


def module():
    """The stand-in ``cupy`` module."""
    m = types.ModuleType('cupy')
    for name in ('zeros', 'empty', 'full', 'zeros_like', 'asarray',
                 'ascontiguousarray', 'concatenate', 'atleast_2d', 'where',
                 'ldexp', 'left_shift', 'bitwise_or', 'ones', 'arange'):
        setattr(m, name, _wrap(getattr(numpy, name)))
    m.asnumpy = asnumpy
    m.ElementwiseKernel = ElementwiseKernel
    m.get_array_module = lambda *args: m if any(
        isinstance(a, DeviceArray) for a in args) else numpy
    return m


def install(monkeypatch):
    """Makes ``import cupy`` and ``array_module`` see the stand-in for the
    test (undone by ``monkeypatch``); returns it."""
    import sys
    from ada_loss.formats import exact
    from ada_loss.formats import quantize as Q
    m = module()
    monkeypatch.setitem(sys.modules, 'cupy', m)
    monkeypatch.setattr(Q, '_cupy', m)
    monkeypatch.setattr(exact, '_kernels', {})

    def round_nearest(rounder, x):
        assert isinstance(x, DeviceArray)
        return dev(rounder.round(numpy.ascontiguousarray(x).view(
            numpy.ndarray)))
    monkeypatch.setattr(Q, '_round_nearest_cupy', round_nearest)
    return m
