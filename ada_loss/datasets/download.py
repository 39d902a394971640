"""One file over HTTP, kept only once its checksum is verified.

The file is written to a temporary name in its target folder, its MD5
computed as the bytes arrive, and renamed to its real name only when every
byte announced has come and the MD5 is the expected one
(:func:`ada_loss.atomic.replace_with`). A failure at any point -- no
network, a refused connection, a stalled server (no byte for ``timeout``
seconds: a socket timeout on every read), a download cut short, a wrong
checksum, no space left, Ctrl-C -- removes the temporary file and raises a
:class:`~ada_loss.datasets.errors.DatasetFetchError` with a one-line
message: a loader never finds a half-written file under a name it reads.
"""
import errno
import hashlib
import http.client
import os
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from ada_loss import atomic
from ada_loss.datasets.errors import DatasetChecksumError
from ada_loss.datasets.errors import DatasetFetchError
from ada_loss.datasets.errors import one_line

#: seconds without a byte after which a download is given up
DEFAULT_TIMEOUT = 60.0

#: the largest timeout taken, seconds (a million: 11.6 days). A socket's
#: timeout must fit the platform's time_t in microseconds (``inf`` or
#: ``1e300`` end in an OverflowError inside ``socket.settimeout``).
MAX_TIMEOUT = 1e6


def check_timeout(timeout):
    """Raises ValueError unless ``timeout`` is a number of seconds in
    (0, :data:`MAX_TIMEOUT`]."""
    if not 0 < timeout <= MAX_TIMEOUT:     # False for NaN too
        raise ValueError('the timeout must be a number of seconds above 0 '
                         'and at most {:g}, got {!r}'.format(MAX_TIMEOUT,
                                                             timeout))

_CHUNK = 1 << 20
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def md5_of(path):
    """The MD5 hex digest of a file, read in 1 MiB chunks."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(_CHUNK), b''):
            digest.update(chunk)
    return digest.hexdigest()


def verified(path, md5):
    """Whether ``path`` exists; raises DatasetChecksumError when it does
    but its MD5 is not ``md5`` (the file is kept: it may be the user's)."""
    if not os.path.isfile(path):
        return False
    got = md5_of(path)
    if got != md5:
        raise DatasetChecksumError(
            '{} is already there but its MD5 is {}, not the publisher\'s {}: '
            'a partial or different copy; remove it and fetch again'.format(
                path, got, md5))
    return True


def _mib(n):
    return '{:.1f} MiB'.format(n / 2.0 ** 20)


def _host(url):
    return urllib.parse.urlsplit(url).netloc or url


def _no_space(path, e, need=None):
    return DatasetFetchError('no space left on the device of {} while '
                             'writing {}{} ({}); free some, or fetch into '
                             'another folder (--root)'.format(
                                 os.path.dirname(path) or '.',
                                 os.path.basename(path),
                                 '' if need is None else ', ' + _mib(need),
                                 e.strerror or e))


def _open(url, timeout):
    request = urllib.request.Request(url, headers={
        'User-Agent': 'ada_loss-fetch (Python urllib)'})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise DatasetFetchError('{} answered HTTP {} {} for {}'.format(
            _host(url), e.code, e.reason, url)) from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise DatasetFetchError(
                'no answer from {} within {:g} s (stalled; try again, or name '
                'another server with --mirror)'.format(_host(url), timeout)
            ) from None
        raise DatasetFetchError(
            'cannot reach {} ({}): no network, or the server is down; '
            '--mirror URL names another server holding the same files'
            .format(url, one_line(e.reason))) from None
    except TimeoutError:
        raise DatasetFetchError(
            'no answer from {} within {:g} s (stalled; try again, or name '
            'another server with --mirror)'.format(_host(url), timeout)
        ) from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise DatasetFetchError('cannot fetch {}: {}'.format(
            url, one_line(e))) from None


def download(url, path, md5, timeout=DEFAULT_TIMEOUT, log=None):
    """Fetches ``url`` into ``path`` if its MD5 is ``md5``.

    Args:
        url (str): ``http(s)://`` or ``file://`` URL.
        path (str): where the file goes; its folder is created.
        md5 (str): the expected MD5 hex digest.
        timeout (float): seconds without a byte before giving up, above 0
            and at most :data:`MAX_TIMEOUT` (else ValueError).
        log (callable): takes one-line progress messages (``None``: quiet).

    Raises:
        DatasetFetchError: any failure (DatasetChecksumError for a wrong
            MD5); ``path`` is then as it was before the call.
    """
    log = log or (lambda text: None)
    check_timeout(timeout)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise DatasetFetchError('cannot create {}: {}; fetch into another '
                                'folder (--root)'.format(folder, e.strerror))
    response = _open(url, timeout)
    with response:
        length = response.headers.get('Content-Length')
        length = int(length) if length and length.isdigit() else None
        free = shutil.disk_usage(folder).free
        if length is not None and free < length:
            raise _no_space(path, OSError(errno.ENOSPC, 'only {} free'.format(
                _mib(free))), length)
        log('downloading {} ({})'.format(
            url, 'size unknown' if length is None else _mib(length)))
        start = time.time()
        progress = _Progress(length)

        def copy(f):
            digest = hashlib.md5(usedforsecurity=False)
            got = 0
            while True:
                chunk = response.read(_CHUNK)
                if not chunk:
                    break
                f.write(chunk)
                digest.update(chunk)
                got += len(chunk)
                progress(got)
            if length is not None and got != length:
                raise http.client.IncompleteRead(b'', length - got)
            if digest.hexdigest() != md5:
                raise DatasetChecksumError(
                    '{} from {} has MD5 {}, not the publisher\'s {}: a '
                    'corrupted or different file; it was not kept'.format(
                        os.path.basename(path), _host(url),
                        digest.hexdigest(), md5))
            return got
        try:
            atomic.replace_with(path, copy, mode='wb')
        except DatasetFetchError:
            raise
        except http.client.IncompleteRead as e:
            raise DatasetFetchError(
                'download of {} cut short: the connection to {} closed with '
                '{} still to come; nothing was kept, fetch again'.format(
                    url, _host(url), '{} bytes'.format(e.expected)
                    if e.expected else 'more')) from None
        except TimeoutError:
            raise DatasetFetchError(
                'download of {} stalled: no byte from {} for {:g} s; nothing '
                'was kept, fetch again (or name another server with '
                '--mirror)'.format(url, _host(url), timeout)) from None
        except (ConnectionError, http.client.HTTPException) as e:
            raise DatasetFetchError(
                'download of {} interrupted ({}); nothing was kept, fetch '
                'again'.format(url, e.__class__.__name__)) from None
        except OSError as e:
            if e.errno in _NO_SPACE:
                raise _no_space(path, e, length) from None
            raise DatasetFetchError('cannot write {}: {}'.format(
                path, e.strerror or e)) from None
        finally:
            progress.end()
    log('{}: MD5 verified ({} in {:.0f} s)'.format(
        path, _mib(os.path.getsize(path)), time.time() - start))
    return path


class _Progress(object):
    """A percentage on a terminal's stderr, rewritten in place (nothing
    when stderr is not a terminal: logs stay one line per event)."""

    def __init__(self, length):
        self.length = length
        self.shown = -1
        self.on = bool(length) and sys.stderr.isatty()

    def __call__(self, got):
        if self.on and got * 100 // self.length != self.shown:
            self.shown = got * 100 // self.length
            sys.stderr.write('\r  {:3d} % of {}'.format(self.shown,
                                                        _mib(self.length)))
            sys.stderr.flush()

    def end(self):
        if self.on and self.shown >= 0:
            sys.stderr.write('\n')
