"""Random streams in snapshots and the per-example seeded iterator."""
import random

import numpy
import pytest

import chainer

from ada_loss.training.random_states import (
    RandomStates, SerialIterator, serialize_rng)
from ada_loss.training.seeded_iterator import SeededIterator




class _Holder(object):
    def __init__(self, rng):
        self.rng = rng

    def serialize(self, serializer):
        serialize_rng(serializer, self.rng)


@pytest.mark.parametrize('make, draw', [
    (lambda: numpy.random.RandomState(3), lambda r: r.normal(size=5)),
    (lambda: numpy.random.default_rng(3), lambda r: r.normal(size=5)),
    (lambda: random.Random(3), lambda r: [r.gauss(0, 1) for _ in range(5)]),
])
def test_streams_continue_exactly_after_a_roundtrip(make, draw):
    rng = make()
    draw(rng)
    saver = chainer.serializers.DictionarySerializer()
    _Holder(rng).serialize(saver)
    want = numpy.asarray(draw(rng))
    other = make()
    draw(other)
    draw(other)                      # somewhere else in the stream
    _Holder(other).serialize(chainer.serializers.NpzDeserializer(
        saver.target))
    assert numpy.array_equal(numpy.asarray(draw(other)), want)


def test_wrong_stream_type_is_an_error():
    saver = chainer.serializers.DictionarySerializer()
    _Holder(random.Random(0)).serialize(saver)
    with pytest.raises(ValueError, match='Random stream'):
        _Holder(numpy.random.RandomState(0)).serialize(
            chainer.serializers.NpzDeserializer(saver.target))


def test_global_streams_and_shuffle_order_resume():
    data = numpy.arange(10)
    numpy.random.seed(1)
    random.seed(1)
    it = SerialIterator(data, 4)
    for _ in range(2):
        next(it)
    saver = chainer.serializers.DictionarySerializer()
    it.serialize(saver['it'])
    RandomStates().serialize(saver['streams'])
    want = [list(next(it)) for _ in range(6)], random.random()
    numpy.random.seed(2)
    random.seed(2)
    other = SerialIterator(data, 4)
    loader = chainer.serializers.NpzDeserializer(saver.target)
    other.serialize(loader['it'])
    RandomStates().serialize(loader['streams'])
    assert ([list(next(other)) for _ in range(6)], random.random()) == want


class _Noisy(chainer.dataset.DatasetMixin):
    """Example i: (i, a draw from NumPy's and Python's global streams)."""

    def __len__(self):
        return 12

    def get_example(self, i):
        return i, float(numpy.random.random_sample()) + random.random()


def _batches(it, n):
    return [next(it) for _ in range(n)]


def test_seeded_iterator_is_the_same_in_workers_and_in_process():
    serial = SeededIterator(_Noisy(), 5, seed=7, n_processes=0)
    pooled = SeededIterator(_Noisy(), 5, seed=7, n_processes=2)
    try:
        state = random.getstate(), numpy.random.get_state()[1].copy()
        want = _batches(serial, 6)        # crosses epoch boundaries
        assert random.getstate() == state[0]      # global streams untouched
        assert numpy.array_equal(numpy.random.get_state()[1], state[1])
        assert _batches(pooled, 6) == want
        assert len({x for b in want for _, x in b}) == 30   # all different
    finally:
        pooled.finalize()


def test_seeded_iterator_resumes_exactly():
    it = SeededIterator(_Noisy(), 5, seed=7)
    _batches(it, 3)
    saver = chainer.serializers.DictionarySerializer()
    it.serialize(saver)
    want = _batches(it, 5)
    other = SeededIterator(_Noisy(), 5, seed=99)
    other.serialize(chainer.serializers.NpzDeserializer(saver.target))
    assert _batches(other, 5) == want
