"""Resume and reuse see the data (issue 50 item 8): ``data.cifar_root:
null`` means ``$ADA_LOSS_CIFAR_ROOT``, which config.yaml does not record;
run.json records the resolved root, the files' sizes and hashes and the
MPI world size, and ``--resume`` or a plain rerun refuses a run whose data
(or world size) changed, naming what changed, unless ``--force``. Two fake
CIFAR-10 folders of different random content; 2-iteration runs."""
from functools import partial
import json
import os
import shutil

import pytest

import ondisk_fixtures

from ada_loss.datasets import CIFAR_ROOT_ENV
from ada_loss.experiment import provenance
from ada_loss.experiment import runinfo as R
from ada_loss.experiment import runner
from ada_loss.experiment.studies.classification import STUDY

main = partial(runner.main, STUDY)
CELL = 'small_cnn-cifar10-fp32-s0'


@pytest.fixture
def cifar(tmp_path, tiny_config, out_dir, monkeypatch):
    """Folders A and B, a config reading $ADA_LOSS_CIFAR_ROOT, and a
    finished 2-iteration run on A: (A, B, config, run folder)."""
    a = ondisk_fixtures.make_cifar10(str(tmp_path / 'A'), seed=0)
    b = ondisk_fixtures.make_cifar10(str(tmp_path / 'B'), seed=1)
    path = tiny_config(grid={'datasets': ['cifar10']},
                       data={'cifar_root': None, 'train_size': None,
                             'test_size': None},
                       train={'batchsize': 16})
    monkeypatch.setenv(CIFAR_ROOT_ENV, a)
    assert main(['--config', path, '--out', out_dir, '--no-table']) == 0
    return a, b, path, os.path.join(out_dir, 'tiny', CELL)


def _run(path, out_dir, *args):
    return main(['--config', path, '--out', out_dir, '--no-table'] +
                list(args))


def test_run_json_records_the_data_read(cifar):
    a, _, _, folder = cifar
    info = R.read_run(folder)
    data = info['data']
    assert data['roots'] == {'cifar_root': a}
    assert sorted(data['files']) == ['data_batch_1', 'data_batch_2',
                                     'test_batch']
    for name, entry in data['files'].items():
        path = os.path.join(a, name)
        assert entry == {'size': os.path.getsize(path),
                         'sha256': provenance.file_sha256(path)}
    assert info['world_size'] == 1
    with open(os.path.join(folder, 'config.yaml')) as f:
        assert 'cifar_root: null' in f.read()      # as written


def test_resume_on_other_data_is_refused(cifar, out_dir, monkeypatch,
                                         capsys):
    """The issue's scenario: --resume with a raised stop point and the
    variable pointing at B continued the run on B; now refused, naming
    the roots and the files, and the run is left as it was."""
    a, b, path, folder = cifar
    before = R.read_run(folder)
    monkeypatch.setenv(CIFAR_ROOT_ENV, b)
    capsys.readouterr()
    assert _run(path, out_dir, '--resume', '--set',
                'train.max_iterations=4') == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert 'error: 1 run not run: {}: data changed since it ran ' \
        '(cifar_root {} → {}; data_batch_1 '.format(CELL, a, b) in err
    assert 'continuing it would mix two inputs' in err and '--force' in err
    assert R.read_run(folder) == before
    assert before['iterations'] == 2


def test_rerun_on_other_data_is_refused_or_forced(cifar, out_dir,
                                                  monkeypatch, capsys):
    """A plain rerun skipped the finished run as if it were of B's data;
    now refused; --force retrains it on B (run.json then records B)."""
    _, b, path, folder = cifar
    monkeypatch.setenv(CIFAR_ROOT_ENV, b)
    capsys.readouterr()
    assert _run(path, out_dir) == 2
    err = capsys.readouterr().err
    assert 'data changed since it ran (cifar_root' in err
    assert 'reusing it would report numbers of other inputs' in err
    assert '--force retrains it' in err
    assert _run(path, out_dir, '--force') == 0
    info = R.read_run(folder)
    assert info['data']['roots'] == {'cifar_root': b}
    assert info['status'] == R.FINISHED and not info['resumed']


def test_same_data_resumes_and_skips_as_before(cifar, out_dir, tmp_path,
                                               monkeypatch, capsys):
    a, _, path, folder = cifar
    capsys.readouterr()
    assert _run(path, out_dir) == 0
    assert '[skip] {} (finished)\n'.format(CELL) in capsys.readouterr().out
    assert _run(path, out_dir, '--resume', '--set',
                'train.max_iterations=4') == 0
    out = capsys.readouterr().out
    assert '[1/1] resume {} (stop point changed)'.format(CELL) in out
    info = R.read_run(folder)
    assert info['iterations'] == 4 and info['resumed']
    # the same files under another root: the same data (said, not refused)
    moved = str(tmp_path / 'C' / 'cifar-10-batches-py')
    shutil.copytree(a, moved)
    monkeypatch.setenv(CIFAR_ROOT_ENV, moved)
    assert _run(path, out_dir, '--set', 'train.max_iterations=4') == 0
    assert '[skip] {} (finished; same data files under another root)'.format(
        CELL) in capsys.readouterr().out


def test_a_file_rewritten_in_place_is_seen(cifar, out_dir, monkeypatch,
                                           capsys):
    """Same root, same file names, one batch's content changed (its size
    kept): the hash names it."""
    a, _, path, folder = cifar
    batch = os.path.join(a, 'data_batch_2')
    with open(batch, 'r+b') as f:
        f.seek(-40, os.SEEK_END)
        byte = f.read(1)
        f.seek(-40, os.SEEK_END)
        f.write(bytes([byte[0] ^ 1]))
    capsys.readouterr()
    assert _run(path, out_dir) == 2
    err = capsys.readouterr().err
    assert 'data changed since it ran (data_batch_2 sha256 ' in err


def test_runs_without_data_records_stay_reusable(cifar, out_dir,
                                                 monkeypatch, capsys):
    """A run.json written before these records (the committed results):
    reused and continued as before, said to be unverified; --table-only
    reads it whatever the data; continued, its record is marked as not
    covering its earlier iterations."""
    _, b, path, folder = cifar
    info = R.read_run(folder)
    del info['data']
    R.write_run(folder, info)
    capsys.readouterr()
    assert _run(path, out_dir) == 0
    assert '[skip] {} (finished; data unverified: its run.json predates ' \
        'the data records)'.format(CELL) in capsys.readouterr().out
    monkeypatch.setenv(CIFAR_ROOT_ENV, b)
    assert main(['--config', path, '--out', out_dir, '--table-only']) == 0
    assert _run(path, out_dir, '--resume', '--set',
                'train.max_iterations=4') == 0
    assert 'resume {} (stop point changed; data unverified'.format(
        CELL) in capsys.readouterr().out
    # its record covers the continuation only, and says so
    data = R.read_run(folder)['data']
    assert data['roots'] == {'cifar_root': b}
    assert data[provenance.EARLIER_UNVERIFIED] is True
    assert _run(path, out_dir, '--set', 'train.max_iterations=4') == 0
    assert '(finished; data unverified before its resume from a run.json ' \
        'without data records)' in capsys.readouterr().out


def test_world_size_change_is_refused(cifar, out_dir, capsys):
    _, _, path, folder = cifar
    info = R.read_run(folder)
    info['world_size'] = 2
    R.write_run(folder, info)
    capsys.readouterr()
    assert _run(path, out_dir) == 2
    assert 'MPI world size changed since it ran (2 → 1 ranks)' in \
        capsys.readouterr().err


def test_digest_is_cached_per_path_size_and_mtime(tmp_path):
    path = str(tmp_path / 'f')
    with open(path, 'wb') as f:
        f.write(b'abc')
    first = provenance.file_sha256(path)
    assert first == ('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff'
                     '61f20015ad')
    with open(path, 'wb') as f:
        f.write(b'abd')
    os.utime(path, ns=(1, 10 ** 9))             # another mtime: hashed again
    assert provenance.file_sha256(path) != first
    assert json.dumps(provenance.data_record({}, [path]))   # JSON-able


def test_files_recorded_are_the_files_read(tmp_path, monkeypatch):
    """data_files names what each loader reads: CIFAR's batches (or its
    archive), Fashion-MNIST's four files, scikit-learn's digits file; a
    folder the loader cannot use is its DatasetNotFoundError."""
    import tarfile
    from types import SimpleNamespace
    from ada_loss.datasets import DatasetNotFoundError
    from ada_loss.experiment.data import data_files
    folder = ondisk_fixtures.make_cifar10(str(tmp_path / 'A'))
    with open(os.path.join(folder, 'readme.html'), 'w') as f:
        f.write('not read')
    cfg = SimpleNamespace(cifar_root=str(tmp_path / 'A'),
                          fashion_mnist_root=str(tmp_path / 'none'))
    roots, files = data_files('cifar10', cfg)
    assert roots == {'cifar_root': folder}
    assert files == [os.path.join(folder, n) for n in (
        'data_batch_1', 'data_batch_2', 'test_batch')]
    archive = str(tmp_path / 'cifar-10-python.tar.gz')
    with tarfile.open(archive, 'w:gz') as tar:
        tar.add(folder, 'cifar-10-batches-py')
    cfg.cifar_root = archive
    assert data_files('cifar10', cfg) == ({'cifar_root': archive}, [archive])
    os.makedirs(str(tmp_path / 'E' / 'cifar-10-batches-py'))
    cfg.cifar_root = str(tmp_path / 'E')
    with pytest.raises(DatasetNotFoundError, match='lacks the training or '
                                                   'test file'):
        data_files('cifar10', cfg)
    with pytest.raises(DatasetNotFoundError):
        data_files('fashion_mnist', cfg)
    roots, files = data_files('digits', cfg)
    assert [os.path.basename(f) for f in files] == ['digits.csv.gz']
    assert os.path.isfile(files[0])


def test_digest_sees_a_rewrite_whose_mtime_is_put_back(tmp_path):
    """Same size, same modification time (``touch -r``), same inode: only
    the status-change time tells; the digest is not the cached one."""
    path = str(tmp_path / 'data_batch_1')
    with open(path, 'wb') as f:
        f.write(b'A' * 100)
    first = provenance.file_sha256(path)
    st = os.stat(path)
    with open(path, 'r+b') as f:
        f.write(b'B')
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == \
        (st.st_size, st.st_mtime_ns, st.st_ino)
    assert provenance.file_sha256(path) != first


@pytest.mark.parametrize('record', [
    [], 'edited', {'roots': None, 'files': {}, 'fingerprint': 'f'},
    {'roots': {}, 'files': {'data_batch_1': None}, 'fingerprint': 'f'},
    {'roots': {}, 'files': None, 'fingerprint': 'f'}])
def test_a_damaged_data_record_is_refused_in_one_line(cifar, out_dir,
                                                      capsys, record):
    """A ``data`` field not of the shape this code writes says nothing of
    the data the run read: its reuse and continuation are refused, one
    line naming it (they crashed with an AttributeError or TypeError)."""
    _, _, path, folder = cifar
    info = R.read_run(folder)
    info['data'] = record
    R.write_run(folder, info)
    capsys.readouterr()
    assert _run(path, out_dir) == 2
    err = capsys.readouterr().err
    assert "its run.json's data record is not one this code writes" in err
    assert _run(path, out_dir, '--resume', '--set',
                'train.max_iterations=4') == 2
    assert "data record is not one" in capsys.readouterr().err


@pytest.mark.parametrize('text', ['[]', '"finished"', '3'])
def test_a_run_json_that_is_no_object_is_no_record(cifar, out_dir, capsys,
                                                   text):
    """run.json holding valid JSON of another shape crashed every rerun
    (AttributeError: 'str' object has no attribute 'get'); it is now what
    invalid JSON already was: no record of the run."""
    _, _, path, folder = cifar
    with open(os.path.join(folder, R.RUN_JSON), 'w') as f:
        f.write(text)
    assert R.read_run(folder) is None
    capsys.readouterr()
    status = _run(path, out_dir)
    captured = capsys.readouterr()
    assert 'Traceback' not in captured.err
    # as with invalid JSON: a run with snapshots and no record, one line
    assert status == 2
    assert 'unfinished (run.json missing); --resume continues it' in \
        captured.err
