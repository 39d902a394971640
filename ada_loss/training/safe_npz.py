"""Loading ``.npz`` weights and snapshots so that a file cannot run code.

Chainer 7.8.1's ``serializers.load_npz`` opens files with
``numpy.load(..., allow_pickle=True)``: an array stored with dtype
``object`` is a pickle inside the ``.npy`` member, and reading it calls
whatever the pickle names (``os.system``, ``exec``, ...). A weights file
or a snapshot is a file one downloads or copies between machines, so the
project loads every ``.npz`` through this module:

* :func:`open_npz` reads each member's ``.npy`` header first (NumPy's
  ``numpy.lib.format`` readers, which parse a literal, never a pickle) and
  refuses the file with one :class:`UnsafeNpzError` line naming the file
  and the key when any member holds Python objects; then it opens the file
  with ``allow_pickle=False``, so that NumPy refuses such a member too.
  Chainer writes ``None`` (an uninitialized parameter) as an object array:
  such a file is refused as well (initialize the model before saving).
* :class:`CheckingDeserializer` is Chainer's ``NpzDeserializer`` as a dry
  run: each value the target asks for is checked against the file (its
  key present, an array's shape equal and its dtype castable within its
  kind, a scalar a scalar), before anything is copied in; an array's
  shape and dtype, a scalar's kind and its having no axes, are checked from
  the member's header before its data are read, so a compressed member of
  another size is never decompressed (nor a member that is no ``.npy``
  array, refused by its name); a value the target asks for as None (a
  reader) has no size to check against and is read as it is.
  Chainer's own copy (``numpy.copyto``) broadcasts, so a ``(1,)`` array
  would silently fill a ``(64, 3, 3, 3)`` weight: the shape check is what
  refuses it.
* :func:`load_npz` is ``chainer.serializers.load_npz`` on top of both:
  a missing key (``strict``), a key of the file the target never asked for,
  a shape or dtype that does not fit is one :class:`NpzMismatchError` line
  naming the file and the key; only then are the arrays copied in, by
  Chainer's ``NpzDeserializer`` (the same semantics as its loader).

Trainer snapshots (:mod:`ada_loss.training.snapshot`) use the same
reader and dry run; they fall back to the previous snapshot on a mismatch
instead (``docs/reliability.md``).
"""
import os
import zipfile

import numpy
from numpy.lib import format as npy_format

import chainer


class UnsafeNpzError(ValueError):
    """An ``.npz`` file holding pickled Python objects (never unpickled)."""

    def __init__(self, file, key):
        self.file, self.key = file, key
        super(UnsafeNpzError, self).__init__(
            '{}: {} holds pickled Python objects (dtype object), which could '
            'run code when loaded: refused (weights and snapshots must hold '
            'plain numeric or text arrays)'.format(file, key))

    def __reduce__(self):   # from a --jobs worker to the parent process
        return type(self), (self.file, self.key)


class NpzMismatchError(ValueError):
    """A readable ``.npz`` that does not fit the object it is loaded into
    (``key``: the serializer key at fault; '' where none is known)."""

    def __init__(self, key, message):
        self.key = key
        super(NpzMismatchError, self).__init__(message)

    def __str__(self):
        return self.args[0]

    def __reduce__(self):   # from a --jobs worker to the parent process
        return type(self), (self.key, self.args[0])


class NpzKeyMissing(NpzMismatchError, KeyError):
    """A key the target holds is not in the file. A KeyError too, as
    Chainer's deserializer raises, so that the ``serialize`` methods that
    tolerate a key of a later version (``except KeyError``) still do."""


def _name(file):
    """How an error names ``file`` (a path or a file object)."""
    if isinstance(file, (str, os.PathLike)):
        return os.fspath(file)
    return getattr(file, 'name', None) or repr(file)


def check_members(file):
    """Raises :class:`UnsafeNpzError` if a member of the ``.npz`` ``file``
    (a path or a binary file object) holds Python objects, reading only
    the members' ``.npy`` headers; returns {member name: (shape, dtype)}
    of the members whose header it read, and {member name: None} for the
    members that are no ``.npy`` array at all (NumPy's ``NpzFile`` gives
    their bytes, decompressed whole, for a key of that name). A member
    whose header does not parse is left to NumPy's reader (which raises
    ``ValueError`` for it)."""
    headers = {}
    with zipfile.ZipFile(file) as archive:
        for info in archive.infolist():
            with archive.open(info) as member:
                # NumPy reads any member starting with the magic string as
                # an array, whatever its name ends with
                if member.read(len(npy_format.MAGIC_PREFIX)) != \
                        npy_format.MAGIC_PREFIX:
                    headers[info.filename] = None
                    continue
            with archive.open(info) as member:
                try:
                    version = npy_format.read_magic(member)
                    read = (npy_format.read_array_header_1_0
                            if version == (1, 0)
                            else npy_format.read_array_header_2_0)
                    shape, _, dtype = read(member)
                except (ValueError, EOFError, OSError, SyntaxError,
                        TypeError):
                    # version 3.0 (a UTF-8 header) or a damaged one: NumPy
                    # reads it with allow_pickle=False below
                    continue
            if dtype.hasobject:
                raise UnsafeNpzError(_name(file),
                                     info.filename.removesuffix('.npy'))
            headers[info.filename] = (tuple(shape), dtype)
    return headers


class _SafeNpz(object):
    """``numpy.load(file, allow_pickle=False)`` after :func:`check_members`;
    NumPy's refusal of an object array (a header this module could not
    read) is an :class:`UnsafeNpzError` too."""

    def __init__(self, file):
        self.name = _name(file)
        try:
            self.headers = check_members(file) or {}
        except zipfile.BadZipFile as e:     # not a ValueError: made one
            raise ValueError('{}: not a readable .npz ({})'.format(
                self.name, e)) from None
        if hasattr(file, 'seek'):
            file.seek(0)
        self.npz = numpy.load(file, allow_pickle=False)
        self._names = frozenset(self.npz.zip.namelist())

    def header(self, key):
        """``(shape, dtype)`` of member ``key`` as its header says (before
        its data are read), or None where it was not read; raises
        ValueError for a member that is no ``.npy`` array (before its
        bytes are read). ``key`` names a member as NumPy's ``NpzFile``
        does: its own name, else that name with ``.npy``."""
        member = key if key in self._names else key + '.npy'
        if member in self.headers and self.headers[member] is None:
            raise ValueError('{}: {} is not a NumPy array'.format(self.name,
                                                                 key))
        return self.headers.get(member)

    @property
    def files(self):
        return self.npz.files

    def __contains__(self, key):
        return key in self.npz

    def __iter__(self):
        return iter(self.npz)

    def __getitem__(self, key):
        try:
            value = self.npz[key]
        except ValueError as e:
            if 'allow_pickle' in str(e):
                raise UnsafeNpzError(self.name, key) from None
            raise
        if not isinstance(value, numpy.ndarray):    # a member not .npy
            raise ValueError('{}: {} is not a NumPy array'.format(self.name,
                                                                 key))
        return value

    def verify(self, key):
        """Raises ValueError (or the zip module's error) unless member
        ``key`` is intact, holding no more memory than a chunk: its bytes
        streamed through the zip module's CRC check and counted against
        the size its header declares. (``self[key]`` would hold the whole
        array: 400 MiB for a 400 KB member of zeros.) A member whose header
        was not read is read as ``self[key]`` reads it."""
        member = key if key in self._names else key + '.npy'
        header = self.header(key)
        if header is None:
            self[key]
            return
        shape, dtype = header
        with self.npz.zip.open(member) as f:
            version = npy_format.read_magic(f)
            (npy_format.read_array_header_1_0 if version == (1, 0)
             else npy_format.read_array_header_2_0)(f)
            got = 0
            for chunk in iter(lambda: f.read(1 << 20), b''):
                got += len(chunk)
        want = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
        if got != want:
            raise ValueError('{}: {} holds {} bytes of data, its header '
                             'declares {} ({})'.format(
                                 self.name, key, got, want,
                                 describe(_Header(shape, dtype))))

    def close(self):
        self.npz.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_npz(file):
    """The ``.npz`` ``file`` (a path or a binary file object) opened
    without pickles, as a context manager with NumPy's ``NpzFile``
    interface (``files``, ``in``, ``[key]``).

    Raises:
        UnsafeNpzError: a member holds Python objects.
        OSError, ValueError, zipfile.BadZipFile: not a readable ``.npz``.
    """
    return _SafeNpz(file)


def describe(array):
    """``'float32 of shape (3, 4)'``."""
    return '{} of shape {}'.format(array.dtype, array.shape)


def _expected_kinds(value):
    """The NumPy dtype kinds a stored value for ``value`` may have."""
    if isinstance(value, (str, bytes)):
        return 'SU'
    if isinstance(value, (bool, numpy.bool_)):
        return 'b'
    if isinstance(value, (int, numpy.integer)):
        return 'biu'
    if isinstance(value, (float, numpy.floating)):
        return 'biuf'
    if hasattr(value, 'dtype'):
        return {'b': 'b', 'i': 'biu', 'u': 'biu', 'f': 'biuf',
                'c': 'biufc'}.get(value.dtype.kind, value.dtype.kind)
    return 'biufcSU'     # None or another type: any plain array


class CheckingDeserializer(chainer.serializers.NpzDeserializer):
    """A dry run of Chainer's NPZ deserializer: each value the target asks
    for is checked against the file (raises :class:`NpzMismatchError` or
    :class:`NpzKeyMissing`, whose messages name the key, not the file). An
    array is given back as it is, not overwritten; a scalar or text (which
    Chainer returns, converted) and a value asked for as None (a reader:
    the random streams' state, optimizer state before the first update, an
    uninitialized parameter) get the stored value, as from Chainer's. With
    ``strict`` False a key the file lacks is skipped, as by Chainer's.
    ``asked`` collects every key asked for (shared by the children);
    ``holder`` names the target in the messages (e.g. 'trainer')."""

    def __init__(self, npz, path='', strict=True, asked=None,
                 holder='target'):
        super(CheckingDeserializer, self).__init__(npz, path, strict)
        self.asked = set() if asked is None else asked
        self.holder = holder

    def __getitem__(self, key):
        return CheckingDeserializer(self.npz, self.path + key.strip('/') +
                                    '/', self.strict, self.asked, self.holder)

    def __call__(self, key, value):
        full = self.path + key.lstrip('/')
        self.asked.add(full)
        if full not in self.npz:
            if not self.strict:
                return value
            raise NpzKeyMissing(full, 'lacks {} (the {} holds it)'.format(
                full, self.holder))
        header = getattr(self.npz, 'header', lambda key: None)(full)
        if header is not None and value is not None:
            # from the header, before the data are read (decompressed): a
            # member of another size is never loaded
            self._check_stored(full, _Header(*header), value)
        stored = self.npz[full]
        self._check_stored(full, stored, value)
        if value is None:
            return numpy.array(stored)
        if isinstance(value, numpy.ndarray) or hasattr(value, 'device'):
            return value        # checked above; the real load copies it in
        try:    # a scalar or text: Chainer's conversion, which returns it
            return super(CheckingDeserializer, self).__call__(key, value)
        except (TypeError, ValueError, OverflowError) as e:
            raise NpzMismatchError(full, '{} is {}, which does not fit a {} '
                                   '({})'.format(full, describe(stored),
                                                 type(value).__name__, e))


    @classmethod
    def _check_stored(cls, full, stored, value):
        """``stored`` (an array or a header) fits ``value``: its kind one
        of ``value``'s, an array's shape and dtype, a scalar's no axes."""
        if stored.dtype.kind not in _expected_kinds(value):
            raise NpzMismatchError(full, '{} is {}, expected {}'.format(
                full, describe(stored), describe(value) if hasattr(
                    value, 'dtype') else 'a ' + type(value).__name__))
        if isinstance(value, numpy.ndarray) or hasattr(value, 'device'):
            cls._check_array(full, stored, value)
        elif value is not None and len(stored.shape) != 0:
            raise NpzMismatchError(
                full, '{} is {}, expected a scalar ({})'.format(
                    full, describe(stored), type(value).__name__))

    @staticmethod
    def _check_array(full, stored, value):
        """``stored`` (an array or a header) fits the array ``value``."""
        if stored.dtype.kind not in _expected_kinds(value) or \
                stored.shape != value.shape or not numpy.can_cast(
                    stored.dtype, value.dtype, 'same_kind'):
            raise NpzMismatchError(full, '{} is {}, expected {}'.format(
                full, describe(stored), describe(value)))


class _Header(object):
    """A member's shape and dtype as its ``.npy`` header says."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def load_npz(file, obj, path='', strict=True):
    """Loads the ``.npz`` ``file`` into ``obj`` as
    ``chainer.serializers.load_npz(file, obj, path, strict)`` does, but
    without pickles and after checking every value (module docstring).

    Args:
        file: a path or a binary file object.
        obj: what to load into (a link, an optimizer, a trainer, ...).
        path (str): the prefix of ``obj``'s keys in the file (e.g.
            ``'updater/model:main/'`` for a model inside a trainer
            snapshot).
        strict (bool): whether a key ``obj`` holds must be in the file
            (False: partial weights, e.g. a pretrained backbone; the
            other values keep their initialization, but at least one must
            load). Keys of the file under ``path`` that ``obj`` does not
            hold are an error either way: a file of another model.

    Raises:
        UnsafeNpzError: the file holds pickled objects (nothing is read
            from it).
        NpzMismatchError: a key missing or unexpected, a shape or dtype that
            does not fit (nothing is copied into ``obj``'s arrays).
    """
    name = _name(file)
    with open_npz(file) as npz:
        dry = CheckingDeserializer(npz, path, strict,
                                   holder=type(obj).__name__)
        try:
            dry.load(obj)
        except NpzMismatchError as e:
            raise type(e)(e.key, '{}: {}'.format(name, e)) from None
        under = [k for k in npz.files if k.startswith(path)]
        extra = sorted(set(under) - dry.asked)
        if extra:
            raise NpzMismatchError(extra[0], '{}: holds {} that the {} does '
                                   'not ({} such key{})'.format(
                                       name, extra[0], type(obj).__name__,
                                       len(extra),
                                       '' if len(extra) == 1 else 's'))
        if not strict and not dry.asked & set(under):
            raise NpzMismatchError('', '{}: none of its keys{} is a value of '
                                   'the {}'.format(
                                       name, ' under ' + path if path else '',
                                       type(obj).__name__))
        chainer.serializers.NpzDeserializer(npz, path, strict).load(obj)
