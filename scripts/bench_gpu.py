#!/usr/bin/env python
"""Adaptive loss scaling on a GPU: cost of the statistics, synchronizations,
step time and throughput, each as a ratio from one run (CuPy 14, Chainer's
im2col/cuBLAS path: no cuDNN).

(a) statistics / backward GEMMs: for every GEMM layer of ResNet-50 (batch 64,
    224x224) and CIFAR ResNet-20 (batch 128) in mixed16, the GPU time of the
    layer's loss-scale computation on the device (E[x²] and max|x| of W and of
    the incoming gradient, the output bound's gain, β) against the GPU time
    of the layer's backward GEMMs (input and weight gradient), both by CUDA
    events (``cupyx.profiler.benchmark``), summed over the layers.
(b) host synchronizations in one ⟨α, δ⟩ backward: counted by CuPy's
    declarations, and checked behind a spinning kernel (a synchronization of
    any kind would wait for it).
(c) step time (forward, backward, finite check, MomentumSGD update),
    adaptive / fixed:128 in mixed16 at update interval 1 and 100, and
    float32 / mixed16 images per second; steps interleaved round-robin,
    each ended by a device synchronization; medians.

    python scripts/bench_gpu.py [--repeats 20] [--json PATH]
"""
import argparse
import json
import os
import sys
import time

import bench_common as bc  # NOQA (puts the project on sys.path)
import numpy

import chainer
import cupy
from cupyx.profiler import benchmark

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), 'tests'))
from gpu_helpers import (  # NOQA: E402 (tests/ on sys.path)
    SPIN, count_synchronizations, waits_for_device)

DEVICE = '@cupy:0'
MODELS = {'resnet20': dict(batch=128, insize=32, num_classes=10),
          'resnet110': dict(batch=128, insize=32, num_classes=10),
          'resnet50': dict(batch=64, insize=224, num_classes=1000)}


def _step(model, mode, precision):
    m = MODELS[model]
    return bc.ResNetStep(mode, m['batch'], precision=precision,
                         device=DEVICE, model=model, insize=m['insize'],
                         num_classes=m['num_classes'])


def gpu_ms(fn, repeats):
    r = benchmark(fn, n_repeat=repeats, n_warmup=3)
    return float(numpy.median(r.gpu_times[0])) * 1e3


def statistics_vs_gemms(model, repeats):
    """(a) for one model; returns a record."""
    s = _step(model, 'adaptive', 'mixed16')
    ada = s.scaling.ada
    captured = []
    inner = ada._gemm_scale_on_device

    def capture(func, W, g):
        captured.append((func, W, g))
        return inner(func, W, g)
    ada._gemm_scale_on_device = capture
    s.step()
    ada._gemm_scale_on_device = inner
    # a forward whose graph is kept, to call each GEMM node's backward
    with chainer.using_config('train', True):
        x, t = s.updater.converter(
            s.updater.get_iterator('main').next(), DEVICE)
        loss = s.model(x, t)
    nodes = {}
    stack = [loss.creator_node]
    while stack:
        f = stack.pop()
        if f is None or id(f) in nodes:
            continue
        nodes[id(f)] = f
        stack.extend(v.creator_node for v in f.inputs)
    gemms = {getattr(f, 'scale_key', None): f for f in nodes.values()}
    stats_ms = gemm_ms = 0.0
    per_layer = []
    for func, W, g in captured:
        node = gemms.get(func.scale_key)
        if node is None:
            continue
        gy = chainer.Variable(g)
        targets = tuple(i for i, v in enumerate(node.inputs)
                        if v.requires_grad)
        st = gpu_ms(lambda: inner(func, W, g), repeats)
        with chainer.using_config('enable_backprop', False):
            gm = gpu_ms(lambda: node.backward(targets, (gy,)), repeats)
        per_layer.append(dict(layer=func.scale_key, W=list(W.shape),
                              g=list(g.shape), statistics_ms=st,
                              gemms_ms=gm))
        stats_ms += st
        gemm_ms += gm
    # The same with all layers' weight statistics in one launch (what the
    # backward does on a β update since issue 35): that launch, plus each
    # layer's gradient-moments-and-β launch given its weight statistics.
    from ada_loss.loss_scale import device as dev
    used = [(func, W, g) for func, W, g in captured
            if gemms.get(func.scale_key) is not None]
    weights = [(W, func.grad_input_axes) for func, W, _ in used]
    batched_ms = gpu_ms(lambda: dev.weight_statistics_many(weights), repeats)
    rows = dev.weight_statistics_many(weights)
    grad_ms = 0.0
    for (func, W, g), row in zip(used, rows):
        grad_ms += gpu_ms(lambda: dev.gemm_loss_scale(
            W, g, ada.t_uf, ada.fmt, bound=ada.bound,
            axes=func.grad_input_axes, max_scale=ada.max_layer_scale,
            w_stats=row), repeats)
    return dict(model=model, batch=MODELS[model]['batch'],
                layers=len(per_layer), statistics_ms=stats_ms,
                gemms_ms=gemm_ms, ratio=stats_ms / gemm_ms,
                batched_weights_ms=batched_ms, gradient_ms=grad_ms,
                ratio_batched=(batched_ms + grad_ms) / gemm_ms,
                per_layer=per_layer)


def synchronizations(model):
    """(b): syncs in one backward, and whether it waited for the device."""
    s = _step(model, 'adaptive', 'mixed16')
    s.step()

    def prepared():
        with chainer.using_config('train', True):
            s.model.cleargrads()
            x, t = s.updater.converter(
                s.updater.get_iterator('main').next(), DEVICE)
            loss = s.model(x, t)
        cupy.cuda.Device().synchronize()
        return lambda: s.scaling.ada.backward(loss)
    with chainer.using_config('train', True):
        count = count_synchronizations(prepared())
        backward = prepared()
        t0 = time.perf_counter()
        backward()
        host = time.perf_counter() - t0
        del backward    # its graph: a later one must not need new memory
        cupy.cuda.Device().synchronize()
        # the spin outlasts the backward's host time by far
        waited = waits_for_device(prepared(), seconds=5 + 4 * host)
        first = first_waiting_function(prepared(), seconds=5 + 4 * host) \
            if waited else None
        # Chainer's own backward of the same model at a fixed scale: a wait
        # there too comes from Chainer/CuPy/cuBLAS, not from the α, δ code.
        def plain_prepared():
            with chainer.using_config('train', True):
                s.model.cleargrads()
                x, t = s.updater.converter(
                    s.updater.get_iterator('main').next(), DEVICE)
                loss = s.model(x, t)
            cupy.cuda.Device().synchronize()
            return lambda: loss.backward(loss_scale=128.0)
        plain_prepared()()
        waited_plain = waits_for_device(plain_prepared(),
                                               seconds=5 + 4 * host)
        # The same with CUDA's stream-ordered allocator (cudaMallocAsync):
        # a wait that disappears there came from growing CuPy's default
        # pool (cudaMalloc), not from the backward's own code.
        pool = cupy.get_default_memory_pool()
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
        try:
            s.step()
            prepared()()
            waited_async = waits_for_device(prepared(),
                                                   seconds=5 + 4 * host)
        finally:
            cupy.cuda.set_allocator(pool.malloc)
    return dict(model=model, synchronizations_per_backward=count,
                backward_waited_for_device=waited,
                backward_host_seconds=host,
                first_function_after_a_wait=first,
                waited_with_stream_ordered_allocator=waited_async,
                chainer_plain_backward_waited=waited_plain)


class _WaitProbe(chainer.FunctionHook):
    """Notes the first function, in backward order, after whose backward the
    spinning kernel had finished: the host waited just before."""

    name = 'wait_probe'

    def __init__(self, event):
        self.event = event
        self.first = None
        self.count = 0

    def backward_postprocess(self, function, in_data, out_grad):
        self.count += 1
        if self.first is None and self.event.done:
            self.first = '{} (#{} in backward order, input shapes {})'.format(
                function.label, self.count, [getattr(x, 'shape', None)
                                             for x in in_data])


def first_waiting_function(backward, seconds):
    spin = cupy.RawKernel(SPIN, 'ada_loss_spin')
    rate = cupy.cuda.runtime.getDeviceProperties(0)['clockRate'] * 1e3
    done = cupy.cuda.Event()
    cupy.cuda.Device().synchronize()
    spin((1,), (1,), (numpy.int64(rate * seconds),))
    done.record()
    with _WaitProbe(done) as probe:
        backward()
    cupy.cuda.Device().synchronize()
    return probe.first


def step_times(model, repeats, interval=100):
    """(c) for one model: medians of interleaved, synchronized steps."""
    configs = [('float32', 'fp32'), ('mixed16', 'fixed:128'),
               ('mixed16', 'adaptive'),
               ('mixed16', 'adaptive:update_interval={}'.format(interval))]
    steps = {c: _step(model, c[1], c[0]) for c in configs}
    for _ in range(3):
        for st in steps.values():
            st.step()
    times = {c: [] for c in configs}
    for _ in range(repeats):
        for c, st in steps.items():
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
            st.step()
            cupy.cuda.Device().synchronize()
            times[c].append(time.perf_counter() - t0)
    med = {c: float(numpy.median(v)) for c, v in times.items()}
    batch = MODELS[model]['batch']
    fixed = med[('mixed16', 'fixed:128')]
    return dict(
        model=model, batch=batch, repeats=repeats,
        seconds={'{} {}'.format(*c): v for c, v in med.items()},
        adaptive_over_fixed_interval1=med[('mixed16', 'adaptive')] / fixed,
        interval=interval,
        adaptive_over_fixed_interval=med[
            ('mixed16', 'adaptive:update_interval={}'.format(interval))]
        / fixed,
        images_per_second_float32=batch / med[('float32', 'fp32')],
        images_per_second_mixed16=batch / fixed)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--repeats', type=int, default=20)
    p.add_argument('--models', default='resnet20,resnet50')
    p.add_argument('--json', help='also write the records here')
    p.add_argument('--parts', default='abc', help='which of (a), (b), (c)')
    p.add_argument('--interval', type=int, default=100,
                   help='update interval of the second adaptive step in (c)')
    args = p.parse_args()
    props = cupy.cuda.runtime.getDeviceProperties(0)
    info = dict(gpu=props['name'].decode(), cupy=cupy.__version__,
                chainer=chainer.__version__, numpy=numpy.__version__,
                python=sys.version.split()[0],
                cudnn=chainer.backends.cuda.cudnn_enabled)
    print(info)
    out = dict(machine=info, statistics=[], synchronizations=[], steps=[])
    models = args.models.split(',')
    for m in models if 'a' in args.parts else ():
        r = statistics_vs_gemms(m, args.repeats)
        print('(a) {model} batch {batch}: statistics {statistics_ms:.3f} ms '
              '/ backward GEMMs {gemms_ms:.3f} ms over {layers} layers = '
              '{ratio:.4f}; weights of all layers in one launch '
              '{batched_weights_ms:.3f} ms + gradients {gradient_ms:.3f} ms '
              '= {ratio_batched:.4f}'.format(**r), flush=True)
        out['statistics'].append(r)
    for m in models if 'b' in args.parts else ():
        r = synchronizations(m)
        print('(b) {model}: {synchronizations_per_backward} synchronizations '
              'per backward; waited for the device: '
              '{backward_waited_for_device} (backward host time '
              '{backward_host_seconds:.3f} s; first function after a wait: '
              '{first_function_after_a_wait}); with cudaMallocAsync, waited: '
              '{waited_with_stream_ordered_allocator}; Chainer\'s own '
              'backward (fixed scale) waited: {chainer_plain_backward_waited}'
              .format(**r),
              flush=True)
        out['synchronizations'].append(r)
    for m in models if 'c' in args.parts else ():
        r = step_times(m, args.repeats, args.interval)
        print('(c) {} batch {}, medians of {} interleaved steps:'.format(
            m, r['batch'], r['repeats']))
        for k, v in r['seconds'].items():
            print('    {:<40s} {:8.4f} s'.format(k, v))
        print('    adaptive / fixed:128 (mixed16): interval 1 {:.3f}, '
              'interval {} {:.3f}'.format(
                  r['adaptive_over_fixed_interval1'], r['interval'],
                  r['adaptive_over_fixed_interval']))
        print('    images/s: float32 {:.0f}, mixed16 {:.0f}'.format(
            r['images_per_second_float32'], r['images_per_second_mixed16']),
            flush=True)
        out['steps'].append(r)
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(out, f, indent=1)


if __name__ == '__main__':
    main()
