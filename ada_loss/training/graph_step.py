"""The training step of :class:`MixedPrecisionUpdater` with no host read
inside it: the form a CUDA graph can capture and replay
(:mod:`ada_loss.training.cuda_graph`; issue 46 item 1).

The eager step reads the finite check on the host and branches: update or
skip. Here the step is split in two:

* :meth:`CapturableStep.run` -- forward, the mode's backward, the finite
  check as a 0-d bool array (``finite``), the optimizer's update applied
  and then *selected* by it (``where(finite, updated, before)`` into the
  same buffers: a skipped step leaves the master weights, momentum and
  every optimizer state bit for bit as the eager skip does), the dynamic
  loss scale advanced on arrays (:mod:`ada_loss.loss_scale.dynamic_arrays`)
  and the skipped-step count accumulated in an array. Nothing here reads
  a device value on the host; host counters it would advance (the
  optimizer's and update rules' ``t``, the adaptive pass count) are put
  back as they were, so that a replay, which runs no Python, and an eager
  run leave the host in the same state.
* :meth:`CapturableStep.settle` -- between steps: one read of the step's
  status (the flag), then the host bookkeeping the eager step does --
  counters, the skip's location (:mod:`ada_loss.training.skips`, only after
  a step that skipped), the host mirror of the loss scale, the guard's
  backoff, the error of a mode that cannot recover, the epoch, the report
  -- through :meth:`MixedPrecisionUpdater.finish_step` itself.

Every buffer the step writes for the next step (parameters, FP32 master
copies, optimizer states, the dynamic scale, the adaptive mode's cached β
and α_{N+1} on a device) stays the same array object from step to step
(written in place), the condition for a replayed graph to read what the
previous replay wrote.

Modes: ``fp32``/``none``, ``fixed`` and ``dynamic`` (every style) are
decided wholly on arrays. ``adaptive`` runs its own backward (no host read
on a device since round 4); its host state (pass count, backoff after a
skipped step, clean-step window) is advanced in :meth:`settle` from the
flag, so a graph of it is keyed by that state
(:meth:`CapturableStep.graph_key`). ``amax`` keeps its amax histories as
host floats (a read per GEMM): it runs here, equal to eager, but cannot be
captured (:data:`CAPTURE_REFUSED`).
"""
import numpy
from chainer import backend
from chainer.backends import cuda

from ada_loss.adaptive import AmaxLossScaled
from ada_loss.loss_scale.dynamic import (
    ChainerLossScale, DynamicLossScale, TFLossScale)
from ada_loss.loss_scale.dynamic_arrays import ArrayDynamicScale
from ada_loss.training.updater import (
    MixedPrecisionUpdater, _format_params, _finite_flag, call_loss)

#: why a layer-wise method's step cannot be captured (the capture wrapper
#: runs it eager), by the class of its ⟨α, δ⟩ backward
CAPTURE_REFUSED = {
    AmaxLossScaled: 'amax keeps its amax histories as host floats (one '
                    'read per GEMM per step)',
}

_DYNAMIC_STATES = (DynamicLossScale, ChainerLossScale, TFLossScale)


def _scaled_backward():
    # as ada_loss.scaling.methods._scaled_backward: the overflows of a
    # scaled backward are expected (the step tests them)
    return numpy.errstate(over='ignore', invalid='ignore')


def finite_flag(model, fmt=None):
    """:func:`ada_loss.training.updater.all_grads_finite` as a 0-d bool
    array of the gradients' array module, with no host read (True when no
    parameter has a gradient)."""
    in_format = _format_params(model) if fmt is not None and \
        fmt.saturates else None
    params = [p for p in model.params() if p.grad is not None]
    if not params:
        return numpy.array(True)
    xp = backend.get_array_module(params[0].grad)
    with numpy.errstate(invalid='ignore'):
        return xp.stack([_finite_flag(xp, p, fmt, in_format)
                         for p in params]).all()


class _Slot(object):
    """One array the update writes, reached through ``get``/``set``."""

    __slots__ = ('get', 'set', 'buffer', 'before')

    def __init__(self, get, set_):
        self.get, self.set = get, set_
        self.buffer = get()
        self.before = None


def _attr_slot(obj, name):
    return _Slot(lambda: getattr(obj, name),
                 lambda a: setattr(obj, name, a))


def _item_slot(d, key):
    return _Slot(lambda: d[key], lambda a: d.__setitem__(key, a))


class GatedUpdate(object):
    """``optimizer.update()`` applied, then kept only where ``finite``.

    The arrays it may write -- each parameter, its FP32 master copy
    (``use_fp32_update``) and its update rule's state -- are snapshotted,
    the update runs (with non-finite gradients it computes Inf/NaN, which
    are discarded), and ``where(finite, updated, snapshot)`` is written back
    into the buffers the step started with (Chainer rebinds a float16
    parameter to a new array at each FP32 update: it is bound back).

    Update rules whose state does not exist yet (their first update) are
    remembered by :meth:`run`; :meth:`undo_lazy_init` drops the state such
    an update created when the step turned out skipped (as if never run).

    Gradients that an update rule would divide in place (a parameter that
    is not converted to FP32 first) are given a copy, so that the skip's
    location, looked up after the step, reads the gradients as the backward
    left them; :meth:`settle_grads` hands each parameter the one the eager
    step would leave it.
    """

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._fresh = []
        self.grads = []

    def _slots(self):
        slots = []
        for _, param in sorted(self.optimizer.target.namedparams()):
            rule = param.update_rule
            if rule is None or not rule.enabled or param.array is None:
                continue
            slots.append(_attr_slot(param, 'array'))
            master = getattr(rule, '_fp32_param', None)
            if master is not None and master.array is not None:
                slots.append(_attr_slot(master, 'array'))
            for key in sorted(rule.state or {}):
                if isinstance(rule.state[key], (numpy.ndarray,)) or hasattr(
                        rule.state[key], 'device'):
                    slots.append(_item_slot(rule.state, key))
        return slots

    @staticmethod
    def _to_param_devices(params):
        """State arrays loaded from a snapshot are NumPy arrays until the
        update rule's first update sends them to the parameter's device
        (``UpdateRule._init_states``); sent here first, so that the gated
        write-back covers them too (an eager step: never inside a capture,
        see :meth:`states_exist`)."""
        for p in params:
            state = p.update_rule.state
            xp = backend.get_array_module(p.array)
            for key, value in (state or {}).items():
                if hasattr(value, 'shape') and \
                        backend.get_array_module(value) is not xp:
                    state[key] = p.device.send(value)

    def states_exist(self):
        """Whether every update rule has its state (and FP32 master): the
        condition for a capture, whose update may create nothing."""
        for p in self.optimizer.target.params():
            rule = p.update_rule
            if rule is None or not rule.enabled or p.array is None:
                continue
            if rule.state is None or (
                    rule._use_fp32_update and p.dtype == numpy.float16
                    and rule._fp32_param is None):
                return False
            xp = backend.get_array_module(p.array)
            if any(hasattr(v, 'shape') and
                   backend.get_array_module(v) is not xp
                   for v in rule.state.values()):
                return False
        return True

    def run(self, finite):
        optimizer = self.optimizer
        params = [p for p in optimizer.target.params()
                  if p.update_rule is not None and p.array is not None]
        self._fresh = []
        originals = []
        for p in params:
            rule = p.update_rule
            converted = rule._use_fp32_update and p.dtype == numpy.float16
            if rule.state is None or (converted and
                                      rule._fp32_param is None):
                self._fresh.append(rule)
            originals.append(p.grad)
            if p.grad is not None and not converted:
                p.grad = p.grad.copy()
        self._to_param_devices(params)
        slots = self._slots()
        for s in slots:
            s.before = s.buffer.copy()
        xp = backend.get_array_module(finite)
        keep = ~finite
        try:
            with numpy.errstate(over='ignore', invalid='ignore'):
                optimizer.update()
            for s in slots:
                new = s.get()
                if new is not s.buffer:
                    xp.copyto(s.buffer, new)
                    s.set(s.buffer)
                xp.copyto(s.buffer, s.before, where=keep)
        finally:
            for s in slots:     # (an update that raised: nothing rebound)
                if s.get() is not s.buffer:
                    s.set(s.buffer)
                s.before = None
            #: (param, its gradient as the backward left it, as the update
            #: left it) for :meth:`settle_grads`
            self.grads = [(p, g, p.grad) for p, g in zip(params, originals)]
            for p, g in zip(params, originals):
                p.grad = g

    def settle_grads(self, finite):
        """Between steps: each parameter's gradient as the eager step
        leaves it -- as the update left it (unscaled in place, decayed) after
        an applied step, as the backward left it after a skipped one (what
        the skip's location reads)."""
        for p, original, updated in self.grads:
            p.grad = updated if finite else original

    def undo_lazy_init(self):
        """After a skipped step: the state that the step's update created
        for a parameter's first update is dropped (the eager skip never
        created it)."""
        for rule in self._fresh:
            rule._state = None
            if hasattr(rule, '_fp32_param'):
                rule._fp32_param = None
        self._fresh = []


class CapturableStep(object):
    """The step of a :class:`MixedPrecisionUpdater` in two parts,
    :meth:`run` (no host read) and :meth:`settle` (between steps); equal bit
    for bit to the updater's eager step (``tests/training/
    test_graph_step.py``). Installed with ``updater.step_runner = step``.

    Args:
        updater (MixedPrecisionUpdater): the updater (not a distributed
            one: its finite check is an all-reduce of its own).
    """

    def __init__(self, updater):
        if type(updater).grads_finite is not \
                MixedPrecisionUpdater.grads_finite:
            raise ValueError('CapturableStep: {} decides the finite check '
                             'itself (distributed); expected a '
                             'MixedPrecisionUpdater'.format(
                                 type(updater).__name__))
        optimizer = updater.get_optimizer('main')
        hookable = getattr(optimizer, '_hookable', None)
        hooks = [] if hookable is None else list(
            hookable._pre_update_hooks) + list(hookable._post_update_hooks)
        if hooks:
            raise ValueError(
                'CapturableStep: optimizer-level hook(s) {} read the loss '
                'scale on the host; register them per parameter instead '
                '(ada_loss.training.hooks.add_weight_decay)'.format(
                    ', '.join(hooks)))
        self.updater = updater
        self.scaling = updater.loss_scaling
        self.gated = GatedUpdate(updater.get_optimizer('main'))
        self.xp = None
        self.dynamic = None
        self.flag = None
        self.skipped = None
        self.loss = None
        self._adaptive_slots = {}

    # -- arrays ----------------------------------------------------------
    def _arrays(self, xp):
        """The step's own state as arrays of ``xp``, made once."""
        if self.xp is xp:
            return
        self.xp = xp
        self.flag = xp.ones((), dtype=bool)
        self.skipped = xp.zeros((), dtype=numpy.int64)
        self.skipped[...] = self.updater.skipped_steps
        if isinstance(getattr(self.scaling, 'state', None),
                      _DYNAMIC_STATES):        # the dynamic mode
            self.dynamic = ArrayDynamicScale(self.scaling.state, xp)

    def reload(self):
        """Host state -> arrays, after the updater was deserialized (a
        resume): the loss scale and the skip count."""
        if self.xp is not None:
            self.skipped[...] = self.updater.skipped_steps
            if self.dynamic is not None:
                self.dynamic.load()

    def graph_key(self):
        """The host values a captured step depends on, beside the batch's
        shapes: the optimizer's hyperparameters (a learning-rate schedule
        changes ``lr`` between steps; a kernel takes it as a constant) and
        the adaptive mode's update-interval phase and backoff. Two steps
        with the same key run the same kernels on the same buffers."""
        hyper = self.updater.get_optimizer('main').hyperparam.get_dict()
        key = (tuple(sorted(hyper.items())),)
        ada = getattr(self.scaling, 'ada', None)
        if ada is None:
            return key
        phase = ada.iteration % ada.update_interval
        return key + (phase, tuple(sorted((str(k), v)
                                          for k, v in ada._backoff.items())))

    # -- the step --------------------------------------------------------
    def update(self):
        """One step, as ``MixedPrecisionUpdater.update_core``."""
        updater = self.updater
        batch = updater._iterators['main'].next()
        self.run(updater.converter(batch, updater.input_device))
        self.settle()

    def _host_counters(self):
        optimizer = self.updater.get_optimizer('main')
        rules = [p.update_rule for p in optimizer.target.params()
                 if p.update_rule is not None]
        ada = getattr(self.scaling, 'ada', None)
        return (optimizer.t, [r.t for r in rules],
                None if ada is None else ada.iteration)

    def _restore_counters(self, counters):
        optimizer = self.updater.get_optimizer('main')
        t, rule_ts, iteration = counters
        optimizer.t = t
        rules = [p.update_rule for p in optimizer.target.params()
                 if p.update_rule is not None]
        for r, rt in zip(rules, rule_ts):
            r.t = rt
        if iteration is not None:
            self.scaling.ada.iteration = iteration

    def run(self, in_arrays):
        """Forward, backward, finite flag, gated update, loss-scale update,
        skip count: device work only (capturable)."""
        updater = self.updater
        optimizer = updater.get_optimizer('main')
        model = optimizer.target
        loss_func = updater.loss_func or model
        counters = self._host_counters()
        try:
            model.cleargrads()
            loss = call_loss(loss_func, in_arrays)
            xp = backend.get_array_module(loss.array)
            self._arrays(xp)
            if self.dynamic is not None:
                # the scale as the eager step's Python float enters: rounded
                # once to the loss's dtype, and to each gradient's for the
                # update rule's division
                with _scaled_backward():
                    loss.backward(loss_scale=self.dynamic.scale.astype(
                        loss.dtype))
                self._divide_by(model, self.dynamic.scale)
            else:
                self.scaling.backward(loss)
            self._keep_adaptive_in_place()
            finite = finite_flag(model, self.scaling.fmt)
            self.gated.run(finite)
        finally:
            self._restore_counters(counters)
        if self.dynamic is not None:
            self.dynamic.update(finite)
        self.skipped += ~finite
        self.flag[...] = finite
        self.loss = loss

    def _keep_adaptive_in_place(self):
        """The adaptive mode's device state that outlives the step -- the
        cached β of each GEMM (read again until the next update interval)
        and α_{N+1} (``init_scale='auto'``/``'amax'``) -- written into the
        arrays that held it before, so that a graph captured on one phase
        of the update interval reads what a graph of the other wrote. On
        the CPU they are host floats: nothing to do."""
        ada = getattr(self.scaling, 'ada', None)
        if ada is None or self.xp is numpy:
            return
        slots = self._adaptive_slots
        for key, value in list(ada._betas.items()):
            ada._betas[key] = self._in_slot(slots, ('beta', key), value)
        ada.init_scale = self._in_slot(slots, 'alpha', ada.init_scale)

    def _in_slot(self, slots, key, value):
        if not isinstance(value, self.xp.ndarray):
            return value
        slot = slots.get(key)
        if slot is None or slot.shape != value.shape or \
                slot.dtype != value.dtype:
            # outside every memory pool (raw cudaMalloc, never freed while
            # the step lives): no graph's pool may hand it out again
            with cuda.cupy.cuda.using_allocator(None):
                slot = slots[key] = cuda.cupy.empty_like(value)
            slot[...] = value
        elif slot is not value:
            slot[...] = value
        return slot

    @staticmethod
    def _divide_by(model, scale):
        casts = {}
        for p in model.params():
            if p.grad is None or p.update_rule is None:
                continue
            rule = p.update_rule
            dtype = numpy.dtype(numpy.float32) if (
                rule._use_fp32_update and p.dtype == numpy.float16) \
                else p.grad.dtype
            if dtype not in casts:
                casts[dtype] = scale.astype(dtype)
            p._loss_scale = casts[dtype]

    def settle(self):
        """Between steps: reads the flag (the one host read), advances the
        host counters the step put back, and finishes the step as the eager
        updater does (skip record, loss-scale host state, backoff, epoch,
        report)."""
        updater = self.updater
        optimizer = updater.get_optimizer('main')
        finite = bool(self.flag)
        self.gated.settle_grads(finite)
        ada = getattr(self.scaling, 'ada', None)
        if ada is not None:
            ada.iteration += 1
        if finite:
            optimizer.t += 1
            for p in optimizer.target.params():
                if p.update_rule is not None and p.update_rule.enabled:
                    p.update_rule.t += 1
            where = None
        else:
            self.gated.undo_lazy_init()
            where = updater.locate_nonfinite(optimizer.target, self.loss)
        self.loss = None
        updater.finish_step(finite, lambda: None, where=where)
