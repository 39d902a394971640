"""Run under ``mpiexec -n P`` by test_wire.py: the wire mode of the APS
all-reduce (:func:`ada_loss.communication.wire.wire_mean`) against the
emulation (``StepReduction.mean_of_stacked(reference=True)``: NumPy)
for every format of at most 8 bits (and FP16, bfloat16), with and without
Kahan, ring and hierarchical group sizes of P, on buffers with ragged layer
sizes, FP32 layers, a non-finite layer, overflowing values and a NaN without
APS, and the hybrid FP32-first epochs. Every rank builds every rank's buffer from the same seed,
so it computes the emulation itself and compares its own wire result bit for
bit; the MPI calls go through a wrapper that counts the bytes each rank
sends. Prints one ``RESULT`` JSON line (rank 0): failures (must be empty),
counts, and the measured bytes of a few ring cases.
"""
import json

import numpy

from ada_loss.communication import CommPolicy, StepReduction
from ada_loss.communication import codes
from ada_loss.communication.codes import WireCodec, format_bits
from ada_loss.communication.wire import split_groups, wire_mean
from ada_loss.formats import get_format

DEFAULT_BLOCK = codes.BLOCK
NAMED = ['fp8_e4m3', 'fp8_e5m2', 'fp6_e3m2', 'fp6_e2m3', 'fp4_e2m1']
IEEE = ['e{}m{}'.format(e, m) for e in range(2, 8) for m in range(0, 8 - e)]
# every format of the project with <= 8 bits, and the 16-bit ones
FORMATS = NAMED + IEEE + ['float16', 'bfloat16']

# layers: ragged sizes (none a multiple of 2, 3, 4 or 8), an empty one, a
# single element, an FP32 classifier
NAMES = ['/a/W', '/b/W', '/c/b', '/d/W', '/e/W', '/predictor/fc/W']
SIZES = [37, 1, 0, 101, 23, 13]


class CountingComm(object):
    """An mpi4py communicator whose buffer calls count the bytes this rank
    sends: ``Sendrecv``/``Send`` their send buffer, ``Allreduce`` its
    input, ``Bcast`` the root's buffer (once, on the root), ``Allgatherv``
    its block times P − 1 (a ring all-gather's figure)."""

    def __init__(self, comm, counts=None):
        self.comm = comm
        self.counts = {} if counts is None else counts

    def _add(self, key, nbytes):
        self.counts[key] = self.counts.get(key, 0) + int(nbytes)

    def Get_rank(self):
        return self.comm.Get_rank()

    def Get_size(self):
        return self.comm.Get_size()

    def Allreduce(self, send, recv, op):
        self._add('Allreduce', numpy.asarray(send).nbytes)
        return self.comm.Allreduce(send, recv, op=op)

    def Sendrecv(self, send, dest, recvbuf, source):
        self._add('Sendrecv', send.nbytes)
        return self.comm.Sendrecv(send, dest=dest, recvbuf=recvbuf,
                                  source=source)

    def Allgatherv(self, send, recv):
        # what a ring all-gather makes each rank send: its block to each
        # of the P − 1 others (MPI picks the algorithm; the bytes each
        # rank must receive are the same whichever it picks)
        self._add('Allgatherv', (self.comm.Get_size() - 1) * send.nbytes)
        return self.comm.Allgatherv(send, recv)

    def Send(self, buf, dest):
        self._add('Send', buf.nbytes)
        return self.comm.Send(buf, dest=dest)

    def Recv(self, buf, source):
        return self.comm.Recv(buf, source=source)

    def Bcast(self, buf, root):
        if self.comm.Get_rank() == root and self.comm.Get_size() > 1:
            self._add('Bcast', buf.nbytes)
        return self.comm.Bcast(buf, root=root)

    def Split(self, color, key):
        sub = self.comm.Split(color, key)
        from mpi4py import MPI
        return sub if sub == MPI.COMM_NULL else CountingComm(sub, self.counts)


def buffers(p, seed, fmt, large):
    """Every rank's packed gradients (``(p, n)`` float32): normal values of
    a different magnitude per layer, exact zeros, tiny values;
    ``large``: beyond the format's largest value (overflow without APS)."""
    rng = numpy.random.RandomState(seed)
    n = sum(SIZES)
    scale = numpy.repeat(2.0 ** rng.randint(-30, 10, size=len(SIZES)), SIZES)
    out = (rng.standard_normal((p, n)) * scale).astype(numpy.float32)
    out[:, ::17] = 0
    out[:, 5::19] *= numpy.float32(2.0 ** -20)
    if large:
        with numpy.errstate(over='ignore'):
            out *= numpy.float32(get_format(fmt).u_max / 2)
    return out


def same(a, b):
    """Bit for bit."""
    a = numpy.asarray(a, numpy.float32).view(numpy.uint32)
    return numpy.array_equal(a, numpy.asarray(b, numpy.float32).view(
        numpy.uint32))


def same_nan(a, b):
    """Bit for bit where not NaN, NaN at the same places (the sign of a NaN
    made from two NaNs depends on NumPy's loop, not on the order)."""
    na, nb = numpy.isnan(a), numpy.isnan(b)
    return numpy.array_equal(na, nb) and same(a[~na], b[~nb])


def orders(p):
    """The ring and hierarchical group sizes of P: all of them for P <= 3
    (k = 1: one rank per group; k = P: one group); for P = 4 k = 2; for
    P = 8 (oversubscribed, slow) k = 4 (k = 2 is P = 4's)."""
    yield 'ring', None
    for k in range(1, p + 1):
        if p % k == 0 and (p <= 3 or k == min(p // 2, 4)):
            yield 'hierarchical', k


def kahan_settings(p, index):
    """Both for P <= 4; for P = 8 Kahan on for every other format (each
    format has both at P = 2, 3, 4)."""
    return (False, True) if p <= 4 else (bool(index % 2),)


def cases(p):
    """(label, policy kwargs, epoch, large, nonfinite rank)."""
    for index, fmt in enumerate(FORMATS):
        for kahan in kahan_settings(p, index):
            yield (fmt, dict(fmt=fmt, kahan=kahan,
                             fp32_layers=['*/fc/*']), 0.0, False, True)
            yield (fmt + ' noaps', dict(fmt=fmt, kahan=kahan, aps=False),
                   0.0, True, False)
    for kahan in (False, True):
        yield ('hybrid', dict(fmt='fp8_e5m2', kahan=kahan, fp32_epochs=1),
               0.5, False, False)


def main():
    # imported here: test_wire.py imports this module's cases without MPI
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    p, rank = world.Get_size(), world.Get_rank()
    comm = CountingComm(world)
    groups = {k: split_groups(comm, k) for _, k in orders(p) if k}
    failures, checked, nan_checked, nan_less, seed = [], 0, 0, 0, 0
    for label, kw, epoch, large, nonfinite in cases(p):
        for order, k in orders(p):
            seed += 1
            policy = CommPolicy(order=order, group_size=k, **kw)
            plan = StepReduction(policy, NAMES, SIZES, p, epoch)
            bufs = buffers(p, seed, kw['fmt'], large)
            if nonfinite:
                # rank (seed mod p)'s layer /d/W holds an Inf: with APS, the
                # exponent message makes the layer NaN
                bufs[seed % p, 40] = numpy.inf
            else:
                # one NaN gradient element: without APS it is summed as is
                bufs[seed % p, 7] = numpy.nan
            # every other case in blocks of 16 values: the blocked loops
            # of the codes' fast path cross many block and layer ends
            codes.BLOCK = 16 if seed % 2 else DEFAULT_BLOCK
            with numpy.errstate(over='ignore', invalid='ignore'):
                expected = plan.mean_of_stacked(bufs, reference=True)
                got, _ = wire_mean(comm, plan, bufs[rank], groups.get(k))
            codes.BLOCK = DEFAULT_BLOCK
            nans = numpy.isnan(expected)
            if nans.any() and not nans.all():
                nan_checked += 1
                # NaN in a format that has no NaN code (sent apart)
                nan_less += not WireCodec(kw['fmt']).has_nan
            ok = same_nan(got, expected)
            checked += 1
            if not ok:
                failures.append('{} {} k={} kahan={}'.format(
                    label, order, k, kw['kahan']))
    bytes_rows = measure_bytes(comm, p)
    everyone = world.gather((failures, checked, nan_checked, nan_less),
                           root=0)
    if rank == 0:
        print('RESULT ' + json.dumps({
            'ranks': p, 'failures': sorted(set(sum((e[0] for e in everyone),
                                                   []))),
            'checked': [e[1] for e in everyone],
            'with_nan': everyone[0][2], 'nan_less_with_nan': everyone[0][3],
            'bytes': bytes_rows}))


def measure_bytes(comm, p):
    """Bytes this rank sends for ring all-reduces of one 8-bit and one
    4-bit format, with and without Kahan, on n = 8·p·64 elements in two
    layers (chunks of even length), plus one with an FP32 layer."""
    n_half = 4 * p * 64
    names, sizes = ['/x/W', '/y/W'], [n_half, n_half]
    rows = []
    rng = numpy.random.RandomState(1)
    for fmt in ('fp8_e4m3', 'e3m0'):
        for kahan in (False, True):
            for fp32 in ([], ['/y/*']):
                for aps in (True, False):
                    comm.counts.clear()
                    plan = StepReduction(CommPolicy(fmt, aps=aps,
                                                    kahan=kahan,
                                                    fp32_layers=fp32),
                                         names, sizes, p)
                    # small enough not to overflow e3m0 (max 8) unshifted
                    buf = (rng.standard_normal(plan.size) / 64).astype(
                        numpy.float32)
                    wire_mean(comm, plan, buf)
                    rows.append({'fmt': fmt, 'bits': format_bits(fmt),
                                 'aps': aps, 'kahan': kahan,
                                 'fp32_elements': n_half if fp32 else 0,
                                 'elements': plan.size,
                                 'lp_layers': 1 if fp32 else 2,
                                 'counts': dict(comm.counts)})
    # the cost model's formats beyond 8/4 bits: a 6-bit format (one byte
    # per code) and FP32 with APS (one exponent byte per layer), no Kahan
    for fmt in ('fp6_e3m2', 'float32'):
        comm.counts.clear()
        plan = StepReduction(CommPolicy(fmt), names, sizes, p)
        wire_mean(comm, plan, (rng.standard_normal(plan.size) / 64).astype(
            numpy.float32))
        rows.append({'fmt': fmt, 'bits': format_bits(fmt), 'aps': True,
                     'kahan': False, 'fp32_elements': 0,
                     'elements': plan.size, 'lp_layers': 2,
                     'counts': dict(comm.counts)})
    # hierarchical, groups of 2 (of P when P is odd): every rank's counts
    k = 2 if p % 2 == 0 else p
    groups = split_groups(comm, k)
    comm.counts.clear()
    plan = StepReduction(CommPolicy('fp8_e4m3', order='hierarchical',
                                    group_size=k), names, sizes, p)
    wire_mean(comm, plan, rng.standard_normal(plan.size).astype(
        numpy.float32), groups)
    rows.append({'fmt': 'fp8_e4m3', 'order': 'hierarchical',
                 'group_size': k, 'elements': plan.size, 'lp_layers': 2,
                 'counts_per_rank': comm.comm.allgather(dict(comm.counts))})
    return rows


if __name__ == '__main__':
    main()
