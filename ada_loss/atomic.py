"""Files that a kill at any moment cannot leave half-written.

Each writer puts the new content into a temporary file in the target's own
folder (same file system, so the rename is atomic), flushes it to disk and
``os.replace``-s the target: a reader sees the old file or the new one,
never a mixture.
"""
import os
import tempfile


def _umask():
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def replace_with(path, write, mode='w', sync=True):
    """Writes ``path`` atomically: ``write(f)`` fills a temporary file
    opened with ``mode``, which then replaces ``path``. The temporary file
    is removed if ``write`` raises."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp_' +
                               os.path.basename(path) + '.')
    try:
        with os.fdopen(fd, mode, **({} if 'b' in mode else
                                    {'newline': ''})) as f:
            write(f)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())    # mkstemp makes it 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text(path, text, sync=True):
    """``path`` now holds ``text`` (UTF-8), replaced atomically."""
    replace_with(path, lambda f: f.write(text), sync=sync)


def write_bytes(path, data, sync=True):
    """``path`` now holds ``data``, replaced atomically."""
    replace_with(path, lambda f: f.write(data), mode='wb', sync=sync)
