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
    """A positive number that stays finite as a float32 (a scale stored in
    float32, as the frameworks store it)."""
    value = positive_finite(name, value)
    with numpy.errstate(over='ignore'):
        if not numpy.isfinite(numpy.float32(value)):
            raise ValueError('{} must be at most float32\'s largest value '
                             '(3.4e38), got {!r}'.format(name, value))
    return value


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


def optional_at_least_one(name, value):
    """None, or a number >= 1 (inf allowed: no cap)."""
    if value is not None and not (is_number(value) and value >= 1):
        raise ValueError('{} must be None or >= 1, got {!r}'.format(
            name, value))
    return value
