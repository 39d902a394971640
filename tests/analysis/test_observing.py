"""The wrapper shared by the recorder and the probe
(ada_loss/analysis/observing.py): which backward passes are observed, and
what is delegated to the inner method."""
import contextlib

import pytest

from ada_loss.analysis.gemm_probe import ProbingLossScaling
from ada_loss.analysis.observing import ObservingLossScaling
from ada_loss.analysis.recorder import RecordingLossScaling


class _Inner(object):
    """A loss scaling that logs the calls it gets."""

    recovers = True
    fmt = 'fmt'

    def __init__(self, layerwise=False):
        self.scale = 2.0
        self.calls = []
        if layerwise:
            self.loss_scales = lambda: [('a', 8.0), ('b', 16.0)]

    def backward(self, loss):
        self.calls.append(('backward', loss))
        self.scale *= 2      # read before the pass: the pass's scale

    def update(self, found_nonfinite):
        self.calls.append(('update', found_nonfinite))

    def serialize(self, serializer):
        serializer('inner', 1)


class _Observing(ObservingLossScaling):

    def __init__(self, inner, every):
        super(_Observing, self).__init__(inner, every)
        self.seen = []
        self.skipped = []

    def _observe(self, loss):
        self.seen.append((self.iteration,)
                         + self._backward_with(contextlib.suppress(), loss))

    def _mark_skipped(self):
        self.skipped.append(self.iteration)


class _Serializer(object):

    def __init__(self):
        self.keys = []

    def __call__(self, key, value):
        self.keys.append(key)
        return value


@pytest.mark.parametrize('layerwise', [False, True])
def test_observes_iteration_1_and_every_nth(layerwise):
    inner = _Inner(layerwise)
    s = _Observing(inner, every=3)
    for it in range(1, 8):
        s.backward(it)
        s.update(it in (3, 4))     # non-finite at 3 (observed) and 4 (not)
    assert [c for c in inner.calls if c[0] == 'backward'] == [
        ('backward', it) for it in range(1, 8)]
    assert [c[1] for c in inner.calls if c[0] == 'update'] == [
        it in (3, 4) for it in range(1, 8)]
    alphas = {'a': 8.0, 'b': 16.0} if layerwise else None
    assert s.seen == [(1, 2.0, alphas), (3, 8.0, alphas), (6, 64.0, alphas)]
    assert s.skipped == [3]
    assert (s.recovers, s.scale, s.fmt) == (True, 256.0, 'fmt')
    assert s.loss_scales() == (inner.loss_scales() if layerwise else {})


def test_serialize_delegates_and_keeps_the_pass_count():
    for cls, key in ((_Observing, 'observed_iteration'),
                     (RecordingLossScaling, 'recorder_iteration'),
                     (lambda inner, every: ProbingLossScaling(
                         inner, 'fixed', every), 'probe_iteration')):
        ser = _Serializer()
        cls(_Inner(), every=1).serialize(ser)
        assert ser.keys == ['inner', key]


@pytest.mark.parametrize('every', [0, -1, 1.5])
def test_every_must_be_a_positive_integer(every):
    with pytest.raises(ValueError):
        RecordingLossScaling(_Inner(), every=every)
    with pytest.raises(ValueError):
        ProbingLossScaling(_Inner(), 'fixed', every=every)
