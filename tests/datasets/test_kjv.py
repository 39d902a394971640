"""get_kjv on small generated texts: where it reads, how it makes the text
with the ``bible`` command (a stand-in script first on PATH), and the
one-line errors when it can do neither. The real corpus is never read."""
import os
import stat

import pytest

from ada_loss.datasets import DatasetFormatError
from ada_loss.datasets import DatasetNotFoundError
from ada_loss.datasets import get_kjv
from ada_loss.datasets import KJV_ROOT_ENV
from ada_loss.datasets import kjv

TEXT = ('Ge1:1 In the beginning God created the heaven and the earth.\n'
        'Ge1:2 And the earth was without form, and void.\n') * 20


def fake_bible(folder, body):
    """A ``bible`` shell script in ``folder`` running ``body``."""
    os.makedirs(str(folder), exist_ok=True)
    path = os.path.join(str(folder), 'bible')
    with open(path, 'w') as f:
        f.write('#!/bin/sh\n' + body + '\n')
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def bible_path(tmp_path, monkeypatch):
    """PATH holds only an empty folder (no ``bible``) until a test puts a
    fake there; KJV_ROOT_ENV is unset."""
    folder = tmp_path / 'bin'
    folder.mkdir()
    monkeypatch.setenv('PATH', str(folder))
    monkeypatch.delenv(KJV_ROOT_ENV, raising=False)
    return folder


def test_reads_root_folder_env_and_file(tmp_path, bible_path, monkeypatch):
    (tmp_path / 'kjv.txt').write_text(TEXT)
    a = get_kjv(str(tmp_path))
    assert a.path == str(tmp_path / 'kjv.txt')
    assert a.vocab == ''.join(sorted(set(TEXT)))
    assert len(a.ids) == len(TEXT)
    b = get_kjv(tmp_path / 'kjv.txt')               # the file itself
    monkeypatch.setenv(KJV_ROOT_ENV, str(tmp_path))
    c = get_kjv()
    assert a.sha256 == b.sha256 == c.sha256


def test_no_root(bible_path):
    with pytest.raises(DatasetNotFoundError) as e:
        get_kjv()
    message = str(e.value)
    assert '\n' not in message
    assert KJV_ROOT_ENV in message and 'apt-get install bible-kjv' in message


def test_missing_text_and_no_command(tmp_path, bible_path):
    with pytest.raises(FileNotFoundError) as e:
        get_kjv(str(tmp_path / 'kjv'))
    message = str(e.value)
    assert isinstance(e.value, DatasetNotFoundError) and '\n' not in message
    assert 'apt-get install bible-kjv' in message
    assert str(tmp_path / 'kjv' / 'kjv.txt') in message
    assert not (tmp_path / 'kjv').exists()


def test_makes_the_text_with_bible(tmp_path, bible_path):
    source = tmp_path / 'source.txt'
    source.write_text(TEXT)
    calls = tmp_path / 'calls'
    fake_bible(bible_path, 'echo "$@" >> {}; /bin/cat {}'.format(calls,
                                                                source))
    root = tmp_path / 'new' / 'kjv'
    corpus = get_kjv(str(root))
    assert (root / 'kjv.txt').read_text() == TEXT
    assert calls.read_text() == '-f Gen1:1-Rev22:21\n'
    assert len(corpus.ids) == len(TEXT)
    assert os.listdir(str(root)) == ['kjv.txt']     # no temporary left
    again = get_kjv(str(root))                      # read, not made again
    assert calls.read_text() == '-f Gen1:1-Rev22:21\n'
    assert again.sha256 == corpus.sha256


def test_bible_gets_no_input(tmp_path, bible_path):
    # without a reference among its arguments bible reads references from
    # stdin: the loader hands it /dev/null, never the caller's stdin
    fake_bible(bible_path, 'if [ "$(/usr/bin/readlink /proc/$$/fd/0)" = '
               '/dev/null ]; then echo "Ge1:1 closed."; else echo "open"; fi')
    # the caller's stdin is a pipe here (pytest itself puts /dev/null there)
    read_end, write_end = os.pipe()
    saved = os.dup(0)
    os.dup2(read_end, 0)
    try:
        corpus = get_kjv(str(tmp_path))
    finally:
        os.dup2(saved, 0)
        for fd in (saved, read_end, write_end):
            os.close(fd)
    assert (tmp_path / 'kjv.txt').read_text() == 'Ge1:1 closed.\n'
    assert corpus.vocab_size == len(set('Ge1:1 closed.\n'))


def test_bible_fails(tmp_path, bible_path):
    fake_bible(bible_path, 'echo "no data file" >&2; exit 3')
    with pytest.raises(DatasetFormatError,
                       match=r'exited with 3 .*: no data file'):
        get_kjv(str(tmp_path))
    assert os.listdir(str(tmp_path)) == ['bin']
    fake_bible(bible_path, 'exit 0')
    with pytest.raises(DatasetFormatError, match='wrote 0 bytes'):
        get_kjv(str(tmp_path))


def test_make_false(tmp_path, bible_path):
    fake_bible(bible_path, 'echo text')
    with pytest.raises(DatasetNotFoundError, match='apt-get install'):
        get_kjv(str(tmp_path), make=False)
    assert not (tmp_path / 'kjv.txt').exists()


def test_fingerprint_checked(tmp_path, bible_path):
    (tmp_path / 'kjv.txt').write_text(TEXT)
    with pytest.raises(DatasetFormatError, match='expected ' + kjv.KJV_SHA256):
        get_kjv(str(tmp_path), sha256=kjv.KJV_SHA256)
    corpus = get_kjv(str(tmp_path))
    assert get_kjv(str(tmp_path), sha256=corpus.sha256).sha256 == \
        corpus.sha256


def test_not_utf8(tmp_path, bible_path):
    (tmp_path / 'kjv.txt').write_bytes(b'Ge1:1 \xff\n')
    with pytest.raises(DatasetFormatError, match='UTF-8 text was expected'):
        get_kjv(str(tmp_path))
