"""Exceptions raised by the dataset loaders and by the fetcher.

Each subclasses the built-in exception a caller would naturally catch, so
``except FileNotFoundError`` / ``except ValueError`` / ``except OSError``
keep working. Every message is one line: the command line prints it as its
one ``error:`` line (docs/reliability.md). Messages are written as one
line; what they quote from elsewhere goes through :func:`one_line`, and a
line break that still gets in (a folder name holding one, say) is shown
escaped, ``\\n``.
"""


def one_line(text):
    """``text`` (e.g. another library's multi-line message) with every run
    of white space, line breaks included, made one space."""
    return ' '.join(str(text).split())


#: the characters ``str.splitlines`` breaks a line at
_LINE_BREAKS = '\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029'


class _OneLine(object):
    """Shows line breaks in the message escaped (``\\n``, ``\\x85``,
    ...: every character ``str.splitlines`` breaks at)."""

    def __str__(self):
        text = super(_OneLine, self).__str__()
        return ''.join(c.encode('unicode_escape').decode('ascii')
                       if c in _LINE_BREAKS else c for c in text)


class DatasetNotFoundError(_OneLine, FileNotFoundError):
    """The data files are not where the loader looked.

    The message names the files and layout that were expected and how to
    obtain them; the loaders never download anything themselves
    (:mod:`ada_loss.datasets.fetch` does, when asked).
    """


class DatasetFormatError(_OneLine, ValueError):
    """A data file exists but is not in the expected format."""


class DatasetFetchError(_OneLine, OSError):
    """Fetching a dataset failed: no network, a refused or stalled
    connection, a download cut short, no space left, an unwritable folder,
    or a dataset that cannot be fetched (ImageNet, the KJV text without
    its Debian package). Nothing a loader would take for data is left
    behind."""


class DatasetChecksumError(DatasetFetchError):
    """A file's checksum is not the publisher's: a corrupted or
    substituted download (removed), or a file already there that differs
    (kept, and named)."""
