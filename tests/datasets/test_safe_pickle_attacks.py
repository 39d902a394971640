"""The four holes issue 50 found in the restricted unpickler
(:mod:`ada_loss.datasets.safe_pickle`), each as the malicious pickle itself,
written opcode by opcode: a dtype with the REFCOUNT flag over the file's
bytes (a SIGSEGV when NumPy frees it: run in a child process), an ``'S8'``
dtype with an object sub-array, unbounded memory from a tiny file
(``_codecs.encode`` with nested ``'hex'`` codecs or re-used latin1 payload,
``numpy.ndarray`` over a one-byte buffer with zero strides), and a memo
fan-out of nested ``(prev, prev)`` tuples. Each is refused quickly, in a
bounded amount of memory, with one UnsafePickleError naming what the file
asked for."""
import contextlib
import os
import signal
import struct
import subprocess
import sys
import tracemalloc

import pytest

import ada_loss
from ada_loss.datasets import DatasetFormatError, get_cifar
from ada_loss.datasets import safe_pickle

from property_helpers import assert_specific

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_cifar import make_cifar10  # NOQA: E402


# -- pickle opcodes (pickletools' names), written by hand ---------------------
PROTO3 = b'\x80\x03'
MARK, STOP, NONE = b'(', b'.', b'N'
NEWTRUE, NEWFALSE = b'\x88', b'\x89'
TUPLE, TUPLE1, TUPLE2, TUPLE3 = b't', b'\x85', b'\x86', b'\x87'
EMPTY_DICT, SETITEM, LIST = b'}', b's', b'l'
REDUCE, BUILD = b'R', b'b'


def text(s):
    """BINUNICODE (a Python 3 ``str``)."""
    raw = s.encode('utf-8')
    return b'X' + struct.pack('<I', len(raw)) + raw


def raw_bytes(b):
    """BINBYTES (protocol 3)."""
    return b'B' + struct.pack('<I', len(b)) + b


def integer(n):
    """BININT (a signed 4-byte int)."""
    return b'J' + struct.pack('<i', n)


def glob(module, name):
    """GLOBAL ``module.name``."""
    return b'c' + module.encode() + b'\n' + name.encode() + b'\n'


def put(i):
    return b'q' + bytes([i])        # BINPUT


def get(i):
    return b'h' + bytes([i])        # BINGET


def dtype(descr):
    """``numpy.dtype(descr, False, True)`` without its state."""
    return glob('numpy', 'dtype') + text(descr) + NEWFALSE + NEWTRUE + \
        TUPLE3 + REDUCE


def dtype_state(subarray, names, fields, size, align, flags, order='|'):
    """A BUILD state of a dtype: (3, order, subarray, names, fields, size,
    alignment, flags), each argument already pickled."""
    return (MARK + integer(3) + text(order) + subarray + names + fields +
            integer(size) + integer(align) + integer(flags) + TUPLE + BUILD)


def array(shape, dtype_ops, raw):
    """``_reconstruct(ndarray, (0,), b'b')`` then BUILD (1, shape, dtype,
    False, raw), as NumPy writes an array."""
    return (glob('numpy.core.multiarray', '_reconstruct') +
            glob('numpy', 'ndarray') + integer(0) + TUPLE1 +
            raw_bytes(b'b') + TUPLE3 + REDUCE +
            MARK + integer(1) + MARK + b''.join(integer(n) for n in shape) +
            TUPLE + dtype_ops + NEWFALSE + raw_bytes(raw) + TUPLE + BUILD)


def batch(data_ops):
    """A CIFAR batch ``{'data': <data_ops>}``."""
    return PROTO3 + EMPTY_DICT + text('data') + data_ops + SETITEM + STOP


# -- the four reproductions ---------------------------------------------------
def refcount_dtype_batch():
    """Hole 1: V8 dtype whose state sets the field a: object at offset 0 and
    the REFCOUNT flag; the array's bytes 'AAAAAAAA' are then a pointer NumPy
    decrements when it frees the (rejected) array."""
    fields = (EMPTY_DICT + text('a') + dtype('O8') + integer(0) + TUPLE2 +
              SETITEM)
    return batch(array((1,), dtype('V8') + dtype_state(
        NONE, text('a') + TUPLE1, fields, 8, 1, 1), b'AAAAAAAA'))


def object_subarray_batch():
    """Hole 2: an 'S8' dtype given an object sub-array (and REFCOUNT): kind
    'S', no fields, yet ``hasobject``; its bytes are pointers (zeros here,
    so that the old code returns the array instead of crashing)."""
    subarray = dtype('O8') + integer(1) + TUPLE1 + TUPLE2
    return batch(array((1,), dtype('S8') + dtype_state(
        subarray, NONE, NONE, 8, 1, 1), b'\0' * 8))


def nested_hex_batch(levels=26):
    """Hole 3a: ``_codecs.encode`` nested ``levels`` deep with the 'hex'
    codec: each level doubles, 2**levels bytes from one."""
    encode = glob('_codecs', 'encode') + put(0)
    inner = (get(0) * (levels - 1) + raw_bytes(b'A') + text('hex') + put(1)
             + TUPLE2 + REDUCE)
    outer = (get(1) + TUPLE2 + REDUCE) * (levels - 1)
    return batch(encode + inner + outer)


def latin1_fanout_batch(copies=200, size=2 ** 16):
    """Hole 3a with the admitted codec: one latin1 text of ``size`` chars
    encoded ``copies`` times through memo references (a list of ``copies``
    distinct bytes objects: 12.5 MiB from a 66 KB file)."""
    first = (glob('_codecs', 'encode') + put(0) + text('A' * size) + put(1) +
             text('latin1') + put(2) + TUPLE2 + REDUCE)
    again = get(0) + get(1) + get(2) + TUPLE2 + REDUCE
    return batch(MARK + first + again * (copies - 1) + LIST)


def strided_view_batch(rows=20000):
    """Hole 3b: ``numpy.ndarray((rows, 3072), 'u1', b'A', 0, (0, 0))``: an
    array of rows x 3072 bytes over one byte of the file."""
    return batch(glob('numpy', 'ndarray') + MARK + MARK + integer(rows) +
                 integer(3072) + TUPLE + text('u1') + raw_bytes(b'A') +
                 integer(0) + integer(0) + integer(0) + TUPLE2 + TUPLE +
                 REDUCE)


def fanout_batch(levels=30):
    """Hole 4: ``levels`` nested tuples ``(prev, prev)`` through the memo:
    ~2**(levels + 1) objects for a walk that treats the result as a tree."""
    ops = MARK + NONE + put(0)
    for i in range(levels):
        ops += get(i) + get(i) + TUPLE2 + put(i + 1)
    return PROTO3 + ops + LIST + STOP


# -- how they are run ---------------------------------------------------------
class _TookTooLong(Exception):
    pass


@contextlib.contextmanager
def within(seconds):
    """Interrupts the block (in the main thread) after ``seconds``."""
    def alarm(signum, frame):
        raise _TookTooLong('still running after {} s'.format(seconds))
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused(payload, match, seconds=5, max_bytes=8 * 2 ** 20):
    """``safe_pickle.loads(payload)`` raises one UnsafePickleError matching
    ``match``, within ``seconds`` and ``max_bytes`` of traced memory."""
    tracemalloc.start()
    try:
        with within(seconds):
            with pytest.raises(safe_pickle.UnsafePickleError,
                               match=match) as e:
                safe_pickle.loads(payload)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_specific(e.value)
    assert peak < max_bytes, peak
    return e.value


# the child imports safe_pickle (and errors) alone, not the package's
# __init__ (which imports Chainer: seconds)
_CHILD = '''
import os, sys, types
for name in ('ada_loss', 'ada_loss.datasets'):
    package = types.ModuleType(name)
    package.__path__ = [os.path.join(*name.split('.'))]
    sys.modules[name] = package
from ada_loss.datasets import safe_pickle
try:
    safe_pickle.loads(sys.stdin.buffer.read())
except safe_pickle.UnsafePickleError as e:
    print('refused:', e)
else:
    print('loaded')
'''


def test_refcount_flag_dtype_is_refused_and_the_process_lives():
    payload = refcount_dtype_batch()
    # in a child process: the old reader's rejected array crashed its
    # process (SIGSEGV) when NumPy freed it
    root = os.path.dirname(os.path.dirname(os.path.abspath(
        ada_loss.__file__)))
    child = subprocess.run([sys.executable, '-c', _CHILD], input=payload,
                           cwd=root, capture_output=True, timeout=60)
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    out = child.stdout.decode()
    assert out.startswith('refused:') and 'V8' in out, out


def test_object_subarray_dtype_is_refused():
    refused(object_subarray_batch(), 'dtype object')


def test_nested_hex_codecs_are_refused_unbuilt():
    refused(nested_hex_batch(), "codec 'hex'", max_bytes=2 ** 20)


def test_memo_references_cannot_multiply_latin1_payload():
    payload = latin1_fanout_batch()
    assert len(payload) < 70000         # 200 copies of 64 KiB: 12.5 MiB
    refused(payload, 'payload', max_bytes=6 * 2 ** 20)


def test_ndarray_over_a_buffer_with_zero_strides_is_refused(tmp_path):
    payload = strided_view_batch()
    assert len(payload) < 160
    refused(payload, 'numpy.ndarray directly')
    # the same file as a CIFAR batch: one error naming the file, and no
    # 20,000 x 3,072 bytes concatenated
    folder, _ = make_cifar10(tmp_path)
    with open(os.path.join(folder, 'data_batch_1'), 'wb') as f:
        f.write(payload)
    with pytest.raises(DatasetFormatError, match='data_batch_1.*ndarray'):
        get_cifar('cifar10', folder)


def test_memo_fanout_is_refused_in_linear_time():
    payload = fanout_batch()
    assert len(payload) < 220
    refused(payload, 'more than 1000000 objects', seconds=2,
            max_bytes=2 ** 20)


def test_a_memo_fanout_where_a_shape_belongs_is_named_not_printed():
    # not a hole of the old reader (NumPy refused the shape): the new
    # reader's own messages must not print the file's containers, which a
    # fan-out makes 2**30 deep in elements
    shape = NONE + put(0) + b''.join(get(i) + TUPLE2 + put(i + 1)
                                     for i in range(30))
    payload = batch(
        glob('numpy.core.multiarray', '_reconstruct') +
        glob('numpy', 'ndarray') + integer(0) + TUPLE1 + raw_bytes(b'b') +
        TUPLE3 + REDUCE + MARK + integer(1) + shape + dtype('u1') +
        dtype_state(NONE, NONE, NONE, -1, -1, 0) + NEWFALSE +
        raw_bytes(b'') + TUPLE + BUILD)
    refused(payload, 'shape a tuple, expected a tuple of sizes', seconds=2)


@pytest.mark.parametrize('what', ['scalar', 'array'])
def test_text_beyond_unicode_is_refused(what):
    # found by the nightly profile: NumPy raises SystemError making a str
    # of a code point above U+10FFFF (the old reader: the same on access)
    u1 = dtype('U1') + dtype_state(NONE, NONE, NONE, 4, 4, 8, order='<')
    if what == 'scalar':
        payload = batch(glob('numpy.core.multiarray', 'scalar') + u1 +
                        raw_bytes(b'\xff\xff\xff\xff') + TUPLE2 + REDUCE)
    else:
        payload = batch(array((2,), u1, b'A\0\0\0\xff\xff\xff\xff'))
    refused(payload, 'code point above U.10FFFF')


# -- found by the review of the redesign (issue 50) ---------------------------
def test_an_empty_array_with_huge_axes_is_refused_not_a_valueerror():
    # shape (0, 2^27, 2^27, 2^27): zero bytes, but NumPy refuses to make
    # it (ValueError "array is too big"), which escaped the reader as
    # neither a DatasetFormatError nor a refusal
    u1 = dtype('u1') + dtype_state(NONE, NONE, NONE, -1, -1, 0)
    payload = batch(array((0, 2 ** 27, 2 ** 27, 2 ** 27), u1, b''))
    assert len(payload) < 250
    refused(payload, 'shape')


def long_put(i):
    return b'r' + struct.pack('<I', i)      # LONG_BINPUT


def long_get(i):
    return b'j' + struct.pack('<I', i)      # LONG_BINGET


def shared_chain_batch(levels):
    """x_1 = (), x_{i+1} = (x_i,) through the memo, then the list
    [x_n, ..., x_1] (each shallow where the walk first meets it, from x_1
    up) beside x_n: ``levels`` deep."""
    chain = EMPTY_TUPLE + long_put(1) + b''.join(
        TUPLE1 + long_put(i) for i in range(2, levels + 1))
    return batch(chain + MARK + b''.join(long_get(i) for i in
                                         range(levels, 0, -1)) +
                 LIST + TUPLE2)


EMPTY_TUPLE = b')'


def test_nesting_through_shared_references_is_bounded():
    # the walk measured each object once and bounded only the path it
    # walked: objects it met shallow first (x_1, x_2, ... in the list)
    # were never re-measured deep, so 1,000 levels passed MAX_DEPTH (32)
    payload = shared_chain_batch(1000)
    assert len(payload) < 12000
    refused(payload, 'nests deeper than 32 levels', seconds=2)
    # at the bound itself the file loads (dict, tuple, list, x_29: 32
    # levels), one more is refused
    obj = safe_pickle.loads(shared_chain_batch(29))
    assert len(obj['data'][1]) == 29
    refused(shared_chain_batch(30), 'nests deeper than 32 levels')
