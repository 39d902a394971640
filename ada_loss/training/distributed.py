"""ChainerMN data parallelism with loss scaling, per-layer scales included.

Why the loss scales need synchronizing
--------------------------------------
ChainerMN's multi-node optimizer averages ``param.grad`` over the ranks
(``multi_node_mean_grad``) *before* ``UpdateRule`` divides each gradient by
``param._loss_scale`` in FP32. The gradients reaching that allreduce are
therefore still *scaled*. With one global scale that every rank shares
(``fixed:S``, or ``dynamic`` when every rank agrees on overflow) averaging
scaled gradients is fine. Adaptive loss scaling (paper §3) gives every
parameter its own α = α_{N+1} · Π β, and each β is computed from the rank's
*own* activation gradients (Algorithm 4 looks at the data): two ranks can hold
the same parameter's gradient at α = 2^10 and α = 2^11. Averaging those
arrays and dividing by either α weights each rank's gradient by α_rank / α:
wrong (in tests/experiment the weights end up 57% off the single-process
result after three steps, against 1e-5 with the fix below).

The fix (exact rescaling; rounding as in plain ChainerMN)
--------------------------------------------------------
:class:`LossScaleSyncCommunicator` wraps the ChainerMN communicator and
replaces its ``multi_node_mean_grad``:

1. Every rank builds the vector of its parameters' α (1 where none; +inf for
   a parameter without gradient on that rank) and the ranks agree on
   ``α* = allreduce(α, MIN)`` per parameter. The minimum is the only safe
   common choice: rescaling *down* cannot overflow (Algorithm 5 of the paper
   makes the same choice where gradients at different scales meet).
2. Each rank casts its gradient to FP32, multiplies it by ``α*/α`` (a power
   of two: exact in FP32), and all gradients are packed into one FP32 buffer.
3. One ``Allreduce(SUM)`` of that buffer (FP32 sums, as ChainerMN does for
   FP16 gradients), then ×1/size in FP32, so the mean never exceeds the
   largest local value (no overflow when rounding back; ChainerMN rounds the
   *sum* to FP16 first), then one rounding to the parameter's dtype (FP16 for
   mixed16 weights); ``param._loss_scale = α*``. The only precision given up
   is the underflow of the rescaled-down gradients, exactly the trade-off
   Algorithm 5 makes where gradients at different scales are summed.

``UpdateRule`` then unscales the averaged gradient by α* in FP32 exactly as in
single-process training, and every rank applies the same update to the same
FP32 master weights: the weights stay bit-identical across ranks.

An alternative, unscaling into FP32 *before* the allreduce, is not possible
in Chainer: an FP16 parameter's ``grad`` must be FP16, and an unscaled FP16
gradient would underflow, the very problem loss scaling avoids.

Skipped steps must be agreed on as well: if one rank's gradients overflow
and it skips ``optimizer.update()`` while another calls it, the allreduce
deadlocks. :class:`DistributedMixedPrecisionUpdater` makes the finiteness
test global (allreduce of a flag), so all ranks skip together and the
dynamic/adaptive state machines see the same overflow signal.

Use :func:`create_multi_node_optimizer` instead of ChainerMN's function.
"""
import chainermn
import numpy

from ada_loss import _chainer_compat
from ada_loss.training.updater import MixedPrecisionUpdater, all_grads_finite


def create_communicator(name='naive'):
    """A ChainerMN communicator (``'naive'`` runs on CPU)."""
    # imports mpi4py (optional), and MPI_Init with it: only when needed
    import chainermn.communicators._memory_utility  # NOQA
    _chainer_compat.apply_chainermn()   # NumPy 2: flat/non-CUDA-aware ones
    return chainermn.create_communicator(name)


def sync_loss_scales_and_mean(model, mpi_comm, mean=None):
    """Averages the gradients of ``model`` over ``mpi_comm`` at one common
    loss scale per parameter (see the module docstring).

    Args:
        mean: ``None`` (FP32 ``Allreduce(SUM)`` × 1/size), or a function
            ``mean(buf, names, sizes)`` returning the mean over the ranks of
            the packed, rescaled FP32 gradients ``buf`` (parameter ``names``
            and ``sizes`` in buffer order), e.g. the low-precision
            all-reduce of :mod:`ada_loss.communication`.

    Returns:
        numpy.ndarray: the common scale α* of each parameter, in the order
        of ``sorted(model.namedparams())`` (parameters without data skipped).
    """
    from mpi4py import MPI
    named = [(n, p) for n, p in sorted(model.namedparams())
             if p.array is not None]
    params = [p for _, p in named]
    local = numpy.empty(len(params), numpy.float64)
    for i, p in enumerate(params):
        if p.grad is None:
            # Unused on this rank: zeros, at a scale that constrains nothing.
            # (Always zero-filled: every rank must send the same buffer.)
            local[i] = numpy.inf
            p.grad = p.xp.zeros_like(p.array)
        else:
            local[i] = 1.0 if p._loss_scale is None else float(p._loss_scale)
    common = numpy.empty_like(local)
    mpi_comm.Allreduce(local, common, op=MPI.MIN)
    common[numpy.isinf(common)] = 1.0

    wide = any(p.grad is not None and p.grad.dtype == numpy.float64
               for p in params)
    buf_dtype = numpy.float64 if wide else numpy.float32
    sizes = [p.array.size for p in params]
    buf = numpy.zeros(sum(sizes), buf_dtype)
    offset = 0
    for p, n, a_local, a_common in zip(params, sizes, local, common):
        if numpy.isfinite(a_local):
            g = buf[offset:offset + n]
            g[...] = p.grad.ravel()
            if a_common != a_local:
                g *= buf_dtype(a_common / a_local)
        offset += n
    if mean is None:
        mpi_comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        buf *= buf_dtype(1.0 / mpi_comm.size)
    else:
        buf = mean(buf, [n for n, _ in named], sizes)
    offset = 0
    for p, n, a_common in zip(params, sizes, common):
        p.grad[...] = buf[offset:offset + n].reshape(p.grad.shape)
        p._loss_scale = None if a_common == 1.0 else float(a_common)
        offset += n
    return common


class LossScaleSyncCommunicator(object):
    """A ChainerMN communicator whose ``multi_node_mean_grad`` first brings
    every parameter's gradient to the ranks' common (minimum) loss scale;
    everything else is delegated to the wrapped communicator."""

    def __init__(self, comm):
        self._comm = comm

    def multi_node_mean_grad(self, model, zero_fill=False):
        """Mean of the gradients at a common loss scale. Unused parameters
        are always zero-filled (``zero_fill`` is ignored): every rank must
        contribute the same buffer layout."""
        sync_loss_scales_and_mean(model, self._comm.mpi_comm)

    # ChainerMN < 7 name
    allreduce_grad = multi_node_mean_grad

    def __getattr__(self, name):
        return getattr(self._comm, name)


def create_multi_node_optimizer(optimizer, comm):
    """``chainermn.create_multi_node_optimizer`` with loss-scale sync."""
    return chainermn.create_multi_node_optimizer(
        optimizer, LossScaleSyncCommunicator(comm))


def prime_multi_node_optimizer(optimizer, comm):
    """Broadcasts rank 0's parameters now and marks the parameter set as
    seen, so the first ``update()`` averages and applies gradients instead
    of only broadcasting (ChainerMN's behaviour on its first call)."""
    model = optimizer.target
    comm.bcast_data(model)
    optimizer.is_changed(model)


class DistributedMixedPrecisionUpdater(MixedPrecisionUpdater):
    """:class:`MixedPrecisionUpdater` whose overflow test is global: a step
    is skipped on every rank if any rank's gradients are not finite."""

    def __init__(self, iterator, optimizer, loss_scaling, comm, **kwargs):
        self.comm = comm
        super(DistributedMixedPrecisionUpdater, self).__init__(
            iterator, optimizer, loss_scaling, **kwargs)

    def grads_finite(self, model):
        from mpi4py import MPI
        local = all_grads_finite(model, self.loss_scaling.fmt)
        return bool(self.comm.mpi_comm.allreduce(local, op=MPI.LAND))
