"""The PyTorch peer's data contract (scripts/gpt_peer_data.py, written
without ada_loss) against ada_loss.datasets.char_corpus on a generated text:
the same vocabulary, ids, splits, training and evaluation windows; and, where
the peer's own environment exists (.venv-peer, docs/transformer.md), a few
steps of the peer itself."""
import json
import os
import subprocess

import numpy
import pytest
from repo_modules import load
from repo_modules import ROOT

from ada_loss.datasets import char_corpus
from ada_loss.datasets import CharCorpus

peer = load('scripts/gpt_peer_data.py')


def generated_file(tmp_path, n=5000, seed=0):
    rng = numpy.random.RandomState(seed)
    text = ''.join(rng.choice(list('The LORD é\n:;,.0123'), size=n))
    path = tmp_path / 'text.txt'
    path.write_bytes(text.encode('utf-8'))
    return str(path)


def test_same_corpus(tmp_path):
    path = generated_file(tmp_path, n=5011)
    with open(path, 'rb') as f:
        ours = CharCorpus(f.read(), path)
    theirs = peer.Corpus(path)
    assert theirs.sha256 == ours.sha256 and theirs.vocab == ours.vocab
    for split in char_corpus.SPLITS:
        numpy.testing.assert_array_equal(theirs.splits[split],
                                         ours.splits[split])


def test_same_windows(tmp_path):
    path = generated_file(tmp_path)
    with open(path, 'rb') as f:
        ours = CharCorpus(f.read(), path)
    theirs = peer.Corpus(path)
    assert (peer.EVAL_SEED, peer.EVAL_ITERS) == (char_corpus.EVAL_SEED,
                                                 char_corpus.EVAL_ITERS)
    starts = peer.train_starts(theirs, 16, 4, 6, seed=3)
    for (x, y), row in zip(ours.train_batches(16, 4, 6, seed=3), starts):
        px, py = peer.windows(theirs.splits['train'], row, 16)
        numpy.testing.assert_array_equal(px, x)
        numpy.testing.assert_array_equal(py, y)
    for split in ('select', 'val'):
        rows = peer.eval_starts(theirs, split, 16, 4)
        ours_eval = ours.eval_batches(split, 16, 4)
        assert len(rows) == len(ours_eval)
        for (x, y), row in zip(ours_eval, rows):
            numpy.testing.assert_array_equal(
                peer.windows(theirs.splits[split], row, 16)[1], y)


PEER_PYTHON = os.path.join(ROOT, '.venv-peer', 'bin', 'python')


@pytest.mark.skipif(not os.path.exists(PEER_PYTHON),
                    reason='the peer environment .venv-peer is not installed '
                    '(docs/transformer.md, "Peer")')
def test_peer_runs(tmp_path):
    path = generated_file(tmp_path, n=20000)
    out = str(tmp_path / 'run.json')
    subprocess.run([PEER_PYTHON, os.path.join(ROOT, 'scripts',
                                              'gpt_torch_peer.py'),
                    '--text', path, '--max-iters', '4', '--eval-interval', '2',
                    '--eval-iters', '2', '--n-layer', '1', '--n-embd', '32',
                    '--block-size', '16', '--json', out], check=True,
                   stdout=subprocess.DEVNULL)
    with open(out) as f:
        record = json.load(f)
    assert [e['step'] for e in record['eval']] == [0, 2, 4]
    assert len(record['train_loss']) == 4
    with open(path, 'rb') as f:
        assert record['corpus']['sha256'] == CharCorpus(f.read()).sha256
    # an untrained model predicts about uniformly: ln(vocabulary size)
    assert abs(record['eval'][0]['val'] - numpy.log(
        record['corpus']['vocab_size'])) < 0.3
