"""N data-parallel workers in one process, for accuracy studies of
low-precision gradient communication (APS, Han et al.) at any N (256+).

:class:`SimulatedDataParallelUpdater` is a :class:`MixedPrecisionUpdater`
whose step is what N ChainerMN ranks running
:class:`~ada_loss.communication.communicator.APSDistributedUpdater` compute:

1. the global batch (``iterator.batch_size`` = N × the per-worker batch) is
   cut into N consecutive shards: shard r is what rank r holds (rank r's
   iterator over ``dataset[r::N]``-style data yields exactly it, see the
   tests). A batch that does not split evenly raises ``ValueError``;
2. per shard: ``cleargrads``, forward, the loss-scaling method's backward;
   the shard's gradients and per-parameter α are kept;
3. the finiteness test is global (any shard non-finite → every worker skips,
   as ``DistributedMixedPrecisionUpdater`` agrees by ``MPI.LAND``);
4. the loss-scale sync of :mod:`ada_loss.training.distributed` (α* = min
   over workers, FP32 rescaling into packed buffers), then the APS reduction
   of :class:`~ada_loss.communication.allreduce.StepReduction` on the stacked
   buffers (the same functions the communicator calls), then the rounding to
   the parameter dtype, ``_loss_scale = α*`` and one ``optimizer.update()``.

For N = 2 the parameters are bit-identical to a 2-process ChainerMN run
(tests/communication). With a model on a GPU (CuPy gradients) the buffers
and the reduction stay on the device (:mod:`~ada_loss.communication.
allreduce`: NumPy's bits for the same gradients; the α* rescaling of
float32 buffers by :func:`ada_loss.formats.exact.multiply`, which keeps
subnormals). What the simulator does not reproduce: per-rank state
that does not reach the parameters (batch-norm running statistics are
updated by every shard in turn, as one process sees them), and per-rank
caches that persist across steps (adaptive scaling with ``update_interval``
> 1 caches β per weight: one cache here, N caches on N ranks).
"""
import numpy

from ada_loss.communication.allreduce import StepReduction
from ada_loss.communication.policy import CommPolicy
from ada_loss.formats import exact
from ada_loss.formats.quantize import array_module
from ada_loss.training.updater import MixedPrecisionUpdater, call_loss


def split_batch(batch, n_workers):
    """The N shards of a global batch (a list of examples).

    Raises:
        ValueError: the batch size is not a multiple of N.
    """
    if len(batch) % n_workers:
        raise ValueError('a batch of {} examples cannot be split into {} '
                         'equal shards (the global batch size must be a '
                         'multiple of the number of workers)'.format(
                             len(batch), n_workers))
    b = len(batch) // n_workers
    return [batch[r * b:(r + 1) * b] for r in range(n_workers)]


def check_batch(batchsize, n_workers):
    """Raises ValueError unless ``batchsize`` splits into ``n_workers``."""
    if batchsize % n_workers:
        raise ValueError('global batch size {} cannot be split into {} '
                         'equal shards (it must be a multiple of the number '
                         'of workers)'.format(batchsize, n_workers))


def simulated_mean(named_params, worker_grads, policy, epoch=0.0):
    """What ``sync_loss_scales_and_mean`` + ``APSCommunicator`` compute on N
    ranks, from the N workers' gradients held in one process; sets each
    parameter's ``grad`` and ``_loss_scale``.

    Args:
        named_params: ``[(name, param)]`` sorted by name, with data.
        worker_grads: per worker, per parameter ``(grad or None, α)``.
    Returns:
        numpy.ndarray: α* per parameter.
    """
    n_workers = len(worker_grads)
    params = [p for _, p in named_params]
    local = numpy.empty((n_workers, len(params)), numpy.float64)
    for w, grads in enumerate(worker_grads):
        for i, (g, alpha) in enumerate(grads):
            local[w, i] = numpy.inf if g is None else (
                1.0 if alpha is None else float(alpha))
    common = local.min(axis=0)
    common[numpy.isinf(common)] = 1.0
    wide = any(g is not None and g.dtype == numpy.float64
               for grads in worker_grads for g, _ in grads)
    buf_dtype = numpy.float64 if wide else numpy.float32
    sizes = [p.array.size for p in params]
    xp = array_module(params[0].array) if params else numpy
    bufs = xp.zeros((n_workers, sum(sizes)), buf_dtype)
    for w, grads in enumerate(worker_grads):
        offset = 0
        for (g, _), n, a_local, a_common in zip(grads, sizes, local[w],
                                                 common):
            if numpy.isfinite(a_local):
                seg = bufs[w, offset:offset + n]
                seg[...] = g.ravel()
                if a_common != a_local:
                    if xp is not numpy and buf_dtype is numpy.float32:
                        # the GPU's float32 multiply flushes subnormals
                        seg[...] = exact.multiply(
                            seg, numpy.float32(a_common / a_local))
                    else:
                        seg *= buf_dtype(a_common / a_local)
            offset += n
    plan = StepReduction(policy, [n for n, _ in named_params], sizes,
                         n_workers, epoch)
    mean = plan.mean_of_stacked(bufs.astype(numpy.float32, copy=False)) \
        .astype(buf_dtype, copy=False)
    offset = 0
    last = worker_grads[-1]
    for p, (g, _), n, a_common in zip(params, last, sizes, common):
        if g is None:
            g = p.xp.zeros_like(p.array)
        p.grad = g
        p.grad[...] = mean[offset:offset + n].reshape(p.grad.shape)
        p._loss_scale = None if a_common == 1.0 else float(a_common)
        offset += n
    return common


class SimulatedDataParallelUpdater(MixedPrecisionUpdater):
    """One step of N simulated data-parallel workers (module docstring).

    Args:
        iterator: yields global batches (N × per-worker batch).
        optimizer: a plain (not multi-node) optimizer on the model.
        loss_scaling, mode, converter, device, loss_func: as
            :class:`MixedPrecisionUpdater`.
        n_workers (int): N.
        policy (CommPolicy): the communication precision.

    Raises:
        ValueError: bad policy for N (group size), or an iterator batch
            size that is not a multiple of N — at construction.
    """

    def __init__(self, iterator, optimizer, loss_scaling, n_workers, policy,
                 mode='', **kwargs):
        if not isinstance(policy, CommPolicy):
            raise TypeError('policy must be a CommPolicy')
        if isinstance(n_workers, bool) or not isinstance(
                n_workers, (int, numpy.integer)) or n_workers < 1:
            raise ValueError('n_workers must be a positive integer, got '
                             '{!r}'.format(n_workers))
        policy.check(n_workers)
        batchsize = getattr(iterator, 'batch_size', None)
        if batchsize is not None:
            check_batch(batchsize, n_workers)
        self.n_workers = int(n_workers)
        self.policy = policy
        super(SimulatedDataParallelUpdater, self).__init__(
            iterator, optimizer, loss_scaling, mode=mode, **kwargs)

    def update_core(self):
        iterator = self._iterators['main']
        optimizer = self._optimizers['main']
        model = optimizer.target
        epoch = iterator.epoch_detail
        shards = split_batch(iterator.next(), self.n_workers)
        loss_func = self.loss_func or model
        named = [(n, p) for n, p in sorted(model.namedparams())
                 if p.array is not None]
        worker_grads = []
        finite, where = True, None
        losses = []
        for shard in shards:
            in_arrays = self.converter(shard, self.input_device)
            model.cleargrads()
            loss = call_loss(loss_func, in_arrays)
            losses.append(float(loss.array))
            self.loss_scaling.backward(loss)
            worker_finite = self.grads_finite(model)
            if not worker_finite and where is None:
                # the first worker whose gradients overflowed names it
                where = self.locate_nonfinite(model, loss)
            del loss
            finite = worker_finite and finite
            worker_grads.append([(p.grad, p._loss_scale) for _, p in named])
        self.last_loss = float(numpy.mean(losses))

        def apply():
            simulated_mean(named, worker_grads, self.policy, epoch)
            optimizer.update()
        self.finish_step(finite, apply, where=where,
                         shard_loss=self.last_loss)
