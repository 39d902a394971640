#!/usr/bin/env python
"""Overhead of the APS low-precision all-reduce relative to FP32 averaging.

Single process (default): CIFAR ResNet-20 (fp32 compute, random 32x32 RGB
batch of 128 = 8 simulated workers x 16), :class:`SimulatedDataParallelUpdater`
with FP32 communication vs APS in (5, 2) (ring; + Kahan; without APS) and
(4, 3) hierarchical k = 4. Per policy, round-robin: the whole step, and the
reduction alone (loss-scale sync packing + exponents + shift + cast +
emulated sum + unshift, i.e. ``simulated_mean``).

``mpiexec -n P python scripts/bench_aps.py --mpi [--json PATH]``: the
gradient mean of one step over P ranks, per method (docs/aps_wire.md):

* ``fp32_allreduce``: MPI ``Allreduce(SUM)`` of FP32, × 1/P (ChainerMN's
  MPI communicators; what the loss-scale sync does);
* ``fp16_allreduce``: cast to FP16, ``Allreduce`` with a user-defined FP16
  sum (``MPI.Op.Create``: MPI has no half type), cast back, × 1/P;
* ``fp16_ring``: FP16 codes through the wire mode's ring (no APS);
* ``aps_emulated``: APS (fp8_e5m2) as the emulated mode does it: exponent
  ``Allreduce(MAX)``, ``Allgather`` of FP32 payloads, the sum on every rank;
* ``aps_wire_8bit`` (fp8_e5m2) and ``aps_wire_4bit`` (e3m0, the paper's
  (3, 0)): APS with codes on the wire (ring reduce-scatter of ``Sendrecv``
  steps + ``Allgatherv``; the codes' fast path of tables).

Buffers: ResNet-20's parameter sizes (0.27M, 59 layers), ResNet-50's
(25.6M, 161 layers) and a sweep of single-layer buffers ``2^a .. 2^b``
(``--sweep``), random normal gradients. Each time is the slowest rank's,
median of ``--repeats`` after one warm-up, methods round-robin; ``cpu``:
the largest CPU time (``process_time``) of a rank, median — less exposed
to the other jobs of a shared machine than the wall time. Per method
the time splits into ``comm`` (inside MPI calls, waiting included),
``encode`` (format codes from float32: rounding by table; the FP16 cast of
``fp16_allreduce``), ``decode`` (codes → float32, with the mean of each
block in the fast path), ``hop`` (the ring's ⊕ by table, fast path) and
``compute`` (the rest: exponents, shift, the value path's sums, unshift,
× 1/P, time off the CPU), rank 0's. ``bytes_per_element``:
what a rank sends per element, counted at the MPI calls for the ring
methods (``Allgatherv``: (P−1) × its block, a ring all-gather's figure),
and the ring-algorithm figure ``2(P−1)/P·b`` for MPI's own
``Allreduce`` (whose algorithm MPI chooses) and ``(P−1)·4`` for the
``Allgather`` (``bytes_source`` says which).

``--summarize`` prints the table of docs/aps_wire.md from ``--json`` files
and the break-even link bandwidth of the 8-bit wire mode for P = 8 and 64
(:func:`codec_seconds`, ``cost.break_even_bandwidth``).

``--device gpu``: APS on CuPy arrays (one GPU, one process;
:mod:`~ada_loss.communication.allreduce`'s device route, NumPy's bits): the
wire codec's steps on ``2^a`` values (``--sweep``, step ``--sweep-step``)
and ``StepReduction.mean_of_stacked`` of ``--workers`` stacked gradients
(the ``POLICIES`` below) on the ResNet-20/50 parameter sizes and the sweep
(up to ``--gpu-max-log2``), GB/s of float32 gradient (CUDA events around
each call, ``cupyx.profiler.benchmark``, median of ``--repeats``), with
ratios to a device copy (codec) and to FP32 averaging on the same route
and CuPy's plain ``mean`` (reduction), all from one run.

Prints a table from one run; not a test. Without ``--mpi``: the
single-process simulator timing below.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as B  # NOQA: E402

import numpy  # NOQA: E402

import chainer  # NOQA: E402

POLICIES = [('fp32 (FP32 averaging)', dict(fmt='float32', aps=False)),
            ('e5m2 APS ring', dict(fmt='e5m2')),
            ('e5m2 APS ring Kahan', dict(fmt='e5m2', kahan=True)),
            ('e5m2 no APS ring', dict(fmt='e5m2', aps=False)),
            ('e4m3 APS hier. k=4', dict(fmt='e4m3', order='hierarchical',
                                        group_size=4))]


def model_and_data(batch, seed=0):
    from ada_loss.models import build_model
    from ada_loss.training import Classifier
    numpy.random.seed(seed)
    model = Classifier(build_model('resnet20', 10))
    rng = numpy.random.RandomState(seed)
    x = rng.standard_normal((batch, 3, 32, 32)).astype(numpy.float32)
    t = rng.randint(0, 10, size=batch).astype(numpy.int32)
    return model, [(x[i], t[i]) for i in range(batch)]


def single(args):
    from ada_loss.communication import CommPolicy
    from ada_loss.communication import simulator as S
    from ada_loss.experiment.optimization import build_optimizer
    from ada_loss.scaling import make_loss_scaling
    n, batch = args.workers, args.workers * args.per_worker
    runs = []
    for name, kw in POLICIES:
        model, data = model_and_data(batch)
        opt = build_optimizer(model, 'float32', 0.01, 0.9, 1e-4)
        it = chainer.iterators.SerialIterator(data, batch, shuffle=False)
        up = S.SimulatedDataParallelUpdater(
            it, opt, make_loss_scaling('fp32'), n, CommPolicy(**kw),
            mode='fp32')
        runs.append((name, up, {'step': [], 'reduce': []}))
    inner = S.simulated_mean
    last = {}

    def timed_mean(*a, **k):
        t0 = time.perf_counter()
        out = inner(*a, **k)
        last['reduce'] = time.perf_counter() - t0
        return out
    S.simulated_mean = timed_mean
    print('settings: ResNet-20 fp32, {} workers x {} = batch {}, {} timed '
          'steps per policy, round-robin, {} warm-up'.format(
              n, args.per_worker, batch, args.steps, args.warmup))
    for i in range(args.warmup + args.steps):
        for name, up, times in runs:
            t = B.timed(up.update)
            if i >= args.warmup:
                times['step'].append(t)
                times['reduce'].append(last['reduce'])
    S.simulated_mean = inner
    print('\n  {:26s} {:>9s} {:>11s}   reduce times [s]'.format(
        'policy (medians)', 'step [s]', 'reduce [s]'))
    for name, _, t in runs:
        print('  {:26s} {:9.3f} {:11.4f}   {}'.format(
            name, B.median(t['step']), B.median(t['reduce']),
            ' '.join('{:.4f}'.format(x) for x in t['reduce'])))
    base = runs[0][2]
    b_step, b_red = B.median(base['step']), B.median(base['reduce'])
    print('\nratios vs FP32 averaging (medians; "implied" = FP32 step + the '
          'difference in reduction time, robust to load noise):')
    for name, _, t in runs[1:]:
        red = B.median(t['reduce'])
        print('  {:26s} step {:.3f}   implied step {:.4f}   reduction alone '
              '{:.2f}x   reduction share of the step {:.1%}'.format(
                  name, B.median(t['step']) / b_step,
                  (b_step + red - b_red) / b_step, red / b_red,
                  red / B.median(t['step'])))


METHODS = [('fp32_allreduce', 32), ('fp16_allreduce', 16),
           ('fp16_ring', 16), ('aps_emulated', 8), ('aps_wire_8bit', 8),
           ('aps_wire_4bit', 4)]
PHASES = ('encode', 'comm', 'decode', 'hop', 'compute')
# the fast path's kernels: own_wire encodes (the first message), a hop
# rounds this rank's values and adds them (one fused pass), decode
# finishes the mean in its pass
PHASE_OF = {'own_wire': 'encode'}


class TimedComm(object):
    """An mpi4py communicator whose calls add their seconds to
    ``phases['comm']`` and the bytes this rank sends to ``sent``."""

    def __init__(self, comm, phases):
        self.comm, self.phases, self.sent = comm, phases, 0

    def Get_rank(self):
        return self.comm.Get_rank()

    def Get_size(self):
        return self.comm.Get_size()

    def _call(self, name, nbytes, *args, **kwargs):
        self.sent += nbytes
        t0 = time.perf_counter()
        out = getattr(self.comm, name)(*args, **kwargs)
        self.phases['comm'] += time.perf_counter() - t0
        return out

    def Allreduce(self, send, recv, op):
        data = send[0] if isinstance(send, list) else send
        return self._call('Allreduce', data.nbytes, send, recv, op=op)

    def Allgather(self, send, recv):
        return self._call('Allgather', send.nbytes, send, recv)

    def Sendrecv(self, send, dest, recvbuf, source):
        return self._call('Sendrecv', send.nbytes, send, dest=dest,
                          recvbuf=recvbuf, source=source)

    def Allgatherv(self, send, recv):
        # a ring all-gather's bytes: this rank's block to each other rank
        return self._call('Allgatherv', (self.Get_size() - 1) * send.nbytes,
                          send, recv)


def _timed_methods(cls, names, phases):
    """Wraps ``cls.<name>`` so that its seconds add to ``phases[name]``;
    returns the originals."""
    saved = {}
    for name in names:
        fn = getattr(cls, name)
        saved[name] = fn

        def wrapper(*a, _fn=fn, _name=name, **k):
            t0 = time.perf_counter()
            out = _fn(*a, **k)
            phases[PHASE_OF.get(_name, _name)] += time.perf_counter() - t0
            return out
        setattr(cls, name, wrapper)
    return saved


def buffer_sets(args):
    from ada_loss.models import build_model
    sets = []
    for label, model, classes in (('resnet20', 'resnet20', 10),
                                  ('resnet50', 'resnet50', 1000)):
        if label in args.models:
            sizes = [p.size for p in build_model(model, classes).params()]
            sets.append((label, sizes))
    for a in range(args.sweep[0], args.sweep[1] + 1, args.sweep_step):
        sets.append(('2^{}'.format(a), [1 << a]))
    return sets


def fp16_sum_op():
    from mpi4py import MPI

    def add(inbuf, inoutbuf, datatype):
        a = numpy.frombuffer(inbuf, numpy.float16)
        b = numpy.frombuffer(inoutbuf, numpy.float16)
        b += a
    return MPI.Op.Create(add, commute=True)


def mpi(args):
    from mpi4py import MPI
    from ada_loss.communication import CommPolicy, StepReduction
    from ada_loss.communication.codes import WireCodec
    from ada_loss.communication.communicator import emulated_mean
    from ada_loss.communication.wire import _CodePart, wire_mean
    world = MPI.COMM_WORLD
    p, rank = world.Get_size(), world.Get_rank()
    phases = dict.fromkeys(PHASES, 0.0)
    comm = TimedComm(world, phases)
    saved = _timed_methods(WireCodec, ('encode', 'decode'), phases)
    saved_part = _timed_methods(_CodePart, ('own_wire', 'hop', 'decode'),
                                phases)
    fp16_op = fp16_sum_op()
    policies = {'fp16_ring': CommPolicy('float16', aps=False),
                'aps_emulated': CommPolicy('fp8_e5m2'),
                'aps_wire_8bit': CommPolicy('fp8_e5m2'),
                'aps_wire_4bit': CommPolicy('e3m0')}

    def run(method, buf, names, sizes):
        if method == 'fp32_allreduce':
            out = numpy.empty_like(buf)
            comm.Allreduce(buf, out, op=MPI.SUM)
            out *= numpy.float32(1.0 / p)
            return out
        if method == 'fp16_allreduce':
            t0 = time.perf_counter()
            half = buf.astype(numpy.float16)
            phases['encode'] += time.perf_counter() - t0
            out = numpy.empty_like(half)
            comm.Allreduce([half, MPI.UINT16_T], [out, MPI.UINT16_T],
                           op=fp16_op)
            t0 = time.perf_counter()
            mean = out.astype(numpy.float32)
            phases['decode'] += time.perf_counter() - t0
            mean *= numpy.float32(1.0 / p)
            return mean
        plan = StepReduction(policies[method], names, sizes, p)
        if method == 'aps_emulated':
            return emulated_mean(comm, plan, buf)[0]
        return wire_mean(comm, plan, buf)[0]

    records = []
    for label, sizes in buffer_sets(args):
        if label.startswith('2^') and int(label[2:]) > args.max_log2.get(
                p, 99):
            continue
        names = ['/layer{}/W'.format(i) for i in range(len(sizes))]
        n = int(sum(sizes))
        rng = numpy.random.RandomState(rank)
        buf = rng.standard_normal(n).astype(numpy.float32)
        buf *= numpy.float32(1e-3)
        methods = [(m, b) for m, b in METHODS if m in args.methods or
                   m == 'fp32_allreduce']
        if label == 'resnet50' and args.resnet50_methods:
            methods = [(m, b) for m, b in methods
                       if m in args.resnet50_methods or
                       m == 'fp32_allreduce']
        times = {m: [] for m, _ in methods}
        cpu = {m: [] for m, _ in methods}
        parts = {m: {k: [] for k in PHASES} for m, _ in methods}
        sent = {}
        repeats = args.repeats if n < (1 << 22) else args.repeats_large
        for i in range(1 + repeats):
            for method, _ in methods:
                for k in PHASES:
                    phases[k] = 0.0
                comm.sent = 0
                world.Barrier()
                c0 = time.process_time()
                t0 = time.perf_counter()
                run(method, buf, names, sizes)
                elapsed = time.perf_counter() - t0
                used = time.process_time() - c0
                elapsed = world.allreduce(elapsed, op=MPI.MAX)
                used = world.allreduce(used, op=MPI.MAX)
                if i:
                    times[method].append(elapsed)
                    cpu[method].append(used)
                    parts[method]['compute'].append(
                        elapsed - sum(phases[k] for k in PHASES))
                    for k in ('encode', 'comm', 'decode', 'hop'):
                        parts[method][k].append(phases[k])
                    sent[method] = comm.sent
        if rank:
            continue
        for method, bits in methods:
            counted = method in ('fp16_ring', 'aps_wire_8bit',
                                 'aps_wire_4bit')
            if method == 'aps_emulated':
                per = (p - 1) * 4.0
                exps = len(sizes) * 2.0 * (p - 1) / p
            elif counted:
                per, exps = sent[method] / float(n), 0.0
            else:
                per, exps = 2.0 * (p - 1) / p * bits / 8.0, 0.0
            rec = {'method': method, 'bits': bits,
                   'bytes_per_element': per + exps / n,
                   'bytes_source': 'counted' if counted else 'model',
                   'seconds': B.median(times[method]),
                   'cpu_seconds': B.median(cpu[method]), 'elements': n,
                   'ranks': p, 'buffer': label, 'layers': len(sizes),
                   'repeats': repeats}
            for k in PHASES:
                rec['seconds_' + k] = B.median(parts[method][k])
            records.append(rec)
        print_block(records[-len(methods):])
        sys.stdout.flush()
    for name, fn in saved.items():
        setattr(WireCodec, name, fn)
    for name, fn in saved_part.items():
        setattr(_CodePart, name, fn)
    fp16_op.Free()
    if rank == 0 and args.json:
        with open(args.json, 'w') as f:
            json.dump({'machine': B.machine_info(), 'command': ' '.join(
                sys.argv), 'records': records}, f, indent=1)
        print('wrote {}'.format(args.json))


def print_block(recs):
    r0 = recs[0]
    print('\n{} ({} elements, {} layers), {} ranks, median of {}:'.format(
        r0['buffer'], r0['elements'], r0['layers'], r0['ranks'],
        r0['repeats']))
    print('  {:15s} {:>9s} {:>7s} {:>9s} {:>8s} {:>8s} {:>8s} {:>8s} '
          '{:>8s} {:>8s} {:>7s} {:>7s} {:>8s}'.format(
              'method', 'bytes/el', 'src', 'seconds', 'encode', 'comm',
              'decode', 'hop', 'compute', 'cpu', 'vs fp32', 'vs emul',
              'cpu/fp32'))
    by = {r['method']: r for r in recs}
    emul = by.get('aps_emulated', {'seconds': float('nan')})
    for r in recs:
        print('  {:15s} {:9.4f} {:>7s} {:9.4f} {:8.4f} {:8.4f} {:8.4f} '
              '{:8.4f} {:8.4f} {:8.4f} {:7.2f} {:7.2f} {:8.2f}'.format(
                  r['method'], r['bytes_per_element'], r['bytes_source'],
                  r['seconds'], r['seconds_encode'], r['seconds_comm'],
                  r['seconds_decode'], r['seconds_hop'],
                  r['seconds_compute'], r['cpu_seconds'],
                  r['seconds'] / by['fp32_allreduce']['seconds'],
                  r['seconds'] / emul['seconds'],
                  r['cpu_seconds'] / by['fp32_allreduce']['cpu_seconds']))


def summarize(paths):
    """A Markdown table of ``--json`` files: per buffer and P, the seconds
    of each method and the targets' ratios."""
    print('| P | buffer | elements | FP32 Allreduce [s] | FP16 Allreduce | '
          'FP16 ring | APS emulated | APS wire 8-bit | APS wire 4-bit | '
          'wire 8-bit bytes / FP32 | wire 8-bit / emulated | '
          'wire 8-bit / FP32 | CPU: wire 8-bit / FP32 | wire 4-bit / FP32 | '
          'CPU: wire 4-bit / FP32 |')
    print('|' + '---|' * 15)
    for path in paths:
        with open(path) as f:
            records = json.load(f)['records']
        rows = {}
        for r in records:
            rows.setdefault((r['ranks'], r['buffer'], r['elements']),
                            {})[r['method']] = r
        for (p, label, n), by in rows.items():
            w8, f32 = by['aps_wire_8bit'], by['fp32_allreduce']
            emul = by.get('aps_emulated', {'seconds': float('nan')})
            w4 = by['aps_wire_4bit']
            print('| {} | {} | {} | {} | {:.4f} | {} | {:.2f}x | '
                  '{:.2f}x | {:.2f}x | {:.2f}x |'.format(
                      p, label, n, ' | '.join(
                          '{:.4f}'.format(by[m]['seconds']) if m in by
                          else '—' for m, _ in METHODS),
                      w8['bytes_per_element'] / f32['bytes_per_element'],
                      '{:.2f}x'.format(w8['seconds'] / emul['seconds'])
                      if 'aps_emulated' in by else '—',
                      w8['seconds'] / f32['seconds'],
                      w8['cpu_seconds'] / f32['cpu_seconds'],
                      w4['seconds'] / f32['seconds'],
                      w4['cpu_seconds'] / f32['cpu_seconds']))


def codec_seconds(rec, p):
    """The wire mode's local time at ``p`` ranks from one record at
    ``rec['ranks']``: everything but MPI (``seconds − seconds_comm``), the
    hops scaled by (p − 1)/p ÷ (P − 1)/P (each rank adds (P − 1)/P of the
    elements), the rest (exponents, encoding, decoding, the mean) as
    measured (it is per element of the whole buffer, whatever P)."""
    P = rec['ranks']
    local = rec['seconds'] - rec['seconds_comm']
    hop = rec['seconds_hop']
    return local - hop + hop * ((p - 1.0) / p) / ((P - 1.0) / P)


def break_even(paths, targets=(8, 64)):
    """A Markdown table: per record of the 8-bit wire mode with a model
    buffer, the link bandwidth below which it beats FP32 averaging at
    ``targets`` ranks (:func:`~ada_loss.communication.cost.
    break_even_bandwidth`): from its local wall time (everything but MPI,
    the hops rescaled to P ranks; on a loaded machine this includes time
    off the CPU: a low bound), and from its extra CPU seconds over FP32's
    ``Allreduce`` at the measured P (both include their shared-memory
    copies)."""
    from ada_loss.communication.cost import break_even_bandwidth
    print('\n| measured at P | buffer | local time of the 8-bit wire mode '
          '(wall − MPI) [s] | P | modelled local time [s] | break-even '
          'bandwidth per link [Gbit/s] | CPU: wire − FP32 [s] | break-even '
          'from CPU [Gbit/s] |')
    print('|' + '---|' * 8)
    for path in paths:
        with open(path) as f:
            records = json.load(f)['records']
        fp32 = {(r['ranks'], r['buffer']): r for r in records
                if r['method'] == 'fp32_allreduce'}
        for r in records:
            if r['method'] != 'aps_wire_8bit' or r['buffer'].startswith('2^'):
                continue
            n, L = r['elements'], r['layers']
            sizes = [n - (L - 1)] + [1] * (L - 1)
            local = r['seconds'] - r['seconds_comm']
            extra_cpu = r['cpu_seconds'] - fp32[(r['ranks'], r['buffer'])][
                'cpu_seconds']
            for p in targets:
                c = codec_seconds(r, p)
                bw = break_even_bandwidth(sizes, 'fp8_e5m2', p, c)
                bw_cpu = break_even_bandwidth(sizes, 'fp8_e5m2', p,
                                              extra_cpu)
                print('| {} | {} | {:.4f} | {} | {:.4f} | {:.1f} | {:.4f} | '
                      '{:.1f} |'.format(r['ranks'], r['buffer'], local, p, c,
                                        bw * 8 / 1e9, extra_cpu,
                                        bw_cpu * 8 / 1e9))


def codec(args):
    """``--codec``: nanoseconds per value of the wire codec's steps in one
    process (``time.process_time``, best of ``--repeats``), on ``2^a``
    normal values (``--sweep``'s a) × 1e-3, 8-bit fp8_e5m2 and 4-bit e3m0:
    the old route (``quantize`` + encode table) and ml_dtypes' cast beside
    the compiled kernels (:mod:`~ada_loss.communication.kernels`): the
    rounding by table, plain and with APS's shift, a hop (plain and
    Kahan), decoding (plain and fused with the mean). The kernels are
    compiled (or loaded from their cache) before the timing; the first
    call's latency is printed."""
    from ada_loss.communication.allreduce import scale_layer
    from ada_loss.communication.codes import WireCodec
    from ada_loss.communication.wire import _CodePart
    n = 1 << args.sweep[0]
    x = numpy.random.RandomState(0).standard_normal(n).astype(
        numpy.float32) * numpy.float32(1e-3)
    print('codec steps, ns per value, {} values, best of {}'.format(
        n, args.repeats))

    def best(fn):
        times = []
        for _ in range(args.repeats):
            t0 = time.process_time()
            fn()
            times.append(time.process_time() - t0)
        return min(times) / n * 1e9

    t0 = time.perf_counter()
    WireCodec('fp8_e5m2').round_encode(x[:16])
    print('first call (kernel compiled or loaded from its cache, tables '
          'built): {:.2f} s'.format(time.perf_counter() - t0))
    for name in ('fp8_e5m2', 'e3m0'):
        c = WireCodec(name)
        f = c.format
        c.round_encode(x[:16])
        rows = [('quantize + encode (old route)',
                 lambda: c.encode(f.quantize(x))),
                ('x * 2^e, quantize + encode (old route)',
                 lambda: c.encode(f.quantize(
                     scale_layer(x, 20, numpy.empty_like(x)))))]
        if f.ml_dtype is not None:
            rows.append(('ml_dtypes astype (encode only)',
                         lambda: x.astype(f.ml_dtype)))
        part = _CodePart(c, False, n, x, [(0, n, 20)])
        plain = _CodePart(c, False, n, x, [])
        kahan = _CodePart(c, True, n, x, [(0, n, 20)])
        codes = part.own_wire(0, n)
        other = plain.own_wire(0, n)
        s, comp = other.copy(), numpy.zeros_like(other)
        out = numpy.empty(n, numpy.float32)
        # the mean of 4 ranks, one layer shifted by 20 (the wire's finish)
        finish = (0.25, numpy.array([0, n], numpy.int64),
                  numpy.array([2.0 ** -20]), numpy.zeros(1, bool))
        rows += [('encode: round by table (kernel)',
                  lambda: plain.own_wire(0, n, codes)),
                 ('encode: x * 2^e rounded by table (kernel)',
                  lambda: part.own_wire(0, n, codes)),
                 ('hop: own x * 2^e rounded + one ⊕ (kernel)',
                  lambda: part.hop(0, n, s, None)),
                 ('hop, Kahan: + four ⊖/⊕ lookups (kernel)',
                  lambda: kahan.hop(0, n, s, comp)),
                 ('decode (kernel)', lambda: c.decode(codes, n, out)),
                 ('decode + × 1/p + unshift (kernel)',
                  lambda: part.decode(codes, 0, n, out, finish))]
        if c.kind == 'byte':
            rows.append(('old decode (one value per lookup)',
                         lambda: numpy.take(c.decode_table, codes, out=out)))
        print('\n{} ({} bits):'.format(name, c.bits))
        for label, fn in rows:
            print('  {:46s} {:6.2f}'.format(label, best(fn)))
    y = numpy.empty_like(x)
    print('\nfor scale: one float32 multiply pass {:.2f}, max/min reduceat '
          '{:.2f}'.format(best(lambda: numpy.multiply(x, numpy.float32(2),
                                                      out=y)),
                          best(lambda: numpy.maximum.reduceat(
                              x, numpy.arange(0, n, n // 161)))))


def gpu(args):
    """``--device gpu`` (module docstring)."""
    import cupy
    from cupyx.profiler import benchmark
    from ada_loss.communication import CommPolicy, StepReduction
    from ada_loss.communication.codes import WireCodec
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    print('device: {}'.format(props['name'].decode()
                              if isinstance(props['name'], bytes)
                              else props['name']))

    def seconds(fn):
        r = benchmark(fn, n_repeat=args.repeats, n_warmup=1)
        return float(numpy.median(r.gpu_times[0]))

    def gradient(shape):
        g = cupy.random.RandomState(0).standard_normal(shape, numpy.float32)
        return g * numpy.float32(1e-3)

    t0 = time.perf_counter()
    WireCodec('fp8_e5m2').round_encode(gradient(16), shift=3)
    print('first call (CuPy kernels compiled or loaded from their cache): '
          '{:.2f} s'.format(time.perf_counter() - t0))
    print('\ncodec on the GPU: GB/s of float32 values (ratio: time / a '
          'device copy of the float32 values), median of {}'.format(
              args.repeats))
    print('  {:10s} {:9s} {:26s} {:>9s} {:>8s}'.format(
        'values', 'format', 'step', 'GB/s', 'x copy'))
    for a in range(args.sweep[0], args.sweep[1] + 1, args.sweep_step):
        n = 1 << a
        x = gradient(n)
        copy = seconds(lambda: x.copy())
        print('  {:10s} {:9s} {:26s} {:9.1f} {:8.2f}'.format(
            '2^{}'.format(a), '-', 'float32 copy', 4 * n / copy / 1e9, 1.0))
        for name in ('fp8_e5m2', 'e3m0'):
            c = WireCodec(name)
            q = c.format.quantize(x)
            wire = c.encode(q)
            codes = c.round_encode(x)
            rows = [('encode (table)', lambda: c.encode(q)),
                    ('round_encode x*2^20', lambda: c.round_encode(
                        x, shift=20)),
                    ('decode', lambda: c.decode(wire, n)),
                    ('one ⊕ by table', lambda: c.add_codes(codes, codes))]
            for label, fn in rows:
                s = seconds(fn)
                print('  {:10s} {:9s} {:26s} {:9.1f} {:8.2f}'.format(
                    '2^{}'.format(a), name, label, 4 * n / s / 1e9,
                    s / copy))
    p = args.workers
    sets = [(label, sizes) for label, sizes in buffer_sets(args)
            if label in args.models
            or sum(sizes) <= 1 << args.gpu_max_log2]
    print('\nreduction on the GPU (StepReduction.mean_of_stacked, {} '
          'workers): GB/s of the workers\' float32 gradients; ratios: time '
          '/ FP32 averaging on the same route, time / CuPy mean(axis=0)'
          .format(p))
    print('  {:10s} {:24s} {:>10s} {:>8s} {:>8s} {:>8s}'.format(
        'buffer', 'policy', 'ms', 'GB/s', 'x fp32', 'x mean'))
    for label, sizes in sets:
        n = sum(sizes)
        g = gradient((p, n))
        names = ['p{:04d}'.format(i) for i in range(len(sizes))]
        plain = seconds(lambda: g.mean(axis=0))
        base = None
        for pname, kw in POLICIES:
            plan = StepReduction(CommPolicy(**kw), names, sizes, p)
            s = seconds(lambda: plan.mean_of_stacked(g))
            base = base or s
            print('  {:10s} {:24s} {:10.3f} {:8.1f} {:8.2f} {:8.2f}'.format(
                label, pname, s * 1e3, 4 * p * n / s / 1e9, s / base,
                s / plain))
        del g


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--workers', type=int, default=8)
    p.add_argument('--per-worker', type=int, default=16)
    p.add_argument('--steps', type=int, default=3)
    p.add_argument('--warmup', type=int, default=1)
    p.add_argument('--repeats', type=int, default=5, help='--mpi only')
    p.add_argument('--repeats-large', type=int, default=3,
                   help='--mpi: repeats for buffers of >= 2^22 elements')
    p.add_argument('--models', default='resnet20,resnet50',
                   help='--mpi: model-sized buffers (resnet20, resnet50)')
    p.add_argument('--sweep', default='14,26',
                   help='--mpi: log2 sizes a,b of the sweep')
    p.add_argument('--sweep-step', type=int, default=2)
    p.add_argument('--max-log2', default='',
                   help='--mpi: P:b,... the sweep stops at 2^b for P ranks '
                   '(memory: the emulated mode gathers P copies)')
    p.add_argument('--json', help='--mpi: write the records here')
    p.add_argument('--methods', default=','.join(m for m, _ in METHODS),
                   help='--mpi: the methods to time (fp32_allreduce always)')
    p.add_argument('--resnet50-methods', default='',
                   help='--mpi: fewer methods for the ResNet-50 buffer '
                   '(P = 8: the emulated mode gathers P FP32 copies)')
    p.add_argument('--mpi', action='store_true')
    p.add_argument('--codec', action='store_true',
                   help='time the codec steps in one process (2^a values, '
                   'a from --sweep)')
    p.add_argument('--device', choices=('cpu', 'gpu'), default='cpu',
                   help='gpu: APS on CuPy arrays, codec and reduction '
                   'throughput (one GPU)')
    p.add_argument('--gpu-max-log2', type=int, default=24,
                   help='--device gpu: largest sweep buffer of the '
                   'reduction (2^b elements per worker)')
    p.add_argument('--summarize', nargs='+', metavar='JSON',
                   help='print a Markdown table of --json files and exit')
    args = p.parse_args()
    if args.summarize:
        summarize(args.summarize)
        break_even(args.summarize)
        return
    args.models = [m for m in args.models.split(',') if m]
    args.methods = args.methods.split(',')
    args.resnet50_methods = [m for m in args.resnet50_methods.split(',')
                             if m]
    args.sweep = [int(v) for v in args.sweep.split(',')]
    args.max_log2 = dict(tuple(int(v) for v in item.split(':'))
                         for item in args.max_log2.split(',') if item)
    if args.device == 'gpu':
        print('bench_aps --device gpu: APS on CuPy arrays')
        B.print_machine_info()
        gpu(args)
        return
    if args.codec:
        B.print_machine_info()
        codec(args)
        return
    if args.mpi:
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 0:
            print('bench_aps (--mpi): APS all-reduce vs FP32 averaging')
            B.print_machine_info()
        mpi(args)
    else:
        print('bench_aps: APS all-reduce vs FP32 averaging, simulated '
              'workers')
        B.print_machine_info()
        single(args)
        print('load avg at end: {}'.format(B.load_average()))


if __name__ == '__main__':
    main()
