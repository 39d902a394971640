"""Checks of user-given numbers (a mode's options reach these as parsed
text: a number, a bool, None or a string), each a ValueError naming the
option and what it must be. Shared by the loss-scale math
(:mod:`~ada_loss.loss_scale.dynamic`, :mod:`~ada_loss.loss_scale.gemm`) and
the scaled backward's options (:mod:`ada_loss.adaptive`)."""
import math

import numpy


def is_number(value):
    """A real number (not a bool, which Python counts as an int)."""
    return not isinstance(value, bool) and isinstance(
        value, (int, float, numpy.number))


def positive_finite(name, value):
    if not (is_number(value) and value > 0 and math.isfinite(value)):
        raise ValueError('{} must be a positive finite number, got {!r}'
                         .format(name, value))
    return float(value)


def positive_float32(name, value):
    """A positive number that stays finite and positive as a float32 (a
    scale stored in float32, as the frameworks store it)."""
    value = positive_finite(name, value)
    with numpy.errstate(over='ignore', under='ignore'):
        stored = numpy.float32(value)
    if not numpy.isfinite(stored):
        raise ValueError('{} must be at most float32\'s largest value '
                         '(3.4e38), got {!r}'.format(name, value))
    if stored == 0:
        # a scale of 0 zeroes every gradient
        raise ValueError('{} must be at least float32\'s smallest positive '
                         'value (1.4e-45), got {!r}'.format(name, value))
    return value


#: how a method stores a numeric option (:func:`stored_number`)
NUMBER_KINDS = ('int', 'float', 'float32', 'cap')


def stored_number(kind, value):
    """``value`` as a method stores a numeric option of ``kind``, the value
    a mode's canonical text prints (:func:`ada_loss.scaling.parse_mode`), so
    that two spellings of one stored value are one text:

    * ``'int'``: an integral number as an int (``1e3`` is 1000);
    * ``'float'``: a double (``64`` is 64.0);
    * ``'float32'``: a double rounded to float32, where the method keeps
      the value in float32 as its source framework does (PyTorch's and
      TensorFlow's scales: ``1000.00001`` is 1000.0);
    * ``'cap'``: a double, an infinite one as None (no cap either way:
      :func:`no_cap_is_none`).

    Any other value (a bool, a string, None) and a number the option's check
    refuses in a way this rounding would hide (a fraction for an int, a
    float32 value that is not positive and finite) is returned unchanged, so
    that the check names it as it was given."""
    if kind not in NUMBER_KINDS:
        raise ValueError('kind must be one of {}, got {!r}'.format(
            NUMBER_KINDS, kind))
    if not is_number(value):
        return value
    if kind == 'int':
        return int(value) if math.isfinite(value) and int(value) == value \
            else value
    try:
        double = float(value)
    except OverflowError:       # an int beyond a double's range
        return value
    if kind == 'cap':
        return no_cap_is_none(double)
    if kind == 'float':
        return double
    with numpy.errstate(over='ignore', under='ignore'):
        single = float(numpy.float32(double))
    return single if 0 < single < math.inf else value


def factor_above_one(name, value):
    if not (is_number(value) and value > 1 and math.isfinite(value)):
        # an infinite factor would make every later step overflow
        raise ValueError('{} must be a finite number > 1, got {!r}'
                         .format(name, value))
    return float(value)


def in_open_unit(name, value):
    if not (is_number(value) and 0 < value < 1):
        raise ValueError('{} must be in (0, 1), got {!r}'.format(name, value))
    return float(value)


def positive_int(name, value):
    if not (is_number(value) and math.isfinite(value)
            and int(value) == value and value >= 1):
        raise ValueError('{} must be a positive integer, got {!r}'
                         .format(name, value))
    return int(value)


def nonnegative_int(name, value, meaning=''):
    if not (is_number(value) and math.isfinite(value)
            and int(value) == value and value >= 0):
        raise ValueError('{} must be an integer >= 0{}, got {!r}'.format(
            name, meaning, value))
    return int(value)


def no_cap_is_none(cap):
    """An optional cap as stored: None for an infinite one (both mean no
    cap; one state, so one canonical text)."""
    return None if cap is not None and cap == math.inf else cap


def optional_at_least_one(name, value):
    """None, or a number >= 1 (inf allowed: no cap)."""
    if value is not None and not (is_number(value) and value >= 1):
        raise ValueError('{} must be None or >= 1, got {!r}'.format(
            name, value))
    return value
