"""Pickles read without running code: an opcode-level reader that builds only
the arrays, lists, dicts, text and numbers a data file of plain arrays holds.

``pickle.load`` calls whatever callable a file names (``os.system`` as
readily as ``numpy.dtype``), and even NumPy's own callables do harm with
arguments of the file's choosing (issue 50): ``dtype.__setstate__`` accepts
any flags, fields and sub-array (an object field over the file's bytes is a
pointer NumPy dereferences when it frees the array: a SIGSEGV),
``numpy.ndarray`` any buffer and strides, ``_codecs.encode`` any codec. So
nothing of the file is handed to ``pickle`` or to a NumPy constructor.
:func:`load` / :func:`loads` make three passes, the first two over
:func:`pickletools.genops`:

1. **Validation, before anything is built.** The file is at most
   :data:`MAX_FILE_BYTES`; it has at most :data:`MAX_OPCODES` opcodes, each
   in :data:`OPCODES` (no ``POP``, ``DUP``, sets, extension codes,
   persistent ids, ``INST``/``OBJ``/``NEWOBJ`` or out-of-band buffers);
   every string or bytes argument is at most :data:`MAX_ARRAY_BYTES`, every
   integer at most :data:`MAX_INT_BITS` bits; every memo index is stored
   before it is fetched; every global is in :data:`ALLOWED`, ``STACK_GLOBAL``
   included (its two names must be text constants of the file itself).
2. **Building, by a reader that knows only these objects.** Python values
   (``None``, bools, ints, floats, text, bytes, tuples, lists, dicts with
   text keys) are built as ``pickle`` builds them. The globals are never
   called: each stands for one construction done here from checked pieces,
   as NumPy 1 (Python 2 and 3) and NumPy 2 pickle arrays and scalars of
   plain dtypes at protocols 0-5:

   * ``numpy.dtype(descr, 0/False, 1/True)``, ``descr`` one of ``b1``,
     ``i1 i2 i4 i8``, ``u1 u2 u4 u8``, ``f2 f4 f8``, ``S<n>``, ``U<n>``
     (no object, structured, complex, datetime or long double): the dtype
     is ``numpy.dtype(descr)``; its ``BUILD`` state is compared, not
     applied: it must equal, value for value, the state NumPy writes for
     that dtype in one byte order (flags, fields, sub-array and sizes
     included), which only chooses the byte order;
   * ``numpy.core.multiarray._reconstruct(numpy.ndarray, (0,), 'b')`` and
     its ``BUILD`` state ``(1, shape, dtype, is_fortran, raw)``: a new C- or
     Fortran-contiguous array owning a copy of ``raw``, whose length must be
     exactly ``prod(shape) * itemsize``, in the machine's byte order as
     ``ndarray.__setstate__`` gives it;
   * ``numpy.core.numeric._frombuffer(bytes, dtype, shape, 'C'/'F')``
     (protocol 5, buffers in band; the file's byte order kept, as NumPy
     does) and ``numpy.core.multiarray.scalar(dtype, raw)`` (a NumPy
     scalar, ``raw`` exactly one item), checked the same way;
   * ``_codecs.encode(text, 'latin1')`` (how Python 3 pickles ``bytes`` at
     protocols 0-2; no other codec) and ``bytes()`` (an empty ``bytes``);

   each under both module spellings (``numpy.core`` and ``numpy._core``).
   ``numpy.ndarray`` itself is never called (it is admitted only as
   ``_reconstruct``'s first argument). Everything the reader builds from
   payload (``encode``'s bytes, array and scalar buffers) totals at most
   :func:`payload_bound` of the file's size (two bytes per byte plus
   1 MiB), so memo references cannot multiply a payload.
3. **The result is measured as a consumer walking it would meet it**, each
   memo reference counted in full but every object visited once (linear,
   however it is shared; the walk holds its path and a record of each
   container fetched from the memo, the only ones met twice): at most :data:`MAX_ELEMENTS` objects, payload
   (text, bytes, array bytes) within :func:`payload_bound`, nesting at most
   :data:`MAX_DEPTH`, no cycle, and only the plain types above (no dtype,
   no array whose state was never set).

Why the four holes of issue 50 cannot exist here: no NumPy ``__setstate__``
or constructor sees the file's values, so no dtype carries the REFCOUNT
flag, an object field or an object sub-array, and every array is a fresh
base-class ndarray of a plain dtype owning exactly its bytes; no codec but
``latin1`` runs and no payload is built twice over; ``numpy.ndarray`` is
never called; a memo fan-out is counted, not walked.

Cost: linear in the file. The worst 1 MiB files (one-byte opcodes each
building an empty dict or list, a mark, a nesting level) take up to 10 s
and 72 MiB (traced) on the shared 2-core development machine (load ~10). A CIFAR-10
batch as Python 2 wrote it (31 MB) reads in 0.3 s with a traced peak of 3x
its size beyond the file itself (``genops``' copy of the pixels as text,
their bytes, the array's own copy; ``pickle.loads``: 2x in 0.02 s).

Every refusal is an :class:`UnsafePickleError` (a
:class:`~ada_loss.datasets.errors.DatasetFormatError`) naming what the file
asked for; a truncated or corrupted file is a ``DatasetFormatError``.
"""
import io
import pickletools
import re

import numpy

from ada_loss.datasets.errors import DatasetFormatError

_MiB = 2 ** 20

#: files larger than this are refused unread (CIFAR-100's ``train``, the
#: largest official file, is about 155 MB: 153.6 MB of pixels, its labels
#: and file names; re-pickled by Python 3 at protocol 2 its pixels are
#: UTF-8 text, up to 2 bytes each: ~240 MB)
MAX_FILE_BYTES = 384 * _MiB
#: the largest array (and string or bytes argument): CIFAR-100's ``train``
#: data is 50,000 x 3,072 bytes = 146.5 MiB
MAX_ARRAY_BYTES = 192 * _MiB
#: opcodes per file (CIFAR-100's ``train`` as Python 2 wrote it: about
#: 200,000, four per row; re-pickled by Python 3 at protocol 2 with its
#: labels as NumPy scalars: 30 per row, 1.5 million)
MAX_OPCODES = 4000000
#: objects of the result, each memo reference counted in full (CIFAR-100's
#: ``train``: 150,000 list items)
MAX_ELEMENTS = 1000000
#: nesting of containers in the result
MAX_DEPTH = 32
#: integers (labels, shapes) in bits, sign excluded
MAX_INT_BITS = 64
#: payload built (and reached in the result) per byte of file: encode's
#: bytes then the array's own copy of them are two bytes per byte of file
PAYLOAD_PER_FILE_BYTE = 2
#: ... plus this (repeated references to short texts, e.g. shared names)
PAYLOAD_SLACK = 1 * _MiB

#: the opcodes a data file of plain values and arrays needs (protocols 0-5)
OPCODES = frozenset((
    'PROTO', 'FRAME', 'STOP', 'MARK',
    'NONE', 'NEWTRUE', 'NEWFALSE',
    'INT', 'BININT', 'BININT1', 'BININT2', 'LONG', 'LONG1', 'LONG4',
    'FLOAT', 'BINFLOAT',
    'STRING', 'BINSTRING', 'SHORT_BINSTRING',
    'BINBYTES', 'SHORT_BINBYTES', 'BINBYTES8', 'BYTEARRAY8',
    'UNICODE', 'BINUNICODE', 'SHORT_BINUNICODE', 'BINUNICODE8',
    'EMPTY_TUPLE', 'TUPLE', 'TUPLE1', 'TUPLE2', 'TUPLE3',
    'EMPTY_LIST', 'LIST', 'APPEND', 'APPENDS',
    'EMPTY_DICT', 'DICT', 'SETITEM', 'SETITEMS',
    'PUT', 'BINPUT', 'LONG_BINPUT', 'MEMOIZE', 'GET', 'BINGET', 'LONG_BINGET',
    'GLOBAL', 'STACK_GLOBAL', 'REDUCE', 'BUILD'))

#: (module, name) -> the construction it stands for, every spelling NumPy 1
#: and 2 and Python 2 and 3 write
ALLOWED = {('numpy', 'ndarray'): 'ndarray', ('numpy', 'dtype'): 'dtype',
           ('_codecs', 'encode'): 'encode',
           ('__builtin__', 'bytes'): 'bytes', ('builtins', 'bytes'): 'bytes'}
for _module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
    ALLOWED[(_module, '_reconstruct')] = '_reconstruct'
    ALLOWED[(_module, 'scalar')] = 'scalar'
for _module in ('numpy.core.numeric', 'numpy._core.numeric'):
    ALLOWED[(_module, '_frombuffer')] = '_frombuffer'

#: array dtype kinds a data file may hold: bool, integers, floats, text
PLAIN_KINDS = 'biufSU'
#: ``numpy.dtype`` descriptions of these kinds, as NumPy pickles them (the
#: byte order is in the state); text lengths bounded by MAX_ARRAY_BYTES
_DESCR = re.compile(r'(b1|[iu][1248]|f[248]|[SU][0-9]{1,9})\Z')
_KIND_NAMES = {'O': 'object', 'V': 'void (structured)', 'M': 'datetime',
               'm': 'timedelta', 'c': 'complex', 'f': 'float', 'i': 'int',
               'u': 'uint', 'b': 'bool', 'S': 'bytes', 'U': 'str',
               'a': 'bytes'}
_LEAVES = (str, bytes, int, float, bool, type(None))

# what pass 1 checks of each admitted opcode
_OTHER, _TEXT, _BYTES, _NUMBER, _PUT, _GET, _GLOBAL, _NEUTRAL = range(8)
_KIND = dict.fromkeys(OPCODES, _OTHER)
_KIND.update(dict.fromkeys(('UNICODE', 'BINUNICODE', 'SHORT_BINUNICODE',
                            'BINUNICODE8'), _TEXT))
_KIND.update(dict.fromkeys(('STRING', 'BINSTRING', 'SHORT_BINSTRING',
                            'BINBYTES', 'SHORT_BINBYTES', 'BINBYTES8',
                            'BYTEARRAY8'), _BYTES))
_KIND.update(dict.fromkeys(('INT', 'BININT', 'BININT1', 'BININT2', 'LONG',
                            'LONG1', 'LONG4', 'FLOAT', 'BINFLOAT'), _NUMBER))
_KIND.update(dict.fromkeys(('PUT', 'BINPUT', 'LONG_BINPUT', 'MEMOIZE'), _PUT))
_KIND.update(dict.fromkeys(('GET', 'BINGET', 'LONG_BINGET'), _GET))
_KIND.update(dict.fromkeys(('GLOBAL', 'STACK_GLOBAL'), _GLOBAL))
_KIND.update(dict.fromkeys(('PROTO', 'FRAME'), _NEUTRAL))


class UnsafePickleError(DatasetFormatError):
    """A pickle asks for something a data file of plain arrays does not
    hold (a global, an opcode, a dtype, a size beyond the bounds); it was
    refused before any of it ran."""


def _short(value):
    """``value`` for a one-line message: the repr of a number, of the start
    of a text or of a short tuple of these, else its type (never the repr
    of a container of the file's: a memo fan-out would make it endless)."""
    kind = type(value)
    if kind in (str, bytes, bytearray):
        text = repr(value[:40])
    elif kind in (int, float, bool, type(None)):
        text = repr(value)
    elif kind is tuple and len(value) <= 8 and all(
            type(v) in (str, bytes, int, float, bool, type(None))
            for v in value):
        text = '({})'.format(', '.join(_short(v) for v in value))
    else:
        return 'a ' + kind.__name__
    return text if len(text) <= 60 else text[:57] + '...'


def _said(text):
    """A name as the file wrote it, escaped to one line and shortened."""
    text = text.encode('unicode_escape').decode('ascii')
    return text if len(text) <= 60 else text[:57] + '...'


def payload_bound(file_bytes):
    """The payload bytes a file of ``file_bytes`` may build (and its result
    reach): :data:`PAYLOAD_PER_FILE_BYTE` per byte plus
    :data:`PAYLOAD_SLACK`."""
    return PAYLOAD_PER_FILE_BYTE * file_bytes + PAYLOAD_SLACK


# -- pass 1: the opcode stream, before anything is built ----------------------
def _opcodes(data):
    """:func:`pickletools.genops` of ``data``, with a stream it cannot read
    as one DatasetFormatError."""
    ops = pickletools.genops(io.BytesIO(data))
    pos = 0
    while True:
        try:
            op, arg, pos = next(ops)
        except StopIteration:
            return
        except Exception as e:
            # genops raises ValueError and its subclasses for a truncated
            # or corrupted stream, with texts about its own internals
            raise DatasetFormatError(
                'not a readable pickle (truncated or corrupted after byte '
                '{})'.format(pos)) from e
        yield op, arg, pos


def _global(module, name):
    role = ALLOWED.get((module, name))
    if role is None:
        raise UnsafePickleError(
            'refers to {}.{}, which a data file does not hold (allowed: '
            'NumPy arrays and scalars of plain dtypes, dicts, lists, text, '
            'numbers); not loaded'.format(_said(module), _said(name)))
    return role


def validate(data):
    """Pass 1: raises UnsafePickleError unless every opcode, argument,
    memo index and global of the pickle ``data`` is admitted (module
    docstring); builds nothing. Returns one more than the largest memo
    index stored (the memo's size)."""
    if len(data) > MAX_FILE_BYTES:
        raise UnsafePickleError('is {} bytes, larger than a data file of '
                                'this kind (at most {})'.format(
                                    len(data), MAX_FILE_BYTES))
    count = 0
    # memo indices stored so far, one bit each: an index is at most the
    # opcodes so far (pickle numbers them in order), so at most the bytes
    stored = bytearray(len(data) // 8 + 1)
    n_stored = 0
    memo_size = 0
    # memo index -> the text constant stored there, or None: a list (8
    # bytes a slot, an index is less than the opcodes so far), not a dict
    # of int keys (a dict entry and an int per MEMOIZE byte: 77 bytes a
    # byte of file)
    texts = []
    # the values the last two stack-changing opcodes pushed, if they were
    # text constants (None: anything else): STACK_GLOBAL's two names
    last = before = None
    for op, arg, pos in _opcodes(data):
        count += 1
        if count > MAX_OPCODES:
            raise UnsafePickleError('has more than {} opcodes'.format(
                MAX_OPCODES))
        kind = _KIND.get(op.name)
        if kind is None:
            raise UnsafePickleError(
                'uses the pickle opcode {} at byte {}, which a data file of '
                'plain arrays does not need'.format(op.name, pos))
        if kind == _OTHER:
            last = before = None
        elif kind == _TEXT or kind == _BYTES:
            if len(arg) > MAX_ARRAY_BYTES:
                raise UnsafePickleError(
                    'holds a {} of {} characters at byte {} (at most {})'
                    .format(type(arg).__name__, len(arg), pos,
                            MAX_ARRAY_BYTES))
            before, last = last, (arg if kind == _TEXT else None)
        elif kind == _NUMBER:
            if type(arg) is int and arg.bit_length() > MAX_INT_BITS:
                raise UnsafePickleError(
                    'holds a {}-bit integer at byte {} (at most {} bits)'
                    .format(arg.bit_length(), pos, MAX_INT_BITS))
            last = before = None
        elif kind == _PUT:
            index = n_stored if arg is None else arg     # MEMOIZE
            if not 0 <= index < count:
                raise UnsafePickleError('stores memo entry {} at byte {}'
                                        .format(_short(index), pos))
            bit = 1 << (index & 7)
            if not stored[index >> 3] & bit:
                stored[index >> 3] |= bit
                n_stored += 1
                memo_size = max(memo_size, index + 1)
            if last is not None and index >= len(texts):
                texts.extend([None] * (index + 1 - len(texts)))
            if index < len(texts):
                texts[index] = last
        elif kind == _GET:
            if not (0 <= arg < count
                    and stored[arg >> 3] & (1 << (arg & 7))):
                raise DatasetFormatError(
                    'not a readable pickle (fetches memo entry {} at byte {}, '
                    'never stored)'.format(_short(arg), pos))
            before, last = last, (texts[arg] if arg < len(texts) else None)
        elif kind == _GLOBAL:
            if arg is None:
                # STACK_GLOBAL: the two names must be the file's own text
                # constants pushed just before (as pickle writes them),
                # not values it computes
                if last is None or before is None:
                    raise UnsafePickleError(
                        'names a global at byte {} by values it computes'
                        .format(pos))
                _global(before, last)
            else:
                module, _, attr = arg.partition(' ')
                _global(module, attr)
            last = before = None
        elif op.name == 'PROTO' and arg > 5:
            raise DatasetFormatError('not a readable pickle (protocol {})'
                                     .format(arg))
    return memo_size


# -- pass 2: a reader that builds only plain values and arrays ----------------
class _Global(object):
    """An admitted global: stands for one construction of :class:`_Reader`,
    never called."""
    __slots__ = ('role', 'spelling')

    def __init__(self, role, spelling):
        self.role = role
        self.spelling = spelling


class _Dtype(object):
    """``numpy.dtype(descr)`` of a checked ``descr``; ``BUILD`` may choose
    its byte order by a state equal to the one NumPy writes."""
    __slots__ = ('dtype', 'built')

    def __init__(self, dtype):
        self.dtype = dtype
        self.built = False


class _Array(object):
    """``_reconstruct``'s result until ``BUILD`` gives it shape, dtype and
    bytes."""
    __slots__ = ('array',)

    def __init__(self):
        self.array = None


#: a memo slot never stored
_UNSET = object()


def _check_code_points(dtype, raw):
    """Text (``U``) items hold UCS-4 code points up to U+10FFFF: NumPy
    fails on others when it makes a ``str`` of them (``SystemError``)."""
    if dtype.kind == 'U' and len(raw):
        order = '>' if dtype.byteorder == '>' else '<' if (
            dtype.byteorder == '<') else '='
        codes = numpy.frombuffer(raw, order + 'u4')
        if int(codes.max()) > 0x10FFFF:
            raise UnsafePickleError('holds {} text with a code point above '
                                    'U+10FFFF'.format(dtype))


def _is_int(value):
    return type(value) is int or type(value) is bool


def _is(value, kind, *options):
    """``value`` is of type ``kind`` (and one of ``options``, if any):
    types first, so that no array of the file's is compared with ``==``."""
    return type(value) is kind and (not options or value in options)


class _Reader(object):

    def __init__(self, data, encoding, memo_size):
        self.data = data
        self.memo_size = memo_size      # validate(): every index is less
        self.encoding = encoding
        self.budget = payload_bound(len(data))
        self.globals = {key: _Global(role, '{}.{}'.format(*key))
                        for key, role in ALLOWED.items()}

    # ---- payload
    def spend(self, n, what):
        if n > self.budget:
            raise UnsafePickleError(
                'builds more than {} bytes of payload ({}) from a {}-byte '
                'file'.format(payload_bound(len(self.data)), what,
                              len(self.data)))
        self.budget -= n

    def text(self, value):
        """A Python 2 ``str`` as ``pickle`` reads it (genops gives it
        decoded as latin1)."""
        if self.encoding == 'latin1':   # as genops gives it: no copies
            return value
        raw = value.encode('latin-1')
        if self.encoding == 'bytes':
            return raw
        try:
            return raw.decode(self.encoding)
        except (UnicodeDecodeError, LookupError) as e:
            raise DatasetFormatError('holds a Python 2 string that is not {} '
                                     'text'.format(self.encoding)) from e

    def raw(self, value, what):
        """Array or scalar bytes: bytes, or Python 2's str read as text."""
        if type(value) is str:
            try:
                value = value.encode('latin-1')
            except UnicodeEncodeError as e:
                raise UnsafePickleError('gives {} as text beyond latin1, not '
                                        'bytes'.format(what)) from e
            self.spend(len(value), what)
        if type(value) not in (bytes, bytearray):
            raise UnsafePickleError('gives {} as a {}, expected bytes'.format(
                what, type(value).__name__))
        return value

    # ---- the loop: one method per opcode, on self.stack / marks / memo
    def read(self):
        self.stack = []
        self.marks = []
        # the memo as a list: its indices were checked (each stored before
        # fetched, less than memo_size); no dict of int keys
        self.memo = [_UNSET] * self.memo_size
        self.memo_len = 0
        # ids of the containers fetched from the memo: the only ones a
        # pickle of these opcodes (no DUP) puts in the result twice
        self.shared = set()
        ops = self._OPS
        for op, arg, pos in _opcodes(self.data):
            name = op.name
            try:
                result = ops[name](self, arg, pos)
            except (IndexError, KeyError) as e:
                raise DatasetFormatError(
                    'not a readable pickle (opcode {} at byte {} finds no '
                    'value or mark it needs)'.format(name, pos)) from e
            if result is not None:
                return result[0]
        raise DatasetFormatError('not a readable pickle (no STOP)')

    def push(self, arg, pos):
        self.stack.append(arg)

    def push_text(self, arg, pos):
        self.stack.append(self.text(arg))

    def push_none(self, arg, pos):
        self.stack.append(None)

    def push_true(self, arg, pos):
        self.stack.append(True)

    def push_false(self, arg, pos):
        self.stack.append(False)

    def push_empty_tuple(self, arg, pos):
        self.stack.append(())

    def push_empty_list(self, arg, pos):
        self.stack.append([])

    def push_empty_dict(self, arg, pos):
        self.stack.append({})

    def mark(self, arg, pos):
        self.marks.append(self.stack)
        self.stack = []

    def pop_mark(self):
        items = self.stack
        self.stack = self.marks.pop()
        return items

    def tuple_n(self, n):
        stack = self.stack
        if len(stack) < n:
            raise IndexError(n)
        items = tuple(stack[len(stack) - n:])
        del stack[len(stack) - n:]
        stack.append(items)

    def tuple1(self, arg, pos):
        self.tuple_n(1)

    def tuple2(self, arg, pos):
        self.tuple_n(2)

    def tuple3(self, arg, pos):
        self.tuple_n(3)

    def tuple_mark(self, arg, pos):
        items = tuple(self.pop_mark())
        self.stack.append(items)

    def list_mark(self, arg, pos):
        items = self.pop_mark()
        self.stack.append(items)

    def dict_mark(self, arg, pos):
        items = self.pop_mark()
        d = {}
        self.set_items(d, items, pos)
        self.stack.append(d)

    def append(self, arg, pos):
        value = self.stack.pop()
        self.extend([value], pos)

    def appends(self, arg, pos):
        self.extend(self.pop_mark(), pos)

    def extend(self, items, pos):
        target = self.stack[-1]
        if type(target) is not list:
            raise UnsafePickleError('appends to {} at byte {}'.format(
                _target_name(target), pos))
        target.extend(items)

    def setitem(self, arg, pos):
        stack = self.stack
        if len(stack) < 3:
            raise IndexError(3)
        items = stack[-2:]
        del stack[-2:]
        self.set_items_of_top(items, pos)

    def setitems(self, arg, pos):
        self.set_items_of_top(self.pop_mark(), pos)

    def set_items_of_top(self, items, pos):
        target = self.stack[-1]
        if type(target) is not dict:
            raise UnsafePickleError('sets items of {} at byte {}'.format(
                _target_name(target), pos))
        self.set_items(target, items, pos)

    def put(self, arg, pos):
        value = self.stack[-1]
        index = self.memo_len if arg is None else arg
        if self.memo[index] is _UNSET:
            self.memo_len += 1
        self.memo[index] = value

    def get(self, arg, pos):
        value = self.memo[arg]
        if value is _UNSET:
            raise KeyError(arg)
        if type(value) is _Array and value.array is not None:
            value = value.array
        elif type(value) in (list, dict, tuple):
            self.shared.add(id(value))
        self.stack.append(value)

    def global_(self, arg, pos):
        module, _, attr = arg.partition(' ')
        _global(module, attr)
        self.stack.append(self.globals[(module, attr)])

    def stack_global(self, arg, pos):
        attr = self.stack.pop()
        module = self.stack.pop()
        if type(module) is not str or type(attr) is not str:
            raise UnsafePickleError('names a global by a {} and a {}'.format(
                type(module).__name__, type(attr).__name__))
        _global(module, attr)
        self.stack.append(self.globals[(module, attr)])

    def reduce(self, arg, pos):
        args = self.stack.pop()
        self.stack[-1] = self.call(self.stack[-1], args, pos)

    def build_(self, arg, pos):
        state = self.stack.pop()
        self.stack[-1] = self.build(self.stack[-1], state, pos)

    def nothing(self, arg, pos):
        pass

    def stop(self, arg, pos):
        if self.marks or len(self.stack) != 1:
            raise DatasetFormatError(
                'not a readable pickle (it stops with {} values and {} marks '
                'left at byte {})'.format(len(self.stack), len(self.marks),
                                          pos))
        return self.stack

    _OPS = dict.fromkeys(('INT', 'BININT', 'BININT1', 'BININT2', 'LONG',
                          'LONG1', 'LONG4', 'FLOAT', 'BINFLOAT', 'UNICODE',
                          'BINUNICODE', 'SHORT_BINUNICODE', 'BINUNICODE8',
                          'BINBYTES', 'SHORT_BINBYTES', 'BINBYTES8',
                          'BYTEARRAY8'), push)
    _OPS.update(dict.fromkeys(('STRING', 'BINSTRING', 'SHORT_BINSTRING'),
                              push_text))
    _OPS.update(dict.fromkeys(('PUT', 'BINPUT', 'LONG_BINPUT', 'MEMOIZE'),
                              put))
    _OPS.update(dict.fromkeys(('GET', 'BINGET', 'LONG_BINGET'), get))
    _OPS.update(PROTO=nothing, FRAME=nothing, STOP=stop, MARK=mark,
                NONE=push_none, NEWTRUE=push_true, NEWFALSE=push_false,
                EMPTY_TUPLE=push_empty_tuple, TUPLE1=tuple1, TUPLE2=tuple2,
                TUPLE3=tuple3, TUPLE=tuple_mark, EMPTY_LIST=push_empty_list,
                LIST=list_mark, APPEND=append, APPENDS=appends,
                EMPTY_DICT=push_empty_dict, DICT=dict_mark, SETITEM=setitem,
                SETITEMS=setitems, GLOBAL=global_, STACK_GLOBAL=stack_global,
                REDUCE=reduce, BUILD=build_)
    assert set(_OPS) == OPCODES

    def set_items(self, target, items, pos):
        if len(items) % 2:
            raise DatasetFormatError('not a readable pickle (an odd number '
                                     'of keys and values at byte {})'.format(
                                         pos))
        for i in range(0, len(items), 2):
            key = items[i]
            if type(key) not in (str, bytes):
                # text keys only: hashing a list fails, and crafted ints
                # could collide in a dict's table
                raise UnsafePickleError('holds a dict key of type {} at byte '
                                        '{}, expected text'.format(
                                            type(key).__name__, pos))
            target[key] = items[i + 1]

    # ---- REDUCE: the globals' constructions
    def call(self, func, args, pos):
        if type(func) is not _Global:
            raise UnsafePickleError('calls {} at byte {}'.format(
                _target_name(func), pos))
        if type(args) is not tuple:
            raise UnsafePickleError('calls {} with a {} at byte {}, expected '
                                    'a tuple'.format(func.spelling,
                                                     type(args).__name__,
                                                     pos))
        role = func.role
        if role == 'dtype':
            return self.make_dtype(args)
        if role == '_reconstruct':
            if (len(args) != 3 or type(args[0]) is not _Global
                    or args[0].role != 'ndarray'
                    or not _is(args[1], tuple) or len(args[1]) != 1
                    or not _is(args[1][0], int, 0)
                    or not (_is(args[2], str, 'b') or _is(args[2], bytes,
                                                           b'b'))):
                raise UnsafePickleError(
                    'calls {} with other arguments than NumPy writes '
                    '(ndarray, (0,), b"b")'.format(func.spelling))
            return _Array()
        if role == 'scalar':
            if len(args) != 2 or type(args[0]) is not _Dtype:
                raise UnsafePickleError('calls {} with other arguments than '
                                        '(dtype, bytes)'.format(
                                            func.spelling))
            dtype = args[0].dtype
            raw = self.raw(args[1], 'a scalar')
            if len(raw) != dtype.itemsize:
                raise UnsafePickleError(
                    'gives a {} scalar {} bytes, expected {}'.format(
                        dtype, len(raw), dtype.itemsize))
            self.spend(len(raw), 'a scalar')
            if not dtype.itemsize:      # b'' and '' as NumPy scalars
                return dtype.type()
            _check_code_points(dtype, raw)
            return numpy.frombuffer(raw, dtype, 1)[0]
        if role == '_frombuffer':
            if (len(args) != 4 or type(args[1]) is not _Dtype
                    or not _is(args[3], str, 'C', 'F')):
                raise UnsafePickleError(
                    'calls {} with other arguments than (bytes, dtype, shape, '
                    '"C" or "F")'.format(func.spelling))
            return self.make_array(args[2], args[1].dtype, args[3] == 'F',
                                   args[0])
        if role == 'encode':
            if len(args) != 2 or type(args[0]) is not str or not _is(
                    args[1], str, 'latin1'):
                raise UnsafePickleError(
                    'calls _codecs.encode with codec {}, expected (text, '
                    "'latin1')".format(_short(args[1]) if len(args) == 2 and
                                       type(args[1]) in (str, bytes)
                                       else 'of another kind'))
            try:
                out = args[0].encode('latin-1')
            except UnicodeEncodeError as e:
                raise UnsafePickleError('encodes text beyond latin1 as '
                                        'bytes') from e
            self.spend(len(out), '_codecs.encode')
            return out
        if role == 'bytes':
            if len(args):
                raise UnsafePickleError('calls bytes with arguments (only '
                                        'bytes() is written, for b"")')
            return b''
        # ndarray(shape, dtype, buffer, offset, strides) would view any
        # buffer with any strides; NumPy pickles go through _reconstruct
        raise UnsafePickleError(
            'calls {} directly (an array over a buffer and strides of the '
            "file's choosing); NumPy writes arrays through _reconstruct"
            .format(func.spelling))

    def make_dtype(self, args):
        if len(args) != 3 or not all(_is_int(a) for a in args[1:]) or (
                args[1] != 0 or args[2] != 1):
            raise UnsafePickleError('calls numpy.dtype with other arguments '
                                    'than (descr, False, True)')
        descr = args[0]
        if type(descr) is bytes:
            descr = descr.decode('latin-1')
        if type(descr) is not str:
            raise UnsafePickleError('calls numpy.dtype with a {}, expected '
                                    'a description such as "u1"'.format(
                                        type(descr).__name__))
        if not _DESCR.match(descr):
            raise UnsafePickleError(
                'asks for dtype {} ({}), expected plain numbers or text '
                '(b1, i1-i8, u1-u8, f2-f8, S<n>, U<n>)'.format(
                    _KIND_NAMES.get(descr[:1], 'of another kind'),
                    _short(descr)))
        dtype = numpy.dtype(descr)
        if dtype.itemsize > MAX_ARRAY_BYTES:
            raise UnsafePickleError('asks for dtype {} of {} bytes'.format(
                _short(descr), dtype.itemsize))
        return _Dtype(dtype)

    # ---- BUILD: a dtype's byte order, an array's contents
    def build(self, target, state, pos):
        if type(target) is _Dtype and not target.built:
            target.dtype = self.dtype_state(target.dtype, state)
            target.built = True
            return target
        if type(target) is _Array and target.array is None:
            if type(state) is not tuple or len(state) != 5 or (
                    not _is(state[0], int, 1)
                    or type(state[2]) is not _Dtype
                    or not _is_int(state[3]) or state[3] not in (0, 1)):
                raise UnsafePickleError(
                    'sets the state of an array to other than (1, shape, '
                    'dtype, is_fortran, bytes) at byte {}'.format(pos))
            target.array = self.make_array(state[1], state[2].dtype,
                                           bool(state[3]), state[4],
                                           native=True)
            return target.array
        raise UnsafePickleError('sets the state of {} at byte {} (only a '
                                'new dtype or array has one)'.format(
                                    _target_name(target), pos))

    def dtype_state(self, dtype, state):
        """``dtype`` in the byte order of ``state``, which must equal NumPy's
        own state of that dtype (no flags, fields or sub-array of the
        file's choosing)."""
        if type(state) is not tuple or len(state) != 8 or not all(
                type(v) in (int, str, bytes, type(None)) for v in state):
            raise UnsafePickleError('sets the state of dtype {} to other '
                                    'than (3, byte order, None, None, None, '
                                    'size, alignment, flags)'.format(dtype))
        order = state[1]
        if type(order) is bytes:
            order = order.decode('latin-1')
        if order in ('<', '>'):
            dtype = dtype.newbyteorder(order)
        want = dtype.__reduce__()[2]
        got = (state[0], order) + state[2:]
        if got != want:
            raise UnsafePickleError(
                'sets the state of dtype {} to {}, expected NumPy\'s {} (no '
                'flags, fields or sub-array)'.format(dtype, _short(got),
                                                      want))
        return dtype

    def make_array(self, shape, dtype, fortran, raw, native=False):
        """A new array owning a copy of ``raw``; ``native``: in the
        machine's byte order, values kept (what ``ndarray.__setstate__``
        gives; ``_frombuffer`` keeps the file's order)."""
        if type(shape) is not tuple or len(shape) > MAX_DEPTH or not all(
                type(n) is int and 0 <= n <= MAX_ARRAY_BYTES for n in shape):
            raise UnsafePickleError('gives an array the shape {}, expected a '
                                    'tuple of sizes'.format(_short(shape)))
        raw = self.raw(raw, 'an array')
        size = span = 1
        for n in shape:
            size *= n
            span *= max(n, 1)
        nbytes = size * dtype.itemsize
        if span * dtype.itemsize > MAX_ARRAY_BYTES:
            # an empty array's other axes too: NumPy refuses to make
            # (0, 2**27, 2**27, 2**27) at all (ValueError, not a refusal)
            raise UnsafePickleError(
                'gives a {} array the shape {}, more than {} bytes were its '
                'empty axes of length 1'.format(dtype, _short(shape),
                                                MAX_ARRAY_BYTES))
        if not dtype.itemsize:
            raise UnsafePickleError('gives an array the unsized dtype {} '
                                    '(NumPy writes S1 or U1 at least)'.format(
                                        dtype))
        if nbytes > MAX_ARRAY_BYTES or nbytes != len(raw):
            raise UnsafePickleError(
                'gives a {} array of shape {} {} bytes, expected {}{}'.format(
                    dtype, shape, len(raw), nbytes,
                    '' if nbytes <= MAX_ARRAY_BYTES else
                    ' (more than {})'.format(MAX_ARRAY_BYTES)))
        self.spend(nbytes, 'an array')
        _check_code_points(dtype, raw)
        order = 'F' if fortran else 'C'
        if native and not dtype.isnative:
            array = numpy.empty(shape, dtype.newbyteorder('='), order)
            if nbytes:
                array[...] = numpy.frombuffer(raw, dtype).reshape(
                    shape, order=order)
            return array
        array = numpy.empty(shape, dtype, order)
        if nbytes:
            # filled in memory order (a view: the array is contiguous)
            array.reshape(-1, order='A').view(numpy.uint8)[...] = (
                numpy.frombuffer(raw, numpy.uint8))
        return array


def _target_name(obj):
    """What a message calls ``obj``, a value or a placeholder."""
    if type(obj) is _Global:
        return obj.spelling
    if type(obj) is _Dtype:
        return 'a numpy.dtype' + (' already set' if obj.built else '')
    if type(obj) is _Array:
        return 'a numpy.ndarray' + (' already set' if obj.array is not None
                                    else '')
    return 'a ' + type(obj).__name__


# -- pass 3: the result -------------------------------------------------------
def _leaf_payload(obj):
    """Payload bytes of a plain leaf, or None if ``obj`` is a container;
    raises UnsafePickleError for anything else."""
    kind = type(obj)
    if kind in (str, bytes):
        return len(obj)
    if kind in _LEAVES:
        return 0
    if kind is numpy.ndarray:
        dtype = obj.dtype
        if (dtype.kind not in PLAIN_KINDS or dtype.hasobject
                or dtype.fields is not None or dtype.subdtype is not None):
            raise UnsafePickleError('holds an array of dtype {}, expected '
                                    'plain numbers or text'.format(dtype))
        if not (obj.flags.c_contiguous or obj.flags.f_contiguous):
            raise UnsafePickleError('holds an array that is not contiguous')
        base = obj.base
        if base is not None and (
                not isinstance(base, (bytes, bytearray, numpy.ndarray))
                or memoryview(base).nbytes != obj.nbytes):
            raise UnsafePickleError('holds an array over a buffer of another '
                                    'size')
        return obj.nbytes
    if isinstance(obj, numpy.generic) and kind.__module__ == 'numpy':
        if obj.dtype.kind not in PLAIN_KINDS or obj.dtype.hasobject:
            raise UnsafePickleError('holds a scalar of dtype {}, expected '
                                    'plain numbers or text'.format(obj.dtype))
        return obj.dtype.itemsize
    if kind in (list, tuple, dict):
        return None
    if kind is _Array:
        raise UnsafePickleError('holds an array whose contents were never '
                                'set')
    if kind in (_Dtype, _Global):
        raise UnsafePickleError('holds {} itself, not data'.format(
            'a dtype' if kind is _Dtype else obj.spelling))
    if isinstance(obj, numpy.ndarray):
        raise UnsafePickleError('holds an array subclass {}'.format(
            kind.__name__))
    raise UnsafePickleError('holds a {}, expected dicts, lists, text, '
                            'numbers and arrays'.format(kind.__name__))


def _children(obj):
    if type(obj) is dict:
        for key, value in obj.items():
            yield key
            yield value
    else:
        yield from obj


def check_plain(obj, max_payload=None, shared=None):
    """Raises UnsafePickleError unless ``obj`` is made of lists, tuples,
    dicts, text, numbers and NumPy arrays / scalars of plain dtypes, with
    no cycle, nested at most :data:`MAX_DEPTH` deep, of at most
    :data:`MAX_ELEMENTS` objects and ``max_payload`` payload bytes (default
    :func:`payload_bound` of :data:`MAX_FILE_BYTES`) counting every
    reference in full. Each object is visited once: linear in the objects
    and references, however they are shared.

    ``shared``: the ids of the containers that may be referenced more than
    once (the reader's: those fetched from the memo, the only way a pickle
    of the admitted opcodes refers to one object twice); only these are
    remembered once measured, so the walk holds the path (at most
    :data:`MAX_DEPTH` containers) and the shared ones, not a record per
    container. None: every container may be shared."""
    if max_payload is None:
        max_payload = payload_bound(MAX_FILE_BYTES)
    payload = _leaf_payload(obj)
    if payload is not None:
        if payload > max_payload:
            raise UnsafePickleError('holds {} bytes (at most {})'.format(
                payload, max_payload))
        return
    measured = {}       # id -> (elements, payload, height) of a shared one
    keep = []           # the measured, alive (ids stay unique)
    path = set()        # ids of the containers being visited: a cycle
    # the path: [container, its children left, elements, payload, height
    # of its tallest child]
    frames = []

    def enter(node):
        if len(frames) >= MAX_DEPTH:
            raise UnsafePickleError('nests deeper than {} levels'.format(
                MAX_DEPTH))
        path.add(id(node))
        frames.append([node, _children(node), 1, 0, 0])

    enter(obj)
    while frames:
        frame = frames[-1]
        for child in frame[1]:
            leaf = _leaf_payload(child)
            if leaf is not None:
                frame[2] += 1
                frame[3] += leaf
                continue
            key = id(child)
            if key in path:
                raise UnsafePickleError('holds a container that contains '
                                        'itself')
            counts = measured.get(key)
            if counts is None:
                enter(child)
                break
            # a shared container met again: counted in full, not walked
            frame[2] += counts[0]
            frame[3] += counts[1]
            frame[4] = max(frame[4], counts[2])
            _within(frame[2], frame[3], max_payload)
        else:                           # leaving the container
            frames.pop()
            node, _, elements, payload, height = frame
            height += 1
            _within(elements, payload, max_payload)
            if height > MAX_DEPTH:
                # the nesting below node, through shared containers
                # measured before (met shallow first, as [x_n, ..., x_1]
                # meets the chain x_i): the path walked alone does not
                # bound it
                raise UnsafePickleError('nests deeper than {} levels'.format(
                    MAX_DEPTH))
            key = id(node)
            path.discard(key)
            if shared is None or key in shared:
                measured[key] = (elements, payload, height)
                keep.append(node)
            if frames:
                parent = frames[-1]
                parent[2] += elements
                parent[3] += payload
                parent[4] = max(parent[4], height)


def _within(elements, payload, max_payload):
    if elements > MAX_ELEMENTS:
        raise UnsafePickleError(
            'holds more than {} objects counting every memo reference (a '
            'consumer walking it would visit each)'.format(MAX_ELEMENTS))
    if payload > max_payload:
        raise UnsafePickleError(
            'reaches more than {} bytes of text and arrays counting every '
            'memo reference'.format(max_payload))


def loads(data, encoding='latin1'):
    """The object pickled in ``data`` (bytes), read as the module docstring
    says. ``encoding``: how Python 2 ``str`` is read (``'latin1'``, which
    NumPy's arrays need, or ``'bytes'``).

    Raises:
        UnsafePickleError: an opcode, global, dtype, size or object a data
            file does not hold (nothing of it ran).
        DatasetFormatError: not a readable pickle (truncated, corrupted).
    """
    if type(data) is not bytes:
        try:
            data = bytes(memoryview(data))
        except TypeError as e:
            raise DatasetFormatError('not a pickle: a {}, expected bytes'
                                     .format(type(data).__name__)) from e
    memo_size = validate(data)
    reader = _Reader(data, encoding, memo_size)
    obj = reader.read()
    check_plain(obj, payload_bound(len(data)), reader.shared)
    return obj


def load(f, encoding='latin1'):
    """:func:`loads` of an open binary file (at most
    :data:`MAX_FILE_BYTES` are read)."""
    data = f.read(MAX_FILE_BYTES + 1)
    if not isinstance(data, bytes):
        raise DatasetFormatError('not a binary file')
    return loads(data, encoding)
