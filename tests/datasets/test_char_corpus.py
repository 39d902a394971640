"""The character-level data contract (char_corpus) on small generated
texts: vocabulary, ids, splits, window order and evaluation windows."""
import hashlib

import numpy
import pytest

from ada_loss.datasets import char_corpus
from ada_loss.datasets.char_corpus import CharCorpus


def generated_text(n, seed=0, alphabet='ab cdé\n→xyZ.'):
    rng = numpy.random.RandomState(seed)
    return ''.join(rng.choice(list(alphabet), size=n))


def test_vocab_and_ids_round_trip():
    text = generated_text(500)
    vocab = char_corpus.char_vocab(text)
    assert vocab == ''.join(sorted(set(text)))
    assert list(vocab) == sorted(vocab) and len(set(vocab)) == len(vocab)
    ids = char_corpus.encode(text, vocab)
    assert ids.dtype == numpy.uint8
    assert [vocab[i] for i in ids] == list(text)
    assert char_corpus.decode(ids, vocab) == text


def test_wide_vocab_is_uint16():
    text = ''.join(chr(0x100 + i) for i in range(300)) + 'a'
    ids = char_corpus.encode(text, char_corpus.char_vocab(text))
    assert ids.dtype == numpy.uint16
    assert ids[-1] == 0 and ids.max() == 300      # 'a' sorts first


def test_unknown_character():
    with pytest.raises(ValueError, match="'q' is not in the vocabulary"):
        char_corpus.encode('abq', 'ab')
    with pytest.raises(ValueError, match="'~' is not in the vocabulary"):
        char_corpus.encode('~', 'ab')           # past the last character


def test_splits_partition_the_text():
    assert char_corpus.split_bounds(1000) == (900, 950)
    assert char_corpus.split_bounds(4404412) == (3963970, 4184191)
    ids = numpy.arange(1013)
    splits = char_corpus.split_ids(ids)
    assert [len(splits[s]) for s in char_corpus.SPLITS] == [911, 51, 51]
    numpy.testing.assert_array_equal(
        numpy.concatenate([splits[s] for s in char_corpus.SPLITS]), ids)


def test_train_offsets_are_the_documented_draw():
    got = char_corpus.train_offsets(900, 16, 3, 7, seed=5)
    want = numpy.random.RandomState(5).randint(0, 900 - 16, size=(7, 3))
    numpy.testing.assert_array_equal(got, want)
    assert not numpy.array_equal(
        got, char_corpus.train_offsets(900, 16, 3, 7, seed=6))


def test_eval_offsets_depend_on_nothing_but_the_split():
    got = char_corpus.eval_offsets(300, 16, 4)
    want = numpy.random.RandomState(char_corpus.EVAL_SEED).randint(
        0, 300 - 16, size=(char_corpus.EVAL_ITERS, 4))
    numpy.testing.assert_array_equal(got, want)


def test_batch_targets_are_shifted_inputs():
    ids = numpy.arange(50, dtype=numpy.uint8)
    x, y = char_corpus.batch(ids, numpy.array([0, 45]), 4)
    assert x.dtype == y.dtype == numpy.int32
    numpy.testing.assert_array_equal(x, [[0, 1, 2, 3], [45, 46, 47, 48]])
    numpy.testing.assert_array_equal(y, [[1, 2, 3, 4], [46, 47, 48, 49]])


def test_split_shorter_than_a_window():
    with pytest.raises(ValueError, match='longer than block_size=64'):
        char_corpus.eval_offsets(64, 64, 2)


def test_corpus_batches():
    data = generated_text(4000, seed=1).encode('utf-8')
    corpus = CharCorpus(data, 'gen.txt')
    assert corpus.sha256 == hashlib.sha256(data).hexdigest()
    assert corpus.vocab_size == 12 and len(corpus.ids) == 4000
    train = corpus.splits['train']
    batches = list(corpus.train_batches(8, 3, 5, seed=2))
    starts = numpy.random.RandomState(2).randint(0, len(train) - 8,
                                                 size=(5, 3))
    assert len(batches) == 5
    for (x, y), row in zip(batches, starts):
        numpy.testing.assert_array_equal(x[1], train[row[1]:row[1] + 8])
        numpy.testing.assert_array_equal(y[1], train[row[1] + 1:row[1] + 9])
    evals = corpus.eval_batches('val', 8, 3, eval_iters=2)
    assert len(evals) == 2 and evals[0][0].shape == (3, 8)
    again = CharCorpus(data).eval_batches('val', 8, 3, eval_iters=2)
    numpy.testing.assert_array_equal(evals[1][1], again[1][1])
    with pytest.raises(ValueError, match="one of train, select, val, got "
                       "'test'"):
        corpus.eval_batches('test', 8, 3)


def test_not_utf8():
    with pytest.raises(ValueError, match='x.txt: UTF-8 text was expected'):
        CharCorpus(b'ab\xff', 'x.txt')
