"""APS on ChainerMN: a communicator whose gradient mean is the low-precision
all-reduce of Algorithm 1 (Han et al.), composed with the per-parameter
loss-scale sync of :mod:`ada_loss.training.distributed`.

What one ``multi_node_mean_grad`` (= ``allreduce_grad``) does, per step:

1. the loss-scale sync of ``sync_loss_scales_and_mean``: ranks agree on
   α* = min α per parameter (one ``Allreduce(MIN)``, float64) and rescale
   their (FP16 or FP32) gradients into one packed FP32 buffer at α*; with one
   global scale (fp32, none, fixed, dynamic) this is a no-op. So APS always
   sees gradients at a common scale, which is what a sum needs. (APS's shift
   makes the result independent of that scale, except for what the FP32
   rescaling itself underflows);
2. Algorithm 1's exponents: each rank's ``max_exp`` of every low-precision
   layer (parameter) of grad·p, one byte per layer, all layers in one
   ``Allreduce(MAX)`` of ``uint8`` codes;
3. each rank shifts its gradients by 2^(upper_exp − max_exp) and casts them
   to the format (``fmt.quantize``): its payload;
4. the payloads are exchanged with one ``Allgather`` (CPD's emulation,
   §5.1.1: "we first ask each node to gather all data from other nodes using
   MPI/NCCL with IEEE 754 float precision, and then accumulate these data
   independently with a customized precision"; the values travel as FP32
   holding format values, so the *bytes* on the wire here are FP32's; the
   byte counts a real implementation would send are in
   :mod:`~ada_loss.communication.cost`), and every rank accumulates them
   in the format in the policy's order (ring / hierarchical, optional
   Kahan), casts back, unshifts and multiplies by 1/p. All ranks run the
   same arithmetic on the same data: their means are bit-identical, and
   equal to the single-process simulator's
   (:mod:`~ada_loss.communication.simulator`), which calls the same code;
   With ``wire=True`` step 4 is a real low-precision all-reduce instead
   (:mod:`~ada_loss.communication.wire`): a ring reduce-scatter of codes
   (1 byte per value, ½ for 4-bit formats), each hop adding in the format
   with the emulation's ⊕, and an all-gather of the codes — 0.25× the
   bytes of FP32 for an 8-bit format — with the same result bit for bit;
5. back in the sync: the mean is rounded once to the parameter's dtype and
   ``param._loss_scale = α*``; ``UpdateRule`` unscales in FP32 as always.

The finiteness check of ``DistributedMixedPrecisionUpdater`` runs *before*
this reduction, on the local gradients; a low-precision sum that overflows
(only possible without APS) reaches the update, as it would in a real
system, and shows up as divergence. A layer reported non-finite through the
exponent message becomes NaN.
"""
import numpy

from ada_loss.communication.allreduce import StepReduction
from ada_loss.communication.policy import CommPolicy
from ada_loss.communication.wire import split_groups, wire_mean
from ada_loss.training.distributed import (
    DistributedMixedPrecisionUpdater, LossScaleSyncCommunicator,
    sync_loss_scales_and_mean)

_F32 = numpy.float32


class APSCommunicator(LossScaleSyncCommunicator):
    """A ChainerMN communicator (wrapping ``comm``) whose gradient mean is
    the low-precision all-reduce of ``policy`` (module docstring); every
    other method is the wrapped communicator's.

    Attributes:
        epoch (float): the current epoch, for ``policy.fp32_epochs`` (the
            hybrid schedule); :class:`APSDistributedUpdater` sets it.
        last_max_exps (numpy.ndarray): the agreed exponent codes of the last
            step (``uint8`` codes, one per low-precision layer).
        wire (bool): codes on the wire (:mod:`~.wire`) instead of the
            emulation's FP32 ``Allgather``; the same means, bit for bit.
    """

    def __init__(self, comm, policy, wire=False):
        super(APSCommunicator, self).__init__(comm)
        if not isinstance(policy, CommPolicy):
            raise TypeError('policy must be a CommPolicy')
        if not isinstance(wire, bool):
            raise TypeError('wire must be True or False, got {!r}'.format(
                wire))
        policy.check(comm.size)
        self.policy = policy
        self.wire = wire
        self.epoch = 0.0
        self.last_max_exps = None
        self._groups = None

    def multi_node_mean_grad(self, model, zero_fill=False):
        """Loss-scale sync + APS low-precision mean (``zero_fill`` ignored:
        unused parameters are always zero-filled, as in the sync)."""
        sync_loss_scales_and_mean(model, self._comm.mpi_comm,
                                  mean=self.mean_packed)

    allreduce_grad = multi_node_mean_grad

    def mean_packed(self, buf, names, sizes):
        """The mean over the ranks of the packed gradients ``buf`` (this
        rank's part), reduced as the policy says."""
        mpi = self._comm.mpi_comm
        plan = StepReduction(self.policy, names, sizes, mpi.size, self.epoch)
        buf32 = numpy.ascontiguousarray(buf, _F32)
        if self.wire:
            if self.policy.order == 'hierarchical' and self._groups is None:
                self._groups = split_groups(mpi, self.policy.group_size)
            mean, self.last_max_exps = wire_mean(mpi, plan, buf32,
                                                 self._groups)
        else:
            mean, self.last_max_exps = emulated_mean(mpi, plan, buf32)
        return mean.astype(buf.dtype, copy=False)


def emulated_mean(comm, plan, buffer):
    """The emulated mode's mean (module docstring, steps 2–4): exponent
    ``Allreduce(MAX)``, ``Allgather`` of the FP32 payloads, the sum in the
    format on every rank. Returns ``(mean, agreed exponent codes)``."""
    from mpi4py import MPI
    local = plan.local_max_exps(buffer)
    agreed = numpy.empty_like(local)
    if plan.uses_exponents:
        comm.Allreduce(local, agreed, op=MPI.MAX)
    shift, bad = plan.shifts(agreed)
    payload = numpy.ascontiguousarray(plan.encode(buffer, shift), _F32)
    gathered = numpy.empty((comm.Get_size(), plan.size), _F32)
    comm.Allgather(payload, gathered)
    return plan.reduce(gathered, shift, bad), agreed


def create_aps_multi_node_optimizer(optimizer, comm, policy, wire=False):
    """``chainermn.create_multi_node_optimizer`` with APS communication
    (and the loss-scale sync); ``wire=True``: codes on the wire."""
    import chainermn
    return chainermn.create_multi_node_optimizer(
        optimizer, APSCommunicator(comm, policy, wire))


class APSDistributedUpdater(DistributedMixedPrecisionUpdater):
    """The distributed updater that tells the APS communicator the epoch
    (``iterator.epoch_detail`` before the step's batch is drawn; the same
    convention as the simulator)."""

    def update_core(self):
        comm = self._optimizers['main'].communicator
        comm.epoch = self._iterators['main'].epoch_detail
        super(APSDistributedUpdater, self).update_core()
