"""A run's datasets and iterators: a random subset (:func:`subset`), the
ranks' shards under data parallelism (:func:`scatter`), the iterator that
resumes exactly (:func:`make_iterator`) and its seed on this rank
(:func:`iterator_seed`), and the fixed training windows of a
character-level run (:class:`WindowIterator`)."""
import chainer
import numpy

from ada_loss.datasets.char_corpus import batch
from ada_loss.training.faults import fault_point

from ada_loss.training.random_states import SerialIterator
from ada_loss.training.seeded_iterator import SeededIterator


def subset(dataset, size, seed):
    """A random subset of ``size`` examples (the whole set if ``size`` is
    None/0 or not smaller)."""
    if not size or size >= len(dataset):
        return dataset
    order = numpy.random.RandomState(seed).permutation(len(dataset))[:size]
    return chainer.datasets.SubDataset(dataset, 0, size, order=order)


def make_iterator(dataset, batchsize, jobs=0, repeat=True, shuffle=True,
                  seed=None):
    """The iterator of a run; every kind resumes exactly (its random
    streams are in the snapshot). Fault point ``train_batch`` (``repeat``)
    or ``eval_batch``.

    With a ``seed`` (ImageNet, SSD): a
    :class:`~ada_loss.training.seeded_iterator.SeededIterator` computing
    examples in ``jobs`` worker processes (0: in this process), each with
    its own seed, so the numbers do not depend on ``jobs``. Without (the
    CIFAR-style runs): a
    :class:`~ada_loss.training.random_states.SerialIterator` shuffling and
    augmenting from the global streams the run seeded, which the snapshot
    holds (``jobs`` must be 0).
    """
    fault = 'train_batch' if repeat else 'eval_batch'
    if seed is not None:
        return SeededIterator(dataset, batchsize, repeat=repeat,
                              shuffle=shuffle, seed=seed, n_processes=jobs,
                              fault=fault)
    if jobs:
        raise ValueError('worker processes need a seed per example')
    return SerialIterator(dataset, batchsize, repeat=repeat, shuffle=shuffle,
                          fault=fault)


def iterator_seed(seed, comm=None):
    """The seed of a run's :class:`SeededIterator` on this rank."""
    rank = 0 if comm is None else comm.rank
    return int(numpy.random.SeedSequence([seed, rank]).generate_state(1)[0])


def scatter(train, test, batchsize, comm, seed, what='batchsize'):
    """Data parallelism: the per-rank batch size (``batchsize`` is global;
    ``what`` names it in the error) and the datasets scattered over the
    ranks (``test`` only if not None). Unchanged without ``comm``."""
    if comm is None:
        return train, test, batchsize
    import chainermn            # optional: needs mpi4py
    if batchsize % comm.size:
        raise ValueError('{} {} is not divisible by the {} ranks'.format(
            what, batchsize, comm.size))
    batchsize //= comm.size
    train = chainermn.scatter_dataset(train, comm, shuffle=True, seed=seed)
    if test is not None:
        test = chainermn.scatter_dataset(test, comm)
    return train, test, batchsize


class WindowIterator(chainer.dataset.Iterator):
    """The training batches of a character-level run, in the order the
    data contract fixes (:mod:`ada_loss.datasets.char_corpus`): step ``i``
    is the windows at ``offsets[i]`` of ``ids`` (inputs and targets one
    character on), whatever the method. Its state is the step reached
    (in the snapshot: a resumed run reads the next row). One pass over the
    rows is one epoch; past the last row it stops. Fault point
    ``train_batch`` (:mod:`ada_loss.training.faults`), as the other
    training iterators.
    """

    def __init__(self, ids, offsets, block_size):
        offsets = numpy.asarray(offsets)
        if offsets.ndim != 2:
            raise ValueError('offsets of shape (steps, batch) were expected, '
                             'got {}'.format(offsets.shape))
        self.ids = ids
        self.offsets = offsets
        self.block_size = block_size
        self.batch_size = offsets.shape[1]
        self.iteration = 0

    def __next__(self):
        fault_point('train_batch')
        if self.iteration >= len(self.offsets):
            raise StopIteration
        x, y = batch(self.ids, self.offsets[self.iteration],
                     self.block_size)
        self.iteration += 1
        return list(zip(x, y))

    next = __next__

    @property
    def epoch(self):
        return self.iteration // len(self.offsets)

    @property
    def epoch_detail(self):
        return self.iteration / len(self.offsets)

    @property
    def previous_epoch_detail(self):
        return max(self.iteration - 1, 0) / len(self.offsets)

    @property
    def is_new_epoch(self):
        return self.iteration == len(self.offsets)

    def reset(self):
        self.iteration = 0

    def serialize(self, serializer):
        self.iteration = int(serializer('iteration', self.iteration))
