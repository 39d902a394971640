"""A loss-scaling method that observes some of its backward passes.

:class:`ObservingLossScaling` is what :class:`ada_loss.analysis.recorder.
RecordingLossScaling` and :class:`ada_loss.analysis.gemm_probe.
ProbingLossScaling` share: it wraps any loss-scaling method, delegates
everything to it, counts backward passes (1-based) and observes iteration 1
and every ``every``-th one; the other passes run the inner method alone, so
observing costs nothing there. A subclass says only what it does on an
observed pass (:meth:`~ObservingLossScaling._observe`) and when the update of
an observed step is skipped for non-finite gradients
(:meth:`~ObservingLossScaling._mark_skipped`).

On Chainer's Trainer an :class:`ObservationsWriter` (a kill- and
resume-safe :class:`~ada_loss.training.extensions.CSVRecorder`) writes the
observations to a CSV file after every step.
"""
import chainer

from ada_loss.training.extensions import CSVRecorder


class ObservingLossScaling(object):
    """Delegates to ``inner`` and observes some backward passes (see module).

    Usable wherever ``inner`` is, e.g. in :class:`ada_loss.training.
    MixedPrecisionUpdater`.

    Args:
        inner: any :class:`ada_loss.scaling.LossScaling`.
        every (int): observe iteration 1 and every ``every``-th one.
    """

    #: the snapshot key of the pass count (a subclass names its own)
    count_key = 'observed_iteration'

    def __init__(self, inner, every):
        if int(every) != every or every < 1:
            raise ValueError('every must be a positive integer, got {!r}'
                             .format(every))
        self.inner = inner
        self.every = int(every)
        self.iteration = 0
        self._observed = False

    recovers = property(lambda self: self.inner.recovers)
    scale = property(lambda self: self.inner.scale)
    fmt = property(lambda self: self.inner.fmt)   # the updater's overflow test
    #: the layer-wise method's model wrapper (None for a global scale)
    ada = property(lambda self: getattr(self.inner, 'ada', None))

    def bind(self, model):
        self.inner.bind(model)

    def _observes_now(self):
        return self.iteration == 1 or self.iteration % self.every == 0

    def backward(self, loss):
        self.iteration += 1
        self._observed = self._observes_now()
        if not self._observed:
            return self.inner.backward(loss)
        self._observe(loss)

    def _observe(self, loss):
        """Runs the inner backward pass of an observed iteration (with
        :meth:`_backward_with`)."""
        raise NotImplementedError

    def _backward_with(self, hook, loss):
        """Runs the inner backward pass with the FunctionHook ``hook``
        installed.

        Returns:
            (scale, alphas): the loss scale the pass started at (read before
            it), and the per-layer scales {layer: α} after it for a
            layer-wise method (one with ``loss_scales``), else None.
        """
        scale = self.inner.scale
        with hook:
            self.inner.backward(loss)
        alphas = (dict(self.inner.loss_scales())
                  if hasattr(self.inner, 'loss_scales') else None)
        return scale, alphas

    def _mark_skipped(self):
        """Called when the update of an observed iteration is skipped."""

    def writer(self):
        """The :class:`ObservationsWriter` of this observer (registered
        on the Trainer by :func:`ada_loss.experiment.trainer_extensions.
        extend_trainer`)."""
        raise NotImplementedError

    def update(self, found_nonfinite):
        if self._observed and found_nonfinite:
            self._mark_skipped()
        self.inner.update(found_nonfinite)

    def loss_scales(self):
        return self.inner.loss_scales() if hasattr(
            self.inner, 'loss_scales') else {}

    def last_nonfinite(self):
        return self.inner.last_nonfinite()

    def serialize(self, serializer):
        # the inner method's state, and the pass count: a resumed run
        # observes the same passes (absent from a snapshot written without
        # this observer: the ObservationsWriter sets it after the first
        # resumed step)
        self.inner.serialize(serializer)
        try:
            self.iteration = int(serializer(self.count_key, self.iteration))
        except KeyError:
            if isinstance(serializer, chainer.serializer.Serializer):
                raise


class ObservationsWriter(CSVRecorder):
    """Appends the observations of an :class:`ObservingLossScaling` to a
    CSV file after every step (a kill- and resume-safe
    :class:`~ada_loss.training.extensions.CSVRecorder`). The rows of a call
    belong to the step just done: they carry the trainer's iteration, and the
    scaling's pass count is kept equal to it. A subclass gives ``header``,
    ``filename`` and :meth:`take`.

    ``last_rows`` holds the observations (dicts, all their keys) of the
    latest call, for a later extension of the same iteration (the
    TensorBoard writer, :mod:`ada_loss.training.tensorboard`)."""

    filename = None

    def __init__(self, scaling, filename=None):
        super(ObservationsWriter, self).__init__(filename or self.filename)
        self.scaling = scaling
        self.last_rows = []

    def take(self):
        """The observations made since the last call (dicts), removed
        from the scaling."""
        raise NotImplementedError

    @staticmethod
    def format(value):
        return value

    def rows(self, trainer):
        iteration = trainer.updater.iteration
        self.scaling.iteration = iteration
        self.last_rows = [dict(r, iteration=iteration) for r in self.take()]
        return [[iteration if k == 'iteration' else self.format(r.get(k))
                 for k in self.header] for r in self.last_rows]
