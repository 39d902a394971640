"""The entries with data fetched on request (``data.download``), and the
first run of a newcomer (issue 49's target): a fresh root, ``fetch cifar10``
from a local server, then ``experiments/table1.py`` for one cell, end to
end with no manual step.

The served archive is generated in the publisher's layout
(tests/local_server.py), so the tests replace its entry of the expected-
checksum table (``sources.CHECKSUMS``) with the generated file's MD5 -- that
and nothing else. Nothing here reaches the internet.
"""
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys

import chainer
import pytest

from ada_loss.datasets import fetch as F
from ada_loss.datasets import sources as S
from ada_loss.experiment.runner import main
from ada_loss.experiment.studies.classification import STUDY

import local_server as L

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CIFAR10 = 'cifar-10-python.tar.gz'


@pytest.fixture
def served(monkeypatch):
    """A local server holding a generated CIFAR-10 tarball (32 images a
    file), expected by the checksum table."""
    data, _ = L.cifar10_tarball(n_per_batch=32)
    monkeypatch.setitem(S.CHECKSUMS, CIFAR10, hashlib.md5(data).hexdigest())
    with L.LocalServer() as server:
        server.serve(CIFAR10, data)
        yield server


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(STUDY, argv)
    return status, out.getvalue(), err.getvalue()


def test_download_fetches_missing_data_once_and_is_not_a_config_change(
        served, tiny_config, out_dir, tmp_path):
    root = str(tmp_path / 'cifar')
    path = tiny_config(grid={'datasets': ['cifar10']})
    fetching = ['--set', 'data.cifar_root=' + root]
    # off (the default): nothing is fetched, one error line says how
    status, _, err = _run(['--config', path, '--out', out_dir] + fetching)
    assert status == 2 and 'ada_loss.datasets.fetch cifar10' in err
    assert served.requests == [] and not os.path.exists(root)
    status, out, err = _run(['--config', path, '--out', out_dir] + fetching +
                            ['--set', 'data.download=true', '--set',
                             'data.mirror=' + served.url, '--no-table'])
    assert status == 0, err
    assert served.requests == [CIFAR10]
    assert '[fetch] ' + os.path.join(root, CIFAR10) + ': MD5 verified' in out
    assert sorted(os.listdir(root)) == ['cifar-10-batches-py', CIFAR10]
    # the same run without download: read from the root, skipped as
    # finished -- how the data was obtained is not part of its config
    status, out, err = _run(['--config', path, '--out', out_dir] + fetching +
                            ['--no-table'])
    assert status == 0, err
    assert 'finished' in out and 'config changed' not in out, out
    assert served.requests == [CIFAR10]


def test_fetch_then_table1_end_to_end(served, tmp_path, monkeypatch):
    """``python -m ada_loss.datasets.fetch cifar10`` (in this process,
    whose checksum table knows the generated file) into a fresh Chainer
    dataset root, then the Table 1 cell as a user runs it, in its own
    process, with no data setting at all: it finds the fetched data where
    the fetch put it. Shrunk for a CPU test: 20 iterations of batch 8."""
    chainer_root = str(tmp_path / 'chainer-datasets')
    old = chainer.dataset.get_dataset_root()
    chainer.dataset.set_dataset_root(chainer_root)
    try:
        monkeypatch.delenv('ADA_LOSS_CIFAR_ROOT', raising=False)
        assert F.main(['cifar10', '--mirror', served.url]) == 0
    finally:
        chainer.dataset.set_dataset_root(old)
    assert os.path.isdir(os.path.join(chainer_root, 'ada_loss', 'cifar',
                                      'cifar-10-batches-py'))
    env = dict(os.environ, CHAINER_DATASET_ROOT=chainer_root,
               OMP_NUM_THREADS='1')
    env.pop('ADA_LOSS_CIFAR_ROOT', None)
    out = str(tmp_path / 'results')
    done = subprocess.run(
        [sys.executable, 'experiments/table1.py', '--only',
         'model=resnet20,dataset=cifar10,mode=adaptive,seed=0',
         '--set', 'train.max_iterations=20', '--set', 'train.batchsize=8',
         '--out', out], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(os.path.join(out, 'table1', 'resnet20-cifar10-adaptive-s0',
                           'run.json')) as f:
        info = json.load(f)
    assert info['status'] == 'finished' and info['iterations'] == 20
    assert '| C10 | 20 |' in done.stdout


def test_detection_download_fetches_voc(monkeypatch, tmp_path):
    """``data.download`` on the SSD entries: VOC07+12 fetched from a local
    server (tarballs cut from the on-disk fixture) into data.voc_root."""
    import ondisk_fixtures
    from ada_loss.experiment.config import load
    from ada_loss.experiment.studies import detection
    made = ondisk_fixtures.make_vocdevkit(str(tmp_path / 'made'))
    with L.LocalServer() as server:
        for name, data in L.voc_tarballs(made).items():
            server.serve(name, data)
            monkeypatch.setitem(S.CHECKSUMS, name,
                                hashlib.md5(data).hexdigest())
        root = str(tmp_path / 'voc')
        cfg = load(detection.Config, raw={'data': {
            'voc_root': root, 'download': True, 'mirror': server.url}})
        train, test = detection.voc_datasets(cfg.data)
        assert (len(train), len(test)) == (4, 2)
        assert len(server.requests) == 3
        # off: the same root now has the data; nothing more is asked
        cfg = load(detection.Config, raw={'data': {'voc_root': root}})
        assert len(detection.voc_datasets(cfg.data)[0]) == 4
        assert len(server.requests) == 3


def test_a_half_extracted_folder_is_refused_or_completed(
        served, tiny_config, out_dir, tmp_path):
    """What an interrupted ``tar -x`` of the publisher's archive leaves
    (data_batch_4 and test_batch: its members come in that order) was read
    as CIFAR-10, one batch of five, without a word; now it is missing data:
    one error line naming the batches it lacks, and with data.download the
    archive is fetched and extracted into it."""
    import tarfile
    data, _ = L.cifar10_tarball(n_per_batch=32)
    root = tmp_path / 'cifar'
    (root / 'cifar-10-batches-py').mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for name in ('data_batch_4', 'test_batch'):
            (root / 'cifar-10-batches-py' / name).write_bytes(
                tar.extractfile('cifar-10-batches-py/' + name).read())
    path = tiny_config(grid={'datasets': ['cifar10']},
                       data={'train_size': None, 'test_size': None})
    argv = ['--config', path, '--out', out_dir, '--no-table', '--set',
            'data.cifar_root=' + str(root)]
    status, _, err = _run(argv)
    assert status == 2
    line, = [t for t in err.splitlines() if t.startswith('error:')]
    assert 'lacks data_batch_1, data_batch_2, data_batch_3 beside ' \
        'data_batch_4' in line
    status, out, err = _run(argv + ['--set', 'data.download=true', '--set',
                                    'data.mirror=' + served.url])
    assert status == 0, err
    assert served.requests == [CIFAR10]
    runs = [os.path.join(d, 'run.json') for d, _, f in os.walk(out_dir)
            if 'run.json' in f]
    with open(runs[0]) as f:
        files = json.load(f)['data']['files']
    assert sorted(files) == ['batches.meta'] + [
        'data_batch_%d' % i for i in range(1, 6)] + ['test_batch']
