"""Pickles read without running code: a restricted unpickler admitting
only what a data file of plain arrays holds.

``pickle.load`` calls whatever callable a file names (``os.system`` as
readily as ``numpy.dtype``), so a data file taken from a stranger could run
code. :func:`load` / :func:`loads` resolve only the globals that NumPy
arrays and scalars of plain dtypes are pickled with, as NumPy 1 (Python 2
and 3) and NumPy 2 write them:

* ``numpy.core.multiarray._reconstruct`` / ``numpy._core.multiarray.
  _reconstruct`` with ``numpy.ndarray`` and ``numpy.dtype`` (protocols
  0-4), ``numpy._core.numeric._frombuffer`` (protocol 5);
* ``numpy.core.multiarray.scalar`` (NumPy scalars, e.g. an ``int64``
  label);
* ``_codecs.encode`` (how Python 3 pickles ``bytes`` at protocol <= 2).

Everything else (dicts, lists, tuples, str, bytes, ints, floats) needs no
global. Any other global is refused before it is looked up, and the
loaded object is then checked: containers, text, numbers and arrays whose
dtype is a plain number, bool or text type (no object arrays, no
subclasses). Either failure is a :class:`UnsafePickleError` naming what
the file asked for.
"""
import _codecs
import io
import pickle

import numpy
from numpy._core import multiarray as _multiarray
from numpy._core import numeric as _numeric

from ada_loss.datasets.errors import DatasetFormatError

_RECONSTRUCT = _multiarray._reconstruct
_SCALAR = _multiarray.scalar
_FROMBUFFER = _numeric._frombuffer

#: (module, name) -> object, for every spelling NumPy 1 and 2 write
ALLOWED = {}
for _module in ('numpy.core.multiarray', 'numpy._core.multiarray'):
    ALLOWED[(_module, '_reconstruct')] = _RECONSTRUCT
    ALLOWED[(_module, 'scalar')] = _SCALAR
for _module in ('numpy.core.numeric', 'numpy._core.numeric'):
    ALLOWED[(_module, '_frombuffer')] = _FROMBUFFER
ALLOWED[('numpy', 'ndarray')] = numpy.ndarray


def _dtype(obj, align=False, copy=False):
    """``numpy.dtype`` as pickles call it; Python 2's pass ``align`` and
    ``copy`` as the ints 0 and 1, which NumPy 2.4 deprecates."""
    return numpy.dtype(obj, bool(align), bool(copy))


ALLOWED[('numpy', 'dtype')] = _dtype
ALLOWED[('_codecs', 'encode')] = _codecs.encode

#: array dtype kinds a data file may hold: bool, integers, floats, text
PLAIN_KINDS = 'biufSU'
_PLAIN_TYPES = (dict, list, tuple, str, bytes, int, float, bool,
                type(None))
#: nesting deeper than this is not a data file (and would exhaust the
#: stack of the check)
MAX_DEPTH = 32


class UnsafePickleError(DatasetFormatError):
    """A pickle names a global outside :data:`ALLOWED` or holds an object
    a data file does not (it was not loaded: nothing of it ran)."""


class _RestrictedUnpickler(pickle.Unpickler):

    def find_class(self, module, name):
        try:
            return ALLOWED[(module, name)]
        except (KeyError, TypeError):
            raise UnsafePickleError(
                'refers to {}.{}, which a data file does not hold (allowed: '
                'NumPy arrays and scalars of plain dtypes, dicts, lists, '
                'text, numbers); not loaded'.format(module, name))


def check_plain(obj, depth=0):
    """Raises UnsafePickleError unless ``obj`` is made of containers, text,
    numbers and NumPy arrays / scalars of plain dtypes."""
    if depth > MAX_DEPTH:
        raise UnsafePickleError('nests deeper than {} levels'.format(
            MAX_DEPTH))
    if type(obj) in (numpy.ndarray,) or isinstance(obj, numpy.generic):
        if type(obj) is not numpy.ndarray and not isinstance(
                obj, numpy.generic):
            raise UnsafePickleError('holds an array subclass {}'.format(
                type(obj).__name__))
        if obj.dtype.kind not in PLAIN_KINDS or obj.dtype.fields:
            raise UnsafePickleError('holds an array of dtype {}, expected '
                                    'plain numbers or text'.format(obj.dtype))
        return
    if type(obj) not in _PLAIN_TYPES:
        raise UnsafePickleError('holds a {}, expected dicts, lists, text, '
                                'numbers and arrays'.format(
                                    type(obj).__name__))
    if isinstance(obj, dict):
        for k, v in obj.items():
            check_plain(k, depth + 1)
            check_plain(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            check_plain(v, depth + 1)


def loads(data, encoding='latin1'):
    """The object pickled in ``data`` (bytes), restricted as the module
    docstring says. ``encoding``: how Python 2 ``str`` is read
    (``'latin1'``, which NumPy's arrays need, or ``'bytes'``).

    Raises:
        UnsafePickleError: a global or object a data file does not hold.
        DatasetFormatError: not a readable pickle (truncated, corrupted).
    """
    return load(io.BytesIO(data), encoding)


def load(f, encoding='latin1'):
    """:func:`loads` of an open binary file."""
    try:
        obj = _RestrictedUnpickler(f, encoding=encoding).load()
    except UnsafePickleError:
        raise
    except RecursionError:
        raise DatasetFormatError('not a readable pickle (nested too deeply)')
    except Exception as e:
        # a truncated or corrupted pickle raises any of many types, with
        # texts about the unpickler's internals: the type is enough
        raise DatasetFormatError('not a readable pickle (truncated or '
                                 'corrupted: the unpickler stopped with {})'
                                 .format(type(e).__name__)) from e
    check_plain(obj)
    return obj
