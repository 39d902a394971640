"""Representable range of the floating-point formats loss scaling targets.

The paper (§2.1) writes the FP16 range as [u_min, u_max] with u_min = 2^-24, the
smallest positive subnormal, and u_max the largest finite value. Loss scales are
computed against a *format*, independently of the dtype the arrays are stored
in: running in float32 with the float16 format is what makes adaptive scaling
testable bit for bit against plain backprop.
"""
import collections

import numpy


class FloatFormat(collections.namedtuple(
        'FloatFormat', ('name', 'u_min', 'u_max', 'dtype'))):
    """A binary floating-point format.

    Attributes:
        name (str): ``'float16'``, ``'bfloat16'`` or ``'float32'``.
        u_min (float): smallest positive (subnormal) value, ``u`` in Eq. (1).
        u_max (float): largest finite value, ``u_max`` in §3.2.3.
        dtype: the NumPy dtype storing the format, or ``None`` when NumPy has
            none (bfloat16: usable for loss-scale computation only).
    """

    __slots__ = ()

    def __str__(self):
        return self.name


_FORMATS = {
    'float16': FloatFormat('float16', 2.0 ** -24, 65504.0, numpy.dtype('float16')),
    'bfloat16': FloatFormat('bfloat16', 2.0 ** -133,
                            float((2 - 2.0 ** -7) * 2.0 ** 127), None),
    'float32': FloatFormat('float32', 2.0 ** -149,
                           float(numpy.finfo(numpy.float32).max),
                           numpy.dtype('float32')),
}


def get_format(fmt):
    """Returns the :class:`FloatFormat` named ``fmt`` (or ``fmt`` itself)."""
    if isinstance(fmt, FloatFormat):
        return fmt
    key = numpy.dtype(fmt).name if not isinstance(fmt, str) else fmt
    try:
        return _FORMATS[key]
    except KeyError:
        raise ValueError('unknown floating-point format {!r}; expected one of {}'
                         .format(fmt, ', '.join(sorted(_FORMATS))))
