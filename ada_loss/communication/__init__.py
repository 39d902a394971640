"""Low-precision gradient communication for data-parallel training:
Auto-Precision Scaling (APS; Han et al., *Auto-Precision Scaling for
Distributed Deep Learning*) on ChainerMN and in an N-worker
simulator.

* :func:`allreduce_low_precision`: one layer's gradients of p workers → their
  FP32 mean, reduced in an (exp, man) format with Algorithm 1's per-layer
  power-of-two shift, the sum emulated in the format in ring or hierarchical
  order (§4.1, §4.2), optionally with Kahan summation (§5.1.1).
* :class:`CommPolicy`: format, APS on/off, order, Kahan, FP32 layers
  (Table 7), hybrid FP32-first schedule (Table 6).
* :class:`StepReduction`: the same for all parameters of a step (one
  exponent message for all layers).
* :mod:`~ada_loss.communication.communicator`: the ChainerMN communicator
  (``APSCommunicator``; composes with the per-parameter loss-scale sync),
  emulated or (``wire=True``) with the format's codes on the wire:
  :mod:`~ada_loss.communication.codes` (values ↔ 1-byte / packed 4-bit
  codes) and :mod:`~ada_loss.communication.wire` (ring reduce-scatter +
  all-gather and hierarchical order over MPI, bit-identical to the
  emulation).
* :mod:`~ada_loss.communication.simulator`: N workers in one process.
* :mod:`~ada_loss.communication.roundoff` (Eq. 5) and
  :mod:`~ada_loss.communication.cost` (bytes and steps per all-reduce).

Everything here except the communicator and the simulator needs NumPy only.
The simulator's reduction and the codec also take CuPy arrays (a model on a
GPU) and give NumPy's bits (:mod:`~ada_loss.communication.allreduce`).
"""
from ada_loss.communication.allreduce import (  # NOQA
    StepReduction, allreduce_low_precision, plain_mean)
from ada_loss.communication.exponents import find_max_exp  # NOQA
from ada_loss.communication.policy import CommPolicy  # NOQA
from ada_loss.communication.roundoff import average_round_off_error  # NOQA
from ada_loss.communication.summation import (  # NOQA
    ORDERS, hierarchical_steps, low_precision_sum, ring_steps)
