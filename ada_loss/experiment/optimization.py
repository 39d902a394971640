"""How a run updates its parameters: the loss scaling of its mode
(:func:`make_scaling`, observed by the GEMM probe or the recorder when the
``log`` section asks), the optimizer (:func:`build_optimizer`: MomentumSGD,
FP32 master weights, weight decay, ChainerMN and APS) and the updater
(:func:`make_updater`)."""
import contextlib
import io

import chainer

from ada_loss import atomic
from ada_loss.analysis.gemm_probe import ProbingLossScaling
from ada_loss.analysis.recorder import RecordingLossScaling
from ada_loss.communication.communicator import (
    APSDistributedUpdater, create_aps_multi_node_optimizer)
from ada_loss.experiment.run_folder import is_writer
from ada_loss.scaling import make_loss_scaling, parse_mode
from ada_loss.training import MixedPrecisionUpdater
from ada_loss.training.hooks import add_weight_decay
from ada_loss.training.precision_setup import setup_optimizer
from ada_loss.training.distributed import (
    DistributedMixedPrecisionUpdater, create_multi_node_optimizer,
    prime_multi_node_optimizer)


def make_scaling(mode, precision, log_cfg, comm=None):
    """The loss scaling of ``mode`` in ``precision``
    (:func:`ada_loss.scaling.make_loss_scaling`), wrapped in a
    :class:`~ada_loss.analysis.gemm_probe.ProbingLossScaling` when
    ``log.probe_every`` is set, or a
    :class:`~ada_loss.analysis.recorder.RecordingLossScaling` when
    ``log.record_every`` is (:func:`extend_trainer` then writes
    ``probe.csv`` / ``records.csv``). With ChainerMN on rank 0 only (the
    writer), which observes its own shard."""
    scaling = make_loss_scaling(mode, precision)
    if not is_writer(comm):
        return scaling
    if log_cfg.record_every is not None:
        return RecordingLossScaling(scaling, every=log_cfg.record_every)
    if log_cfg.probe_every is None:
        return scaling
    # the probe recomputes the bounds with the method's own T_uf and bound
    # (their defaults are the method's: ada_loss.scaling.methods)
    options = getattr(scaling, 'options', {})
    return ProbingLossScaling(
        scaling, str(parse_mode(mode)), log_cfg.probe_every,
        **{k: options[k] for k in ('t_uf', 'bound') if k in options})


def make_updater(train_iter, optimizer, scaling, spec, comm=None,
                 summary_path=None, aps=False, device=None):
    """The (distributed) mixed-precision updater of mode ``spec``. What the
    loss scaling prints while wrapping the model (AdaLossScaled's layer
    list) is captured and, on rank 0, written to ``summary_path`` if given
    (``scaling.txt``). ``device`` (a Chainer device, None: the CPU): where
    the model trains and the converter sends each batch (one process only:
    :func:`check_device_config` refuses a device with ChainerMN)."""
    summary = io.StringIO()
    with contextlib.redirect_stdout(summary):
        if comm is None:
            updater = MixedPrecisionUpdater(train_iter, optimizer, scaling,
                                            mode=str(spec), device=device)
        else:
            cls = APSDistributedUpdater if aps else \
                DistributedMixedPrecisionUpdater
            updater = cls(train_iter, optimizer, scaling, comm,
                          mode=str(spec))
            prime_multi_node_optimizer(optimizer, comm)
    if summary_path and is_writer(comm) and summary.getvalue():
        atomic.write_text(summary_path, summary.getvalue())
    return updater


def build_optimizer(model, precision, lr, momentum, weight_decay,
                    comm=None, aps_policy=None, wire=False):
    """MomentumSGD (+ ChainerMN wrapper) with FP32 master weights for the
    low precisions and weight decay as a hook of every parameter's update
    rule: there it sees the gradient after the FP32 unscaling (an
    optimizer-level hook would see the loss-scaled gradient; Chainer's own
    WeightDecay would multiply its rate by the loss scale there, see
    :mod:`ada_loss.training.hooks`).

    With ``comm``: ChainerMN's multi-node optimizer with the loss-scale sync;
    with an ``aps_policy`` (:class:`~ada_loss.communication.CommPolicy`) too,
    the gradients travel in its format with APS (``wire``: as codes of the
    format, else the emulation)."""
    opt = chainer.optimizers.MomentumSGD(lr=lr, momentum=momentum)
    if comm is not None and aps_policy is not None:
        opt = create_aps_multi_node_optimizer(opt, comm, aps_policy, wire)
    elif comm is not None:
        opt = create_multi_node_optimizer(opt, comm)
    setup_optimizer(opt, model, precision)
    if weight_decay > 0:
        add_weight_decay(model, weight_decay)
    return opt
