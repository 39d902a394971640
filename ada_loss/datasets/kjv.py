"""The King James Version text, from Debian's ``bible-kjv`` package.

Nothing is downloaded: the text is what the package's ``bible`` program
prints for the whole book, ``bible -f Gen1:1-Rev22:21``, one verse a line
(``Ge1:1 In the beginning God created the heaven and the earth.``),
written atomically to ``<root>/kjv.txt``. The KJV has 31,102 verses; the
output is checked to hold exactly those, from Genesis 1:1 to Revelation
22:21, before it is kept (bible-kjv 4.38 prints 4,404,412 bytes, MD5
347edc0f3658f7bfc979db479f2a3dcb; another package version may format a
line differently, so the verses are what is checked).
"""
import os
import re
import shutil
import subprocess

from ada_loss import atomic
from ada_loss.datasets.errors import DatasetFetchError

KJV_FILE = 'kjv.txt'
KJV_VERSES = 31102
COMMAND = ('bible', '-f', 'Gen1:1-Rev22:21')
INSTALL = 'sudo apt-get install bible-kjv'

_VERSE = re.compile(r'^[1-3]?[A-Za-z]+\d+:\d+ ')


def check_kjv(text, where):
    """Raises DatasetFetchError unless ``text`` is the whole KJV, one verse
    a line."""
    lines = text.splitlines()
    verses = sum(1 for line in lines if _VERSE.match(line))
    if (verses != KJV_VERSES or not lines or not lines[0].startswith('Ge1:1 ')
            or not lines[-1].startswith('Rev22:21 ')):
        raise DatasetFetchError(
            '{} is not the whole KJV text: {} verse lines from {!r} to {!r}, '
            'expected {} from Ge1:1 to Rev22:21'.format(
                where, verses, lines[0][:12] if lines else '',
                lines[-1][:12] if lines else '', KJV_VERSES))


def fetch_kjv(root, timeout=120, log=None):
    """Writes ``<root>/kjv.txt`` from the ``bible`` program (kept if already
    there and whole); returns its path."""
    log = log or (lambda text: None)
    path = os.path.join(root, KJV_FILE)
    if os.path.isfile(path):
        with open(path, encoding='utf-8', errors='replace') as f:
            check_kjv(f.read(), path)
        log('{}: already there, {} verses'.format(path, KJV_VERSES))
        return path
    program = shutil.which(COMMAND[0])
    if program is None:
        raise DatasetFetchError(
            "the KJV text comes from Debian's bible-kjv package, whose "
            "`bible` program is not on PATH: install it with `{}`, then "
            'fetch kjv again (nothing is downloaded here)'.format(INSTALL))
    try:
        done = subprocess.run((program,) + COMMAND[1:], capture_output=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise DatasetFetchError('`{}` did not finish within {} s'.format(
            ' '.join(COMMAND), timeout)) from None
    if done.returncode != 0:
        raise DatasetFetchError('`{}` failed with status {}: {}'.format(
            ' '.join(COMMAND), done.returncode, ' '.join(
                done.stderr.decode(errors='replace').split())[:200]))
    text = done.stdout.decode('utf-8', errors='replace')
    check_kjv(text, 'the output of `{}`'.format(' '.join(COMMAND)))
    try:
        os.makedirs(root, exist_ok=True)
        atomic.write_bytes(path, done.stdout)
    except OSError as e:
        raise DatasetFetchError('cannot write {}: {}'.format(
            path, e.strerror or e)) from None
    log('{}: {} verses from `{}`'.format(path, KJV_VERSES, ' '.join(COMMAND)))
    return path
