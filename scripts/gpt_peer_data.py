"""The GPT experiments' data contract, written again from docs/transformer.md
("Data") for the PyTorch peer (``gpt_torch_peer.py``) without importing
ada_loss: NumPy and the standard library only.

A text file of ``N`` characters (UTF-8) becomes ids in its sorted set of
characters; ``train`` is the first ``9N // 10``, ``select`` the next
``19N // 20 - 9N // 10``, ``val`` the rest. Training windows come from
``numpy.random.RandomState(seed)``, evaluation windows from a fresh
``RandomState(EVAL_SEED)`` per split. tests/scripts/test_gpt_peer_data.py
checks this file against ``ada_loss.datasets.char_corpus`` on small texts.
"""
import hashlib

import numpy

EVAL_SEED = 1337
EVAL_ITERS = 20


class Corpus(object):
    """``sha256``, ``vocab`` (str), ``ids`` (int64) and ``splits`` of a
    text file."""

    def __init__(self, path):
        with open(path, 'rb') as f:
            data = f.read()
        text = data.decode('utf-8')
        self.path = path
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab = ''.join(sorted(set(text)))
        index = {c: i for i, c in enumerate(self.vocab)}
        self.ids = numpy.fromiter((index[c] for c in text), dtype=numpy.int64,
                                  count=len(text))
        n = len(self.ids)
        ends = (n * 9 // 10, n * 19 // 20)
        self.splits = {'train': self.ids[:ends[0]],
                       'select': self.ids[ends[0]:ends[1]],
                       'val': self.ids[ends[1]:]}


def window_starts(seed, n_tokens, block_size, rows, batch_size):
    """``rows`` x ``batch_size`` window starts in ``[0, n_tokens -
    block_size)`` from ``RandomState(seed)``."""
    return numpy.random.RandomState(seed).randint(
        0, n_tokens - block_size, size=(rows, batch_size))


def train_starts(corpus, block_size, batch_size, max_iters, seed):
    """Row ``i``: the window starts of training step ``i``."""
    return window_starts(seed, len(corpus.splits['train']), block_size,
                         max_iters, batch_size)


def eval_starts(corpus, split, block_size, batch_size, eval_iters=EVAL_ITERS):
    """The fixed evaluation window starts of ``split``."""
    return window_starts(EVAL_SEED, len(corpus.splits[split]), block_size,
                         eval_iters, batch_size)


def windows(ids, starts, block_size):
    """Inputs ``ids[o:o + T]`` and targets ``ids[o + 1:o + 1 + T]``, one row
    per start ``o`` (``int64``)."""
    inputs = numpy.stack([ids[o:o + block_size] for o in starts])
    targets = numpy.stack([ids[o + 1:o + 1 + block_size] for o in starts])
    return inputs, targets
