"""An iterator whose augmentations do not depend on how they are computed.

Chainer's ``MultiprocessIterator`` runs the dataset's transform in worker
processes, each drawing from its own copy of Python's and NumPy's random
streams in an order that depends on scheduling: a run cannot be repeated,
let alone resumed, exactly. :class:`SeededIterator` draws one seed per
example from a private stream in the main process (in the snapshot, like
the shuffle order) and computes each example with Python's ``random`` and
NumPy's global stream seeded by it -- in ``n_processes`` worker processes
or, with 0, in this process (whose own streams are put back afterwards).
The augmentation of every example is then a function of the run's seed and
the example's place in the run: the same for any ``n_processes`` and after
a resume. Transforms need no change (ChainerCV's draw from those streams).
"""
import multiprocessing
import random

import numpy
from chainer.iterators import ShuffleOrderSampler
from chainer.iterators import _statemachine

from ada_loss.training.faults import fault_point
from ada_loss.training.random_states import SerialIterator, serialize_rng

_dataset = None     # the dataset of a worker process


def _init_worker(dataset):
    global _dataset
    _dataset = dataset


def _get(dataset, index, seed):
    random.seed(seed)
    numpy.random.seed(seed)
    return dataset[index]


def _get_in_worker(args):
    return _get(_dataset, *args)


class SeededIterator(SerialIterator):
    """``SerialIterator`` with one random seed per example (see the module
    docstring).

    Args:
        dataset, batch_size, repeat, shuffle: as ``SerialIterator``.
        seed (int): seed of the per-example seeds (and of the shuffle order,
            which is drawn from a private stream too).
        n_processes (int): worker processes computing the examples of a
            batch (0: in this process).
        fault: see :class:`~ada_loss.training.random_states.SerialIterator`.
    """

    def __init__(self, dataset, batch_size, repeat=True, shuffle=True,
                 seed=0, n_processes=0, fault=None):
        self._seeds = numpy.random.RandomState(seed)
        sampler = ShuffleOrderSampler(numpy.random.RandomState(
            self._seeds.randint(2 ** 31))) if shuffle else None
        self.n_processes = n_processes
        self._pool = None
        super(SeededIterator, self).__init__(
            dataset, batch_size, repeat=repeat,
            shuffle=None if shuffle else False, order_sampler=sampler,
            fault=fault)

    def __next__(self):
        self._previous_epoch_detail = self.epoch_detail
        self._state, indices = _statemachine.iterator_statemachine(
            self._state, self.batch_size, self.repeat, self.order_sampler,
            len(self.dataset))
        if indices is None:
            raise StopIteration
        seeds = [int(s) for s in self._seeds.randint(
            0, 2 ** 32, size=len(indices), dtype=numpy.uint64)]
        if self.n_processes:
            batch = self._worker_pool().map(
                _get_in_worker, list(zip(indices, seeds)), chunksize=1)
        else:
            kept = random.getstate(), numpy.random.get_state()
            try:
                batch = [_get(self.dataset, i, s)
                         for i, s in zip(indices, seeds)]
            finally:
                random.setstate(kept[0])
                numpy.random.set_state(kept[1])
        if self.fault:
            fault_point(self.fault)
        return batch

    next = __next__

    def _worker_pool(self):
        if self._pool is None:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context(
                'fork' if 'fork' in methods else None)
            self._pool = ctx.Pool(self.n_processes, _init_worker,
                                  (self.dataset,))
        return self._pool

    def finalize(self):
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __del__(self):
        try:
            self.finalize()
        except Exception:       # interpreter shutdown
            pass

    def serialize(self, serializer):
        super(SeededIterator, self).serialize(serializer)
        serialize_rng(serializer['example_seeds'], self._seeds)
