"""What arithmetic a GPU's GEMMs and convolutions do, against float64 on
the same operands (issue 35: the device's FP8 and mixed16 runs part from
the CPU's more than summation order explains): float32 GEMMs (TF32 tensor
cores round the operands to 10 mantissa bits: relative error ~1e-3 instead
of ~1e-6), float16 GEMMs over long sums (FP16 accumulation: error growing
with K), Chainer's convolution and its weight gradient on CuPy, and one
FP8-emulated convolution of ada_loss on the device against the CPU, bit
for bit."""
import sys

import numpy

sys.path.insert(0, __file__.rsplit('/scripts/', 1)[0])
import chainer  # NOQA: E402
import chainer.functions as F  # NOQA: E402
import cupy  # NOQA: E402

import ada_loss  # NOQA: E402,F401
from ada_loss import links as AL  # NOQA: E402
from ada_loss.training import apply_precision  # NOQA: E402


def rel(a, ref):
    a = cupy.asnumpy(a).astype(numpy.float64)
    return float(numpy.abs(a - ref).max() / numpy.abs(ref).max())


rng = numpy.random.RandomState(0)
print('cupy', cupy.__version__, 'CUPY_TF32', __import__('os').environ.get(
    'CUPY_TF32'), 'NVIDIA_TF32_OVERRIDE', __import__('os').environ.get(
    'NVIDIA_TF32_OVERRIDE'))
for k in (64, 4096, 100352):
    a = rng.randn(64, k).astype(numpy.float32)
    b = rng.randn(k, 64).astype(numpy.float32)
    ref = a.astype(numpy.float64) @ b.astype(numpy.float64)
    print('float32 GEMM K={:>6}: max rel. error {:.2e} (CPU NumPy {:.2e})'
          .format(k, rel(cupy.asarray(a) @ cupy.asarray(b), ref),
                  rel(a @ b, ref)))
    h, g = a.astype(numpy.float16), b.astype(numpy.float16)
    ref = h.astype(numpy.float64) @ g.astype(numpy.float64)
    print('float16 GEMM K={:>6}: max rel. error {:.2e} (FP32 accumulation '
          'would be ~1e-6; the result is rounded to FP16: 4.9e-4)'.format(
              k, rel(cupy.asarray(h) @ cupy.asarray(g), ref)))
x = rng.randn(128, 16, 28, 28).astype(numpy.float32)
W = rng.randn(16, 16, 3, 3).astype(numpy.float32)
ref = F.convolution_2d(x.astype(numpy.float64), W.astype(numpy.float64),
                       pad=1).array
print('float32 convolution (Chainer, CuPy): {:.2e}'.format(rel(
    F.convolution_2d(cupy.asarray(x), cupy.asarray(W), pad=1).array, ref)))
gy = rng.randn(128, 16, 28, 28).astype(numpy.float32)
ref = chainer.functions.connection.convolution_2d.Convolution2DGradW(
    chainer.functions.connection.convolution_2d.Convolution2DFunction(pad=1),
    W.shape, numpy.float64, None).apply((x.astype(numpy.float64),
                                         gy.astype(numpy.float64)))[0].array
for dt in (numpy.float32, numpy.float16):
    xd, gd = cupy.asarray(x.astype(dt)), cupy.asarray(gy.astype(dt))
    r64 = chainer.functions.connection.convolution_2d.Convolution2DGradW(
        chainer.functions.connection.convolution_2d.Convolution2DFunction(
            pad=1), W.shape, numpy.float64, None).apply((
                x.astype(dt).astype(numpy.float64),
                gy.astype(dt).astype(numpy.float64)))[0].array
    gw = chainer.functions.connection.convolution_2d.Convolution2DGradW(
        chainer.functions.connection.convolution_2d.Convolution2DFunction(
            pad=1), W.shape, dt, None).apply((xd, gd))[0].array
    print('{} weight gradient (K = 100352): {:.2e}'.format(
        numpy.dtype(dt).name, rel(gw, r64)))
for precision in ('fp8_e4m3', 'fp8_e4m3:recipe=current'):
    link = AL.Convolution2D(16, 16, 3, pad=1)
    apply_precision(link, precision)
    xs = (x * 2).astype(numpy.float32)
    with chainer.using_config('train', True):
        y_cpu = link(xs).array
        link.to_device('@cupy:0')
        y_gpu = cupy.asnumpy(link(cupy.asarray(xs)).array)
    diff = (y_cpu.view(numpy.uint32) != y_gpu.view(numpy.uint32))
    print('{} convolution output, device vs CPU: {} of {} values differ '
          '(max rel. {:.2e})'.format(precision, int(diff.sum()), diff.size,
                                     float(numpy.abs(y_gpu - y_cpu).max()
                                           / numpy.abs(y_cpu).max())))
