"""The whole training step replayed as a CUDA graph (issue 46 item 1;
``train.cuda_graph: auto|on|off``).

A step of :class:`~ada_loss.training.graph_step.CapturableStep` -- forward,
the mode's backward, finite flag, gated update, loss-scale update, skip
count -- launches hundreds of kernels from Python; on a GPU the host time
of those launches is the step's time (docs/gpu.md, rounds 3-5).
:class:`CudaGraphStep` captures the step once with CuPy's stream capture
and replays it:

* **Warm-up**: the first ``warmup`` steps run eager (on the capture
  stream): the optimizer's states and FP32 masters exist, CuPy's kernels
  are compiled and cached, the loss-scale workspaces and tables are on the
  device (a host-to-device copy is refused inside a capture).
* **Static inputs**: each step's batch (the converter's output) is copied
  into buffers owned by the graph, on the capture stream, after it waits
  for the stream the batch was sent on.
* **Capture** (``Stream(non_blocking=True)``, ``begin_capture``,
  ``end_capture``): the step's Python runs once with the kernels recorded,
  not executed; then the graph is launched. A replay runs no Python: every
  host value the step depends on is a constant of the graph, so a graph is
  kept per key -- the batch's shapes and dtypes (the last partial batch
  gets a graph of its own) and :meth:`CapturableStep.graph_key` (the
  adaptive mode's update-interval phase, its backoff) -- at most
  :attr:`max_graphs` of them (the least recently used is dropped).
* **Memory**: CuPy's pool keeps one arena per stream; a block freed during
  a capture goes back to the capturing stream's arena, so a later
  allocation on that stream -- eager work, or another graph's capture --
  could be handed memory a replay still writes (the step's temporaries,
  freed by Python once the capture returns). Each graph therefore
  allocates from a private ``MemoryPool`` of its own, used by nothing else
  and dropped with the graph (PyTorch shares a pool between graphs only
  when they replay in capture order; ours do not: the adaptive phases
  alternate). Everything the step keeps from one step to the next is
  written in place into buffers that exist outside any graph's pool
  (:class:`~ada_loss.training.graph_step.GatedUpdate`, the dynamic scale's
  arrays, the adaptive β and α_{N+1} slots).
* **Host reads** only between steps: :meth:`CapturableStep.settle` reads
  the step's flag after the launch (a synchronization of the capture
  stream), then does the eager bookkeeping. What the step reported during
  the capture (the Classifier's loss and accuracy, arrays the replay
  rewrites) is reported again after each replay.
* **Fallback**: where the step cannot be captured (a mode in
  :data:`~ada_loss.training.graph_step.CAPTURE_REFUSED`, a scaled recipe
  with amax histories, a capture that raises), the step runs eager and
  one line says why (a capture that raises: an eager step instead, and
  the same key tried once more before it stays eager).

Needs CuPy; imported only when a GPU trains.
"""
import collections
import contextlib

import chainer
from chainer.backends import cuda

from ada_loss.training.graph_step import CAPTURE_REFUSED, CapturableStep

SETTINGS = ('auto', 'on', 'off')


def resolve(setting, device):
    """Whether ``train.cuda_graph`` (``auto``, ``on`` or ``off``) replays
    the step on ``device`` (a Chainer device, None for the CPU): ``auto``
    is on for a CUDA device; ``on`` without one is a ``ValueError``."""
    # YAML 1.1 reads a bare on/off as true/false
    setting = {True: 'on', False: 'off', None: 'auto'}.get(setting, setting)
    if setting not in SETTINGS:
        raise ValueError('cuda_graph must be one of {}, got {!r}'.format(
            ', '.join(SETTINGS), setting))
    on_gpu = device is not None and getattr(device, 'xp', None) is not None \
        and device.xp.__name__ == 'cupy'
    if setting == 'on' and not on_gpu:
        raise ValueError('cuda_graph: on needs a CUDA device (device: '
                         '@cupy:N); the CPU has no graphs to replay: use '
                         'auto or off')
    return setting != 'off' and on_gpu


def refusal(updater):
    """Why the step of ``updater`` cannot be captured, or None."""
    scaling = updater.loss_scaling
    if type(scaling).__module__ != 'ada_loss.scaling.methods':
        # (training does not import scaling: the layering)
        return ('{} is not one of the modes\' own methods (a wrapper that '
                'observes gradients, as the harness\'s probe and recorder '
                'do, reads them on the host)'.format(type(scaling).__name__))
    ada = getattr(scaling, 'ada', None)
    for cls, why in CAPTURE_REFUSED.items():
        if isinstance(ada, cls):
            return why
    model = updater.get_optimizer('main').target
    for path, link in model.namedlinks():
        if getattr(link, 'gemm_scaling', None) is not None:
            return ('the scaled recipe of {} keeps amax histories on the '
                    'host'.format(path or 'the model'))
    return None


def install(updater, setting, device, log=print):
    """Makes ``updater`` replay its step as CUDA graphs if ``setting``
    resolves on (see :func:`resolve`); returns the runner or None."""
    if not resolve(setting, device):
        return None
    runner = CudaGraphStep(updater, log=log)
    updater.step_runner = runner
    return runner


def _structure(in_arrays):
    """(kind, keys, (shape, dtype) per array) of a converted batch."""
    if isinstance(in_arrays, tuple):
        return ('tuple', None, tuple((a.shape, a.dtype.str)
                                     for a in in_arrays))
    if isinstance(in_arrays, dict):
        keys = tuple(sorted(in_arrays))
        return ('dict', keys, tuple((in_arrays[k].shape,
                                     in_arrays[k].dtype.str) for k in keys))
    return ('array', None, ((in_arrays.shape, in_arrays.dtype.str),))


def _flatten(in_arrays):
    if isinstance(in_arrays, tuple):
        return list(in_arrays)
    if isinstance(in_arrays, dict):
        return [in_arrays[k] for k in sorted(in_arrays)]
    return [in_arrays]


def _rebuild(structure, arrays):
    kind, keys, _ = structure
    if kind == 'tuple':
        return tuple(arrays)
    if kind == 'dict':
        return dict(zip(keys, arrays))
    return arrays[0]


def _unread(bp, state=None):
    """The adaptive pass ``bp`` (:class:`ada_loss.adaptive.backward.
    ScaledBackprop`) keeps what it noted on the device unread until asked
    (after a skipped step), then caches it. A replay rewrites those device
    values: without ``state``, returns the pass's unread state as the
    capture left it; with it, puts the pass back in that state (for the
    replay just launched) and returns ``bp``."""
    if bp is None:
        return None
    if state is None:
        return (list(bp._pending), bp._nonfinite, dict(bp._guarded))
    pending, nonfinite, guarded = state
    bp._pending = list(pending)
    bp._nonfinite = nonfinite
    bp._guarded = collections.OrderedDict(guarded)
    bp._loss_finite = None
    return bp


class _Graph(object):
    """One captured step: the graph, its memory pool and static inputs,
    and the host objects its capture left that a replay rewrites in place:
    what it reported, the loss (whose graph the skip's location reads), the
    adaptive pass (its records and non-finite report), the parameters'
    gradients."""

    def __init__(self, graph, pool, inputs, observation, loss, passes,
                 grads):
        self.graph = graph
        self.grads = grads
        self.pool = pool
        self.inputs = inputs
        self.observation = observation
        self.loss = loss
        self.passes = passes


class CudaGraphStep(object):
    """Runs a :class:`MixedPrecisionUpdater`'s step as replayed CUDA graphs
    (installed as ``updater.step_runner``; see the module docstring).

    Args:
        updater: the updater.
        warmup (int): eager steps before the first capture (default 3).
        max_graphs (int): captured steps kept (default 4).
        log: one-line messages (the fallback, each capture).
    """

    def __init__(self, updater, warmup=3, max_graphs=4, log=print):
        cupy = self.cupy = cuda.cupy
        self.step = CapturableStep(updater)
        self.updater = updater
        self.warmup = int(warmup)
        self.max_graphs = int(max_graphs)
        self.log = log
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.graphs = collections.OrderedDict()
        self.eager_steps = 0
        self.captures = 0
        self.replays = 0
        #: {graph key: failed captures}; a key is tried twice (the eager
        #: step after the first failure may create what the capture could
        #: not, e.g. a table copied to the device), then runs eager
        self.failed = {}
        self.reason = refusal(updater)
        if self.reason:
            self.log('cuda_graph: eager steps ({})'.format(self.reason))

    def reload(self):
        self.step.reload()

    # -- one step --------------------------------------------------------
    def update(self):
        updater = self.updater
        batch = updater._iterators['main'].next()
        in_arrays = updater.converter(batch, updater.input_device)
        # the capture stream waits for the stream the batch (and the last
        # step's reports) were computed on
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())
        with self.stream:
            if self.reason or self.eager_steps < self.warmup or \
                    not self.step.gated.states_exist():
                self.eager_steps += 1
                self.step.run(in_arrays)
            else:
                self._replay(in_arrays)
            self.step.settle()
        # the default stream's next work (reports, the next batch) follows
        # the step
        self.cupy.cuda.get_current_stream().wait_event(self.stream.record())

    def _replay(self, in_arrays):
        structure = _structure(in_arrays)
        key = (structure, self.step.graph_key())
        entry = self.graphs.get(key)
        if entry is None:
            if self.failed.get(key, 0) >= 2:
                self.step.run(in_arrays)      # this key runs eager
                return
            entry = self._capture(structure, in_arrays)
            if entry is None:          # fell back: the step ran eager
                self.failed[key] = self.failed.get(key, 0) + 1
                return
            self.graphs[key] = entry
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        for dst, src in zip(entry.inputs, _flatten(in_arrays)):
            self.cupy.copyto(dst, src)
        entry.graph.launch(self.stream)
        self.replays += 1
        self.step.loss = entry.loss
        self.step.gated.grads = entry.grads
        ada = getattr(self.step.scaling, 'ada', None)
        if ada is not None:
            bp, ada._records, unread = entry.passes
            ada._last_pass = _unread(bp, unread)
        if entry.observation and chainer.reporter._get_reporters():
            chainer.reporter.get_current_reporter().observation.update(
                entry.observation)

    def _capture(self, structure, in_arrays):
        """Captures the step on static copies of ``in_arrays``; None (and
        the step run eager) where that fails."""
        cupy = self.cupy
        pool = cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(pool.malloc):
            inputs = [cupy.empty_like(a) for a in _flatten(in_arrays)]
        for dst, src in zip(inputs, _flatten(in_arrays)):
            cupy.copyto(dst, src)
        saved = self._adaptive_state()
        observation = {}
        scope = chainer.reporter.report_scope(observation) \
            if chainer.reporter._get_reporters() else contextlib.nullcontext()
        try:
            with cupy.cuda.using_allocator(pool.malloc), scope:
                self.stream.begin_capture()
                try:
                    self.step.run(_rebuild(structure, inputs))
                finally:
                    graph = self.stream.end_capture()
            if self.step.gated._fresh:
                raise RuntimeError('an optimizer state did not exist yet')
        except Exception as e:     # noqa: any failure falls back to eager
            self._restore_adaptive(saved)
            self.log('cuda_graph: capture failed at step {}, an eager step '
                     'instead ({}: {})'.format(
                         self.updater.iteration + 1, type(e).__name__,
                         str(e).splitlines()[0] if str(e) else ''))
            self.step.run(in_arrays)
            return None
        self.captures += 1
        self.log('cuda_graph: captured step {} (graph {}: {})'.format(
            self.updater.iteration + 1, self.captures,
            ', '.join('x'.join(map(str, s)) for s, _ in structure[2])))
        ada = getattr(self.step.scaling, 'ada', None)
        passes = None if ada is None else (
            ada._last_pass, ada._records, _unread(ada._last_pass))
        return _Graph(graph, pool, inputs, observation, self.step.loss,
                      passes, self.step.gated.grads)

    def _adaptive_state(self):
        ada = getattr(self.step.scaling, 'ada', None)
        if ada is None:
            return None
        return ada.init_scale, dict(ada._betas), ada._records, ada._last_pass

    def _restore_adaptive(self, saved):
        if saved is not None:
            ada = self.step.scaling.ada
            (ada.init_scale, betas, ada._records, ada._last_pass) = saved
            ada._betas = betas
