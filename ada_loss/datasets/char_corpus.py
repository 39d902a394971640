"""A character-level corpus and the tokens every run sees (NumPy only).

The data contract of the GPT experiments (issue 48; docs/transformer.md,
"Data"), written as plain functions so that an independent peer
(``scripts/gpt_torch_peer.py``, PyTorch) reimplements it from the docs and
both sides train on the same characters in the same order:

* **vocabulary**: the sorted set of the characters of the whole text (by
  code point); a character's id is its index there. Ids are ``uint8`` when
  the vocabulary has at most 256 characters, else ``uint16``.
* **splits** (``N`` characters): ``train`` is ``[0, 9N // 10)`` -- the first
  90 %, nanoGPT's ``shakespeare_char`` split (``int(n * 0.9)``) -- and the
  last 10 % is halved: ``select`` is ``[9N // 10, 19N // 20)``, for choosing
  anything tuned (a fixed scale, a learning rate), and ``val`` is
  ``[19N // 20, N)``, the one whose loss is reported. Nothing is chosen on
  the data it is scored on.
* **training batches**: a run with ``seed`` and ``max_iters`` steps of
  ``batch_size`` windows of ``block_size`` characters draws all its window
  starts at once, ``numpy.random.RandomState(seed).randint(0, len(train) -
  block_size, size=(max_iters, batch_size))``; step ``i`` reads row ``i``:
  inputs ``train[o:o + block_size]``, targets ``train[o + 1:o + 1 +
  block_size]`` for each start ``o`` (nanoGPT's ``get_batch``, its
  ``torch.randint`` replaced by NumPy's seeded Mersenne Twister, which a
  peer in any framework can reproduce). The same seed gives every method
  the same windows in the same order.
* **evaluation batches**: fixed, independent of the run's seed and method:
  for each split separately a fresh ``RandomState(EVAL_SEED).randint(0,
  len(split) - block_size, size=(eval_iters, batch_size))``. A split's loss
  is the mean cross-entropy (nats per character) over its ``eval_iters *
  batch_size * block_size`` predicted characters.
* **fingerprint**: the SHA-256 of the text file's bytes, recorded with every
  run so that two runs can check that they saw the same corpus.
"""
import hashlib

import numpy

#: Seed of the evaluation windows (nanoGPT's default seed; any fixed value
#: would do: it only has to be the same for every method and run).
EVAL_SEED = 1337

#: Evaluation batches per split and evaluation point (nanoGPT's CPU
#: configuration uses ``--eval_iters=20``).
EVAL_ITERS = 20

#: The split names in text order.
SPLITS = ('train', 'select', 'val')


def fingerprint(data):
    """The hex SHA-256 of ``data`` (bytes: the text file as stored)."""
    return hashlib.sha256(data).hexdigest()


def char_vocab(text):
    """The sorted characters of ``text`` as one string (id = index)."""
    return ''.join(sorted(set(text)))


def _code_points(text):
    return numpy.frombuffer(text.encode('utf-32-le'), dtype='<u4')


def ids_dtype(vocab):
    """``uint8`` for at most 256 characters, else ``uint16``."""
    if len(vocab) <= 256:
        return numpy.dtype(numpy.uint8)
    if len(vocab) <= 65536:
        return numpy.dtype(numpy.uint16)
    raise ValueError('a vocabulary of at most 65536 characters was expected, '
                     'got {}'.format(len(vocab)))


def encode(text, vocab):
    """The ids of ``text``'s characters in ``vocab`` (a sorted string)."""
    table = _code_points(vocab)
    points = _code_points(text)
    ids = numpy.searchsorted(table, points)
    found = ids < len(table)
    found[found] = table[ids[found]] == points[found]
    if not found.all():
        bad = text[int(numpy.argmin(found))]
        raise ValueError('character {!r} is not in the vocabulary'.format(bad))
    return ids.astype(ids_dtype(vocab))


def decode(ids, vocab):
    """The text of ``ids`` (the inverse of :func:`encode`)."""
    return ''.join(vocab[i] for i in numpy.asarray(ids).ravel())


def split_bounds(n):
    """``(end of train, end of select)`` for a text of ``n`` characters."""
    return n * 9 // 10, n * 19 // 20


def split_ids(ids):
    """``{'train': ..., 'select': ..., 'val': ...}``: views of ``ids``."""
    a, b = split_bounds(len(ids))
    return {'train': ids[:a], 'select': ids[a:b], 'val': ids[b:]}


def _offsets(seed, n_tokens, block_size, shape):
    if n_tokens <= block_size:
        raise ValueError('a split longer than block_size={} characters was '
                         'expected, got {}'.format(block_size, n_tokens))
    return numpy.random.RandomState(seed).randint(
        0, n_tokens - block_size, size=shape)


def train_offsets(n_tokens, block_size, batch_size, max_iters, seed):
    """The window starts of a run: ``(max_iters, batch_size)`` ``int64``,
    row ``i`` for step ``i``. ``n_tokens`` is the length of ``train``."""
    return _offsets(seed, n_tokens, block_size, (max_iters, batch_size))


def eval_offsets(n_tokens, block_size, batch_size, eval_iters=EVAL_ITERS,
                 eval_seed=EVAL_SEED):
    """The fixed evaluation window starts of a split of ``n_tokens``:
    ``(eval_iters, batch_size)``, the same for every seed and method."""
    return _offsets(eval_seed, n_tokens, block_size, (eval_iters, batch_size))


def batch(ids, starts, block_size):
    """Inputs and targets at window ``starts``: two ``int32`` arrays of shape
    ``(len(starts), block_size)``, the targets shifted one character on."""
    index = numpy.asarray(starts)[:, None] + numpy.arange(block_size)
    return ids[index].astype(numpy.int32), ids[index + 1].astype(numpy.int32)


class CharCorpus(object):
    """A text as character ids, its vocabulary, splits and fingerprint.

    Attributes:
        path (str): the text file read (``None`` if made from a string).
        sha256 (str): :func:`fingerprint` of the file's bytes.
        vocab (str): :func:`char_vocab` of the whole text.
        ids (numpy.ndarray): :func:`encode` of the whole text.
        splits (dict): :func:`split_ids` of ``ids``.
    """

    def __init__(self, data, path=None):
        try:
            text = data.decode('utf-8')
        except UnicodeDecodeError as e:
            raise ValueError('{}: UTF-8 text was expected ({})'.format(
                path or 'corpus', e)) from None
        self.path = path
        self.sha256 = fingerprint(data)
        self.vocab = char_vocab(text)
        self.ids = encode(text, self.vocab)
        self.splits = split_ids(self.ids)

    @property
    def vocab_size(self):
        return len(self.vocab)

    def train_batches(self, block_size, batch_size, max_iters, seed):
        """Yields the ``max_iters`` training ``(x, y)`` of a run."""
        train = self.splits['train']
        for row in train_offsets(len(train), block_size, batch_size,
                                 max_iters, seed):
            yield batch(train, row, block_size)

    def eval_batches(self, split, block_size, batch_size,
                     eval_iters=EVAL_ITERS):
        """The fixed evaluation ``(x, y)`` of ``split`` (a list)."""
        if split not in SPLITS:
            raise ValueError('split must be one of {}, got {!r}'.format(
                ', '.join(SPLITS), split))
        ids = self.splits[split]
        return [batch(ids, row, block_size) for row in eval_offsets(
            len(ids), block_size, batch_size, eval_iters)]
