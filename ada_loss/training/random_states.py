"""Random number streams in trainer snapshots, so that a resumed run draws
exactly what the uninterrupted run would have drawn.

Chainer's snapshot holds the model, optimizer and iterator positions, but no
random state: ``SerialIterator`` saves its current order and not the state
of its ``ShuffleOrderSampler`` (the next epoch is shuffled differently after
a resume), and augmentations drawing from Python's ``random`` or NumPy's
global stream (``chainercv.transforms``, CIFAR crops and flips, SSD's
photometric distortion and expansion) restart from wherever the new
process happens to be.

* :func:`serialize_rng` saves / restores one stream: a
  ``numpy.random.RandomState``, a ``numpy.random.Generator`` or a
  ``random.Random`` (Python's module-level stream is ``random._inst``);
* :class:`RandomStates` is a trainer extension that only takes part in
  serialization: Python's and NumPy's global streams (what ``random.seed``
  and ``numpy.random.seed`` seed at the start of a run) plus any named
  streams given;
* :class:`SerialIterator` is Chainer's, with its order sampler's stream in
  the snapshot.
"""
import json
import random
import warnings

import numpy

import chainer
from chainer.training import extension

from ada_loss.training.faults import fault_point


def _saving(serializer):
    return isinstance(serializer, chainer.serializer.Serializer)


def _text_array(obj):
    return numpy.frombuffer(json.dumps(obj).encode('utf-8'), numpy.uint8)


def _from_text_array(array):
    return json.loads(numpy.asarray(array, numpy.uint8).tobytes().decode())


def serialize_rng(serializer, rng):
    """Saves (Serializer) or restores (Deserializer) the full state of
    ``rng`` under ``serializer``'s keys ``kind`` and ``state``."""
    if isinstance(rng, numpy.random.RandomState):
        kind = 'RandomState'
        if _saving(serializer):
            name, keys, pos, has_gauss, gauss = rng.get_state()
            state = {'name': name, 'keys': keys.tolist(), 'pos': int(pos),
                     'has_gauss': int(has_gauss), 'gauss': float(gauss)}
        restore = (lambda s: rng.set_state((
            s['name'], numpy.asarray(s['keys'], numpy.uint32), s['pos'],
            s['has_gauss'], s['gauss'])))
    elif isinstance(rng, numpy.random.Generator):
        kind = 'Generator'
        if _saving(serializer):
            state = rng.bit_generator.state
        restore = (lambda s: setattr(rng.bit_generator, 'state', s))
    elif isinstance(rng, random.Random):
        kind = 'Random'
        if _saving(serializer):
            version, internal, gauss = rng.getstate()
            state = {'version': version, 'internal': list(internal),
                     'gauss': gauss}
        restore = (lambda s: rng.setstate((
            s['version'], tuple(s['internal']), s['gauss'])))
    else:
        raise TypeError('cannot serialize a random stream of type {}'.format(
            type(rng).__name__))
    if _saving(serializer):
        serializer('kind', _text_array(kind))
        serializer('state', _text_array(state))
        return
    try:
        saved = _from_text_array(serializer('kind', None))
    except KeyError:        # a snapshot written before streams were saved
        warnings.warn('the snapshot holds no state of this random stream '
                      '(written by an older version): it continues from '
                      'where this process is, not where the run was')
        return
    if saved != kind:
        raise ValueError('the snapshot holds a {} stream, this run uses a '
                         '{}'.format(saved, kind))
    restore(_from_text_array(serializer('state', None)))


def global_streams():
    """Python's and NumPy's module-level streams, by name."""
    return {'python_random': random._inst,
            'numpy_global': numpy.random.random.__self__}


class RandomStates(extension.Extension):
    """Puts random streams into trainer snapshots (and back on autoload).

    Args:
        streams (dict): name -> stream, in addition to Python's and NumPy's
            global streams (:func:`global_streams`).

    It does nothing during training. Snapshots are taken after the
    iteration's updates, evaluation and logs, so a resumed run continues
    the streams from exactly where the uninterrupted run was.
    """

    trigger = 10 ** 12, 'iteration'
    priority = extension.PRIORITY_READER

    def __init__(self, streams=None):
        self.streams = dict(global_streams())
        self.streams.update(streams or {})

    def __call__(self, trainer):
        pass

    def serialize(self, serializer):
        for name in sorted(self.streams):
            serialize_rng(serializer[name], self.streams[name])


class SerialIterator(chainer.iterators.SerialIterator):
    """Chainer's ``SerialIterator`` whose snapshot also holds the stream
    its order sampler shuffles with (``ShuffleOrderSampler._random``; by
    default NumPy's global stream, so runs keep their published order).

    ``fault`` names the :func:`~ada_loss.training.faults.fault_point`
    reached after every batch drawn (``train_batch``, ``eval_batch``).
    """

    def __init__(self, dataset, batch_size, repeat=True, shuffle=None,
                 order_sampler=None, fault=None):
        super(SerialIterator, self).__init__(
            dataset, batch_size, repeat=repeat, shuffle=shuffle,
            order_sampler=order_sampler)
        self.fault = fault

    def __next__(self):
        batch = super(SerialIterator, self).__next__()
        if self.fault:
            fault_point(self.fault)
        return batch

    next = __next__

    def serialize(self, serializer):
        super(SerialIterator, self).serialize(serializer)
        rng = getattr(self.order_sampler, '_random', None)
        if rng is not None:
            serialize_rng(serializer['order_sampler'], rng)
