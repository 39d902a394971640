"""The King James Bible as a character-level corpus (issue 48, item 2).

The text is Debian's ``bible-kjv`` (the Authorized Version of 1611, whose
copyright the package's notice states has expired), written by ::

    bible -f Gen1:1-Rev22:21 > kjv.txt

``-f`` turns the pretty-printer off: one verse per line, each preceded by
its reference (``Ge1:1 In the beginning God created the heaven and the
earth.``), 31102 lines, 4404412 bytes of ASCII, 73 distinct characters;
bible-kjv 4.38 writes it in about 0.1 s, with SHA-256 :data:`KJV_SHA256`.

The loader never downloads. It reads ``kjv.txt`` in a folder ``root`` (an
argument, else the environment variable ``ADA_LOSS_KJV_ROOT``; ``root`` may
also name the text file itself). Where the file is missing but the
``bible`` command exists, it makes the file by running that command and
writes it atomically (:mod:`ada_loss.atomic`); where neither is there, one
line names ``apt-get install bible-kjv``. Tokens, splits and batches:
:mod:`ada_loss.datasets.char_corpus`.
"""
import os
import shutil
import subprocess

from ada_loss import atomic
from ada_loss.datasets.char_corpus import CharCorpus
from ada_loss.datasets.errors import DatasetFormatError
from ada_loss.datasets.errors import DatasetNotFoundError

#: Environment variable consulted when ``get_kjv`` gets no ``root``.
KJV_ROOT_ENV = 'ADA_LOSS_KJV_ROOT'

#: The text file's name inside ``root``.
KJV_FILE = 'kjv.txt'

#: The command that writes the text (Debian's bible-kjv).
KJV_COMMAND = ('bible', '-f', 'Gen1:1-Rev22:21')

#: SHA-256 of the text bible-kjv 4.38 writes (Debian 12).
KJV_SHA256 = ('cd45f0c9cedab8e4439bd6486c8952c77cc8b0ecc5d1f6ae3513f2039f47'
              '229d')

_INSTALL = ('install Debian\'s bible-kjv (`apt-get install bible-kjv`) and '
            'the loader writes it with `{}`; this loader never downloads'
            .format(' '.join(KJV_COMMAND)))


def kjv_path(root=None):
    """The text file ``get_kjv`` reads: ``root`` if it is a file, else
    ``root/kjv.txt``; ``root`` defaults to ``$ADA_LOSS_KJV_ROOT``."""
    if root is None:
        root = os.environ.get(KJV_ROOT_ENV)
        if not root:
            raise DatasetNotFoundError(
                'KJV text not found: no `root` was given and {} is not set; '
                'expected a folder holding {} or where it may be made -- {}.'
                .format(KJV_ROOT_ENV, KJV_FILE, _INSTALL))
    root = os.path.expanduser(os.fspath(root))
    return root if os.path.isfile(root) else os.path.join(root, KJV_FILE)


def make_kjv_text(path):
    """Writes ``path`` with the output of :data:`KJV_COMMAND` (atomically:
    a reader never sees half a file) and returns its bytes.

    Raises:
        DatasetNotFoundError: the ``bible`` command is not on ``PATH``.
        DatasetFormatError: it failed or wrote no text.
    """
    command = shutil.which(KJV_COMMAND[0])
    if command is None:
        raise DatasetNotFoundError(
            'KJV text not found: {} does not exist and there is no `{}` '
            'command to make it -- {}.'.format(path, KJV_COMMAND[0], _INSTALL))
    # stdin /dev/null: without a reference on its command line bible would
    # wait for one interactively
    done = subprocess.run((command,) + KJV_COMMAND[1:],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=600)
    if done.returncode != 0 or not done.stdout.strip():
        raise DatasetFormatError('`{}` ({}) exited with {} and wrote {} bytes '
                                 'of text: {}'.format(
                                     ' '.join(KJV_COMMAND), command,
                                     done.returncode, len(done.stdout),
                                     done.stderr.decode('utf-8', 'replace')
                                     .strip()[:200] or 'no message'))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    atomic.write_bytes(path, done.stdout)
    return done.stdout


def get_kjv(root=None, make=True, sha256=None):
    """Loads the King James Bible as a :class:`CharCorpus`.

    Args:
        root (str or os.PathLike): a folder holding ``kjv.txt`` (or where it
            may be made), or the text file itself; ``None``: the environment
            variable ``ADA_LOSS_KJV_ROOT``.
        make (bool): if the file is missing, make it with the ``bible``
            command when that exists (``False``: only read).
        sha256 (str): if given, the fingerprint the text must have (e.g.
            :data:`KJV_SHA256`); another text raises.

    Returns:
        CharCorpus: ids, vocabulary, splits (``train``, ``select``, ``val``)
        and the text's ``sha256``.

    Raises:
        DatasetNotFoundError: (a ``FileNotFoundError``) no text at ``root``
            and it could not be made.
        DatasetFormatError: (a ``ValueError``) the text is not UTF-8, has
            another fingerprint than ``sha256``, or ``bible`` failed.
    """
    path = kjv_path(root)
    if os.path.isfile(path):
        with open(path, 'rb') as f:
            data = f.read()
    elif make:
        data = make_kjv_text(path)
    else:
        raise DatasetNotFoundError('KJV text not found: {} does not exist -- '
                                   '{}.'.format(path, _INSTALL))
    try:
        corpus = CharCorpus(data, path)
    except ValueError as e:
        raise DatasetFormatError(str(e)) from None
    if sha256 is not None and corpus.sha256 != sha256:
        raise DatasetFormatError('{} has SHA-256 {}, expected {}'.format(
            path, corpus.sha256, sha256))
    return corpus
