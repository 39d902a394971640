"""Datasets fetched on request (ada_loss.datasets.fetch), for real, from a
local http.server on 127.0.0.1 serving generated archives in the
publishers' layouts (tests/local_server.py): a good one, a truncated one, a
corrupted one, one that stalls, and no server at all. Each failure gives one
error line and leaves nothing a loader would take for data.

The generated files are not the publishers', so the tests replace the
entries of the expected-checksum table (``sources.CHECKSUMS``) with the
generated files' MD5s -- that table and nothing else: the download, the
verification, the renaming and the extraction are the real ones. Nothing
here reaches the internet.
"""
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy
import pytest

from ada_loss.datasets import fetch as F
from ada_loss.datasets import sources as S
from ada_loss.datasets.cifar import get_cifar
from ada_loss.datasets.errors import DatasetChecksumError
from ada_loss.datasets.errors import DatasetFetchError
from ada_loss.datasets.errors import DatasetNotFoundError
from ada_loss.datasets.fashion_mnist import get_fashion_mnist

import local_server as L
import ondisk_fixtures

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
CIFAR10 = 'cifar-10-python.tar.gz'
TIMEOUT = 1.0       # seconds without a byte before a download gives up


def _md5(data):
    return hashlib.md5(data).hexdigest()


@pytest.fixture(scope='module')
def cifar10():
    return L.cifar10_tarball()


@pytest.fixture
def server():
    with L.LocalServer() as s:
        yield s


@pytest.fixture
def expect(monkeypatch):
    """Sets the expected MD5 of a file name in the checksum table (only
    there) to that of the generated ``data``."""
    def set_(name, data):
        monkeypatch.setitem(S.CHECKSUMS, name, _md5(data))
    return set_


def _one_line(error):
    text = str(error)
    assert text and '\n' not in text, text
    return text


def _nothing_taken_for_data(root):
    """No file under ``root`` that a loader reads, nor a temporary left."""
    left = [os.path.join(folder, n) for folder, dirs, names in os.walk(root)
            for n in names + dirs]
    assert left == [], left
    with pytest.raises(DatasetNotFoundError):
        get_cifar('cifar10', str(root))


def test_voc_files_are_the_ones_chainercv_downloads():
    """The VOC tarballs fetched are the ones of ChainerCV's own helper
    (chainercv/datasets/voc/voc_utils.py), from the same server."""
    from chainercv.datasets.voc import voc_utils
    ours = {S.url_of(src) for _, _, src in S.VOC}
    assert ours == set(voc_utils.urls.values())


def test_good_archive_is_fetched_verified_extracted_and_read(
        server, expect, cifar10, tmp_path):
    data, truth = cifar10
    server.serve(CIFAR10, data)
    expect(CIFAR10, data)
    root = F.fetch('cifar10', tmp_path / 'c', mirror=server.url,
                   timeout=TIMEOUT)
    assert sorted(os.listdir(root)) == ['cifar-10-batches-py', CIFAR10]
    with open(os.path.join(root, CIFAR10), 'rb') as f:
        assert f.read() == data
    train, test = get_cifar('cifar10', root)
    assert len(train) == 20 and len(test) == 4
    numpy.testing.assert_array_equal(
        test.images.reshape(4, -1), truth['test_batch'][0])
    assert list(test.labels) == truth['test_batch'][1]
    # an existing verified file is not fetched again
    assert server.requests == [CIFAR10]
    F.fetch('cifar10', root, mirror=server.url, timeout=TIMEOUT)
    assert server.requests == [CIFAR10]


def test_truncated_download_leaves_nothing(server, expect, cifar10,
                                           tmp_path):
    data, _ = cifar10
    server.serve(CIFAR10, data, 'truncated')
    expect(CIFAR10, data)
    with pytest.raises(DatasetFetchError) as e:
        F.fetch('cifar10', tmp_path, mirror=server.url, timeout=TIMEOUT)
    assert 'cut short' in _one_line(e.value) and '1000 bytes' in str(e.value)
    _nothing_taken_for_data(tmp_path)


def test_corrupted_download_leaves_nothing(server, expect, cifar10,
                                           tmp_path):
    data, _ = cifar10
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    server.serve(CIFAR10, bytes(bad))
    expect(CIFAR10, data)
    with pytest.raises(DatasetChecksumError) as e:
        F.fetch('cifar10', tmp_path, mirror=server.url, timeout=TIMEOUT)
    text = _one_line(e.value)
    assert _md5(data) in text and _md5(bytes(bad)) in text
    _nothing_taken_for_data(tmp_path)


def test_stalled_download_gives_up_after_the_timeout(server, expect,
                                                     cifar10, tmp_path):
    data, _ = cifar10
    server.serve(CIFAR10, data, 'stall')
    expect(CIFAR10, data)
    start = time.time()
    with pytest.raises(DatasetFetchError) as e:
        F.fetch('cifar10', tmp_path, mirror=server.url, timeout=TIMEOUT)
    assert time.time() - start < 10
    assert 'stalled' in _one_line(e.value)
    _nothing_taken_for_data(tmp_path)


def _refused_url():
    """A URL on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    return 'http://127.0.0.1:{}/'.format(port)


def test_missing_file_on_the_server_is_named(server, tmp_path):
    with pytest.raises(DatasetFetchError) as e:
        F.fetch('cifar10', tmp_path, mirror=server.url, timeout=TIMEOUT)
    assert 'HTTP 404' in _one_line(e.value) and CIFAR10 in str(e.value)
    _nothing_taken_for_data(tmp_path)


def test_a_different_file_already_there_is_kept_and_named(
        server, expect, cifar10, tmp_path):
    data, _ = cifar10
    server.serve(CIFAR10, data)
    expect(CIFAR10, data)
    (tmp_path / CIFAR10).write_bytes(data[:100])
    with pytest.raises(DatasetChecksumError) as e:
        F.fetch('cifar10', tmp_path, mirror=server.url, timeout=TIMEOUT)
    assert 'remove it' in _one_line(e.value)
    assert (tmp_path / CIFAR10).read_bytes() == data[:100]
    assert server.requests == []


def test_fashion_mnist_files_fetched_and_read(server, expect, tmp_path):
    files = L.fashion_mnist_files()
    for name, data in files.items():
        server.serve(name, data)
        expect(name, data)
    root = F.fetch('fashion_mnist', tmp_path, mirror=server.url,
                   timeout=TIMEOUT)
    assert sorted(os.listdir(root)) == sorted(files)
    train, test = get_fashion_mnist(root)
    assert (len(train), len(test)) == (12, 6)


def test_voc_tarballs_merged_into_the_layout_the_loaders_read(
        server, expect, tmp_path):
    from ada_loss.datasets.voc import get_voc_detection_test
    from ada_loss.datasets.voc import get_voc_detection_train
    made = ondisk_fixtures.make_vocdevkit(str(tmp_path / 'made'))
    for name, data in L.voc_tarballs(made).items():
        server.serve(name, data)
        expect(name, data)
    root = str(tmp_path / 'voc')
    F.fetch('voc', root, mirror=server.url, timeout=TIMEOUT)
    assert len(get_voc_detection_train(root)) == 4
    assert len(get_voc_detection_test(root)) == 2
    assert not [n for n in os.listdir(root) if n.startswith('.')]
    # extracted splits are not fetched again
    asked = list(server.requests)
    F.fetch('voc', root, mirror=server.url, timeout=TIMEOUT)
    assert server.requests == asked


def test_imagenet_stays_manual_with_the_steps_in_one_line(tmp_path):
    with pytest.raises(DatasetFetchError) as e:
        F.fetch('imagenet', tmp_path)
    text = _one_line(e.value)
    for step in ('image-net.org', 'ILSVRC2012_img_train.tar',
                 '1d675b47d978889d74fa0da5fadfb00e', 'ADA_LOSS_IMAGENET_ROOT',
                 'val.txt'):
        assert step in text
    assert os.listdir(tmp_path) == []


def _cli(args, env=None, **kw):
    return subprocess.run(
        [sys.executable, '-m', 'ada_loss.datasets.fetch'] + args, cwd=REPO,
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, **(env or {})), **kw)


def _one_error_line(stderr):
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), stderr
    assert 'Traceback' not in stderr
    return lines[0]


def test_kjv_from_the_bible_program_or_the_install_command(
        tmp_path, monkeypatch, capsys):
    bible = shutil.which('bible')
    # without `bible` on PATH: status 1, the install command, nothing written
    monkeypatch.setenv('PATH', str(tmp_path))
    assert F.main(['kjv', '--root', str(tmp_path / 'none')]) == 1
    assert 'apt-get install bible-kjv' in _one_error_line(
        capsys.readouterr().err)
    assert not os.path.exists(tmp_path / 'none' / 'kjv.txt')
    if bible is None:
        pytest.skip('bible-kjv is not installed here')
    monkeypatch.setenv('PATH', os.path.dirname(bible))
    assert F.main(['kjv', '--root', str(tmp_path / 'kjv')]) == 0
    with open(tmp_path / 'kjv' / 'kjv.txt') as f:
        lines = f.read().splitlines()
    assert len(lines) == 31102 and lines[0].startswith('Ge1:1 In the '
                                                       'beginning')
    assert lines[-1].startswith('Rev22:21 ')
    capsys.readouterr()
    assert F.main(['kjv', '--root', str(tmp_path / 'kjv')]) == 0
    assert 'not made again' in capsys.readouterr().out


def test_command_line_errors_are_one_line_with_status_1(server, cifar10,
                                                        tmp_path):
    """A real process, the real checksum table: a file that is not the
    publisher's is refused in one line, status 1, no traceback."""
    data, _ = cifar10
    server.serve(CIFAR10, data)     # not CIFAR-10's MD5: refused
    done = _cli(['cifar10', '--root', str(tmp_path), '--mirror', server.url,
                 '--timeout', '5'])
    assert done.returncode == 1
    line = _one_error_line(done.stderr)
    assert S.CHECKSUMS[CIFAR10] in line and 'not kept' in line
    _nothing_taken_for_data(tmp_path)


def test_no_server_leaves_nothing(tmp_path, capsys):
    assert F.main(['cifar100', '--root', str(tmp_path), '--mirror',
                   _refused_url()]) == 1
    assert 'cannot reach' in _one_error_line(capsys.readouterr().err)
    _nothing_taken_for_data(tmp_path)


def _default_sigint():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_download_keeps_nothing(server, cifar10, tmp_path):
    data, _ = cifar10
    server.serve(CIFAR10, data, 'stall')
    proc = subprocess.Popen(
        [sys.executable, '-m', 'ada_loss.datasets.fetch', 'cifar10',
         '--root', str(tmp_path), '--mirror', server.url, '--timeout', '30'],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a suite started in the background (`cmd &` in a shell without job
        # control) inherits SIGINT ignored, and Python then installs no
        # KeyboardInterrupt handler: give the child the default back
        preexec_fn=_default_sigint)
    deadline = time.time() + 60
    while not server.requests and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)        # the first half of the body is being written
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert 'Traceback' not in err and 'interrupted' in err
    _nothing_taken_for_data(tmp_path)


def _tiny_tmpfs_works():
    if shutil.which('unshare') is None:
        return False
    done = subprocess.run(
        ['unshare', '-rm', 'sh', '-c', 'd=$(mktemp -d) && mount -t tmpfs -o '
         'size=64k tmpfs "$d"'], capture_output=True, timeout=30)
    return done.returncode == 0


@pytest.mark.skipif(not _tiny_tmpfs_works(),
                    reason='cannot mount a small tmpfs in a user namespace')
@pytest.mark.parametrize('how', ['good', 'nolength'])
def test_no_space_left_on_device(server, tmp_path, how):
    """A real full disk: the fetch runs in a user namespace on a 64 KiB
    tmpfs. Sent with its Content-Length, the file is refused before a byte
    is written; sent without, the write that fails (ENOSPC) ends it. Then
    the folder is listed: nothing is left in it."""
    name = 'train-images-idx3-ubyte.gz'
    server.serve(name, os.urandom(256 * 1024), how)
    mnt = tmp_path / 'mnt'
    mnt.mkdir()
    script = (
        'mount -t tmpfs -o size=64k tmpfs {mnt} && '
        '{py} -m ada_loss.datasets.fetch fashion_mnist --root {mnt}/fm '
        '--mirror {url} --timeout 5; echo "status=$?"; '
        'ls -A {mnt}/fm | sed "s/^/left=/"').format(
            mnt=mnt, py=sys.executable, url=server.url)
    done = subprocess.run(['unshare', '-rm', 'sh', '-c', script], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert 'status=1' in done.stdout, (done.stdout, done.stderr)
    assert 'no space left' in _one_error_line(done.stderr)
    assert 'left=' not in done.stdout, done.stdout


def test_an_archive_reaching_out_of_its_folder_is_refused(server, expect,
                                                          tmp_path):
    """Even with a matching checksum (a mirror's own archive, say), a member
    that climbs out of the target folder is not extracted."""
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w:gz') as tar:
        for name in ('cifar-10-batches-py/test_batch',
                     'cifar-10-batches-py/../../escaped'):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b'hi'))
    server.serve(CIFAR10, buf.getvalue())
    expect(CIFAR10, buf.getvalue())
    root = tmp_path / 'root'
    with pytest.raises(DatasetFetchError) as e:
        F.fetch('cifar10', root, mirror=server.url, timeout=TIMEOUT)
    assert 'not a readable tar archive' in _one_line(e.value)
    assert sorted(os.listdir(tmp_path)) == ['root']
    assert os.listdir(root) == [CIFAR10]      # the verified archive only


def test_a_file_url_mirror(expect, cifar10, tmp_path):
    """``--mirror file:///folder``: a lab's cache on a shared file system."""
    data, _ = cifar10
    (tmp_path / 'cache').mkdir()
    (tmp_path / 'cache' / CIFAR10).write_bytes(data)
    expect(CIFAR10, data)
    root = F.fetch('cifar10', tmp_path / 'root',
                   mirror='file://' + str(tmp_path / 'cache'))
    assert len(get_cifar('cifar10', root)[1]) == 4


def _members_of(data, names):
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {n: tar.extractfile('cifar-10-batches-py/' + n).read()
                for n in names}


@pytest.mark.parametrize('left', [
    # an interrupted `tar -x` of the publisher's archive, whose members
    # come data_batch_4, readme.html, test_batch, data_batch_3, ...
    ('data_batch_4', 'test_batch'),
    ('data_batch_4',),
])
@pytest.mark.parametrize('archive_there', [True, False])
def test_a_half_extracted_folder_is_completed(server, expect, cifar10,
                                              tmp_path, left, archive_there):
    """A folder holding some of the publisher's files is not taken for the
    data set: the archive is fetched (or the verified one there used) and
    extracted into it, so that the loader reads every training batch."""
    data, _ = cifar10
    server.serve(CIFAR10, data)
    expect(CIFAR10, data)
    root = tmp_path / 'root'
    (root / 'cifar-10-batches-py').mkdir(parents=True)
    for name, content in _members_of(data, left).items():
        (root / 'cifar-10-batches-py' / name).write_bytes(content)
    if archive_there:
        (root / CIFAR10).write_bytes(data)
    F.fetch('cifar10', root, mirror=server.url, timeout=TIMEOUT)
    train, test = get_cifar('cifar10', str(root))
    assert len(train) == 20 and len(test) == 4
    assert sorted(os.listdir(root)) == ['cifar-10-batches-py', CIFAR10]
    assert server.requests == ([] if archive_there else [CIFAR10])


@pytest.mark.parametrize('kind', ['symlink', 'hardlink'])
def test_an_archive_holding_links_is_refused(server, expect, cifar10,
                                             tmp_path, kind):
    """A link inside the folder to a sibling of it passes tarfile's 'data'
    filter (it stays inside the temporary folder), but once the folder is
    moved into ``root`` it reads a file of ``root`` outside the data's
    folder: no link is extracted at all."""
    import io
    import tarfile
    data, _ = cifar10
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w:gz') as tar, \
            tarfile.open(fileobj=io.BytesIO(data)) as good:
        for m in good.getmembers():
            if m.name.endswith('/test_batch'):
                link = tarfile.TarInfo(m.name)
                link.type = (tarfile.SYMTYPE if kind == 'symlink'
                             else tarfile.LNKTYPE)
                link.linkname = ('../planted' if kind == 'symlink' else
                                 'cifar-10-batches-py/data_batch_1')
                tar.addfile(link)
            else:
                tar.addfile(m, good.extractfile(m) if m.isfile() else None)
    bad = buf.getvalue()
    server.serve(CIFAR10, bad)
    expect(CIFAR10, bad)
    root = tmp_path / 'root'
    with pytest.raises(DatasetFetchError) as e:
        F.fetch('cifar10', root, mirror=server.url, timeout=TIMEOUT)
    assert 'link' in _one_line(e.value)
    assert os.listdir(root) == [CIFAR10]      # the verified archive only


@pytest.mark.parametrize('timeout', [float('inf'), 1e300, float('nan'), 0])
def test_a_timeout_no_socket_takes_is_refused_up_front(tmp_path, capsys,
                                                       timeout):
    """``--timeout inf`` (or 1e300) passed the check ``> 0`` and ended in
    an OverflowError traceback from ``socket.settimeout``; now the command
    line refuses it as it refuses 0, and ``fetch`` in one line, before any
    connection or file."""
    with pytest.raises(SystemExit) as e:
        F.main(['cifar10', '--root', str(tmp_path / 'r'), '--mirror',
                _refused_url(), '--timeout', repr(timeout)])
    assert e.value.code == 2
    assert '--timeout must be a number of seconds above 0 and at most' in \
        capsys.readouterr().err
    with pytest.raises(ValueError) as e:
        F.fetch('cifar10', tmp_path / 'r', mirror=_refused_url(),
                timeout=timeout)
    assert 'timeout must be a number of seconds' in _one_line(e.value)
    assert not (tmp_path / 'r').exists()


def test_two_fetches_into_one_root_both_succeed(cifar10, tmp_path):
    """Two fetches racing into one root both extract into temporary
    folders; the one that renames second found the folder there and
    failed ('Directory not empty'), though the data were complete. Now it
    moves its files in (the same verified bytes)."""
    from ada_loss.datasets import unpack
    data, _ = cifar10
    archive = tmp_path / CIFAR10
    archive.write_bytes(data)
    for _ in range(2):      # the second as the race's loser sees the root
        unpack.unpack_folder(str(archive), str(tmp_path),
                             'cifar-10-batches-py')
    assert sorted(os.listdir(tmp_path)) == ['cifar-10-batches-py', CIFAR10]
    assert len(get_cifar('cifar10', str(tmp_path))[0]) == 20


def test_ctrl_c_while_completing_a_half_folder_leaves_it_incomplete(
        server, expect, cifar10, tmp_path, monkeypatch):
    """Ctrl-C after batches.meta and data_batch_1..3 were moved into a
    folder that held data_batch_4 and a test batch: that folder would read
    as CIFAR-10 with four batches of five, no gap to tell. The test batch
    is taken out first and moved in last, so it reads as missing data;
    the same command completes it."""
    data, _ = cifar10
    server.serve(CIFAR10, data)
    expect(CIFAR10, data)
    root = tmp_path / 'root'
    (root / 'cifar-10-batches-py').mkdir(parents=True)
    for name, content in _members_of(data, ('data_batch_4',
                                            'test_batch')).items():
        (root / 'cifar-10-batches-py' / name).write_bytes(content)
    real, moved = os.replace, []

    def interrupted(src, dst):     # Ctrl-C at the fifth file moved in
        if len(moved) == 5:
            raise KeyboardInterrupt
        moved.append(os.path.basename(dst))
        real(src, dst)
    monkeypatch.setattr(os, 'replace', interrupted)
    with pytest.raises(KeyboardInterrupt):
        F.fetch('cifar10', root, mirror=server.url, timeout=TIMEOUT)
    monkeypatch.setattr(os, 'replace', real)
    assert moved[1:] == ['batches.meta', 'data_batch_1', 'data_batch_2',
                         'data_batch_3']       # [0]: the archive's rename
    with pytest.raises(DatasetNotFoundError):
        get_cifar('cifar10', str(root))
    assert sorted(os.listdir(root)) == ['cifar-10-batches-py', CIFAR10]
    F.fetch('cifar10', root, mirror=server.url, timeout=TIMEOUT)
    assert len(get_cifar('cifar10', str(root))[0]) == 20
