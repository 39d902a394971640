"""Experiment configuration: YAML files read into typed dataclasses.

Every entry's config is a dataclass whose fields are sections (dataclasses
themselves) or settings. A setting is declared with :func:`setting`: its
default, a one-line doc and the constraints of its type; the type annotation
says what a value must be::

    @dataclasses.dataclass
    class Train:
        lr: float = setting(0.1, 'initial learning rate', positive=True)
        lr_steps: List[float] = setting([81, 122], 'epochs of the lr steps',
                                        positive=True, nonempty=False)

Loading is one path for every entry::

    defaults of the dataclass  <-  YAML file (and the files it ``extends``)
                               <-  ``--set section.key=value`` (YAML values)
                               ->  checked, typed config (a dataclass)

Checking happens before anything runs and raises :class:`ConfigError`
naming the dotted key and what was expected (unknown keys list the allowed
ones). Types: ``int``, ``float``, ``bool``, ``str``, ``Optional[T]``,
``List[T]`` (a scalar is a one-item list; duplicates dropped), ``Dict[str,
T]``, ``Literal[...]`` (choices) and the value types below
(:class:`Mode`, :class:`PrecisionName`, :class:`Interval`, ...), each a
class with ``expected`` (its description) and ``parse(value, key)``.
:class:`Mode` and :class:`PrecisionName` hand the studies parsed objects (a
:class:`~ada_loss.scaling.LossScalingSpec`, a
:class:`~ada_loss.precision.Precision`), defaults included; they become
text again only in ``config.yaml`` (:func:`to_dict`, :func:`to_plain`),
folder names, ``run.json`` and tables.
``--help-config`` (:func:`describe`) is generated from the same types.
A config class may define ``check(self)`` for checks across keys.
"""
import copy
import dataclasses
import math
import os
import re
import sys
import typing

import yaml

from ada_loss.formats import get_format
from ada_loss.experiment.data import DATASETS
from ada_loss.experiment.models import MODEL_HELP, check_model_name
from ada_loss.scaling import LossScalingSpec, parse_mode
from ada_loss.precision import PRECISION_HELP, Precision, parse_precision


class ConfigError(ValueError):
    """A bad configuration: ``key`` is the dotted key at fault.
    ``generic``: the message only says what type was expected (:func:`fail`),
    not a specific reason (a wrapper such as ``Optional`` may restate it)."""

    def __init__(self, key, message, generic=False):
        self.key = key
        self.generic = generic
        super(ConfigError, self).__init__(
            'config key {!r}: {}'.format(key, message) if key else message)


def fail(key, expected, value):
    """Raises the ConfigError of a value that is not ``expected``."""
    raise ConfigError(key, 'expected {}, got {!r} ({})'.format(
        expected, value, type(value).__name__), generic=True)


def setting(default, doc, **constraints):
    """A dataclass field with a doc and constraints (``minimum``,
    ``positive``, ``nonempty`` (lists, default True))."""
    meta = dict(constraints, doc=doc)
    if isinstance(default, (list, dict)):
        return dataclasses.field(
            default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls):
    """A field holding a section (a dataclass built from its defaults)."""
    return dataclasses.field(default_factory=cls)


# -- value types ----------------------------------------------------------------
class Mode(object):
    """A loss-scaling mode: its text in a config, parsed once into a
    :class:`~ada_loss.scaling.LossScalingSpec` (``str`` of it: the
    normalized text, for folder names, ``run.json`` and tables)."""
    expected = ('a loss-scaling mode (fp32, none, fixed:S, dynamic[:style='
                'pytorch|chainer|tf,k=v], adaptive[:k=v], amax[:k=v])')
    #: what :meth:`parse` returns
    parsed = LossScalingSpec
    #: a mode's own options are joined by commas (``--only``)
    commas = True

    @staticmethod
    def parse(value, key):
        try:
            return parse_mode(value)
        except ValueError as e:
            raise ConfigError(key, str(e))


class FixedScale(object):
    """A fixed loss scale S (run as mode ``fixed:S``)."""
    expected = 'a positive number (a fixed loss scale S)'

    @staticmethod
    def parse(value, key):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(key, FixedScale.expected, value)
        try:
            # float first: repr of an int of thousands of digits fails
            return parse_mode('fixed:{!r}'.format(float(value))
                              ).options['scale']
        except OverflowError:
            raise ConfigError(key, 'the scale S of fixed:S must be a '
                              'positive finite number, got an integer of '
                              '{} bits'.format(value.bit_length()))
        except ValueError as e:
            raise ConfigError(key, str(e))


class PrecisionName(object):
    """A precision: its name in a config, parsed once into a
    :class:`ada_loss.precision.Precision` (``str`` of it: the canonical
    name, for folder names, ``run.json`` and tables)."""
    expected = PRECISION_HELP
    #: what :meth:`parse` returns
    parsed = Precision
    #: a scaled precision's options are joined by commas (``--only``:
    #: ``precision=fp8:recipe=delayed,history=16``)
    commas = True

    @staticmethod
    def parse(value, key):
        try:
            return parse_precision(value)
        except ValueError as e:
            raise ConfigError(key, str(e))


class ModelName(object):
    """A model name of :mod:`ada_loss.experiment.models`."""
    expected = 'a model name ({})'.format(MODEL_HELP)

    @staticmethod
    def parse(value, key):
        if not isinstance(value, str):
            fail(key, ModelName.expected, value)
        try:
            return check_model_name(value)
        except ValueError as e:
            raise ConfigError(key, str(e))


class Dataset(object):
    """A classification dataset name."""
    expected = 'one of ' + ', '.join(sorted(DATASETS))

    @staticmethod
    def parse(value, key):
        if not isinstance(value, str) or value not in DATASETS:
            fail(key, Dataset.expected, value)
        return value


class FormatName(object):
    """A number format name (:func:`ada_loss.formats.get_format`)."""
    expected = ('a format name (float32, float16, bfloat16, fp8_e4m3, '
                'fp8_e5m2, ... any e<E>m<M>)')

    @staticmethod
    def parse(value, key):
        if not isinstance(value, str):
            fail(key, FormatName.expected, value)
        try:
            return get_format(value).name
        except ValueError as e:
            raise ConfigError(key, str(e))


class Device(object):
    """Where a run trains: Chainer's device specifier ``'@numpy'`` (the
    CPU) or ``'@cupy:N'`` (GPU N). Parsed to ``None`` for the CPU, so that
    a CPU run's ``config.yaml`` compares equal to one written before the
    setting existed (``device: null``), else to the ``'@cupy:N'`` text."""
    expected = "'@numpy' (the CPU, the default) or '@cupy:N' (GPU N)"
    _CUPY = re.compile(r'^@cupy:(0|[1-9][0-9]*)$')

    @staticmethod
    def parse(value, key):
        if value is None or value == '@numpy':
            return None
        if not isinstance(value, str) or not Device._CUPY.match(value):
            fail(key, Device.expected, value)
        return value


#: the value types whose values are parsed objects (not text)
PARSED_TYPES = (Mode, PrecisionName)


def value_type_of(value):
    """The value type of :data:`PARSED_TYPES` a parsed ``value`` belongs to
    (None for anything else): how a text given for it elsewhere (``--only``)
    is parsed."""
    for tp in PARSED_TYPES:
        if isinstance(value, tp.parsed):
            return tp
    return None


def to_plain(value):
    """A config, a section or a value as plain nested dicts, lists and
    scalars (YAML-ready): parsed values become their text again."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name))
                for f in dataclasses.fields(value)}
    if value_type_of(value) is not None:
        return str(value)
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)       # any other parsed value: its text


_UNITS = {'epoch': 'epoch', 'epochs': 'epoch', 'iteration': 'iteration',
          'iterations': 'iteration', 'iter': 'iteration'}


class Interval(object):
    """``"N epoch"``, ``"N iteration"`` or ``[N, unit]`` -> ``[N, unit]``
    (a Chainer trigger)."""
    expected = '"N epoch" or "N iteration" (N a positive integer)'

    @staticmethod
    def parse(value, key):
        parts = value.split() if isinstance(value, str) else value
        if not isinstance(parts, (list, tuple)) or len(parts) != 2:
            fail(key, Interval.expected, value)
        n, unit = parts
        if isinstance(n, bool) or (isinstance(n, float) and
                                   not n.is_integer()):
            fail(key, Interval.expected, value)
        try:
            n = int(n)
        except (TypeError, ValueError):
            fail(key, Interval.expected, value)
        if n < 1 or not isinstance(unit, str) or unit not in _UNITS:
            fail(key, Interval.expected, value)
        return [n, _UNITS[unit]]


# -- checking one value against its type ------------------------------------------
def _bounds(meta):
    text = ''
    if meta.get('positive'):
        text += ' > 0'
    if meta.get('minimum') is not None:
        text += ' >= {}'.format(meta['minimum'])
    return text


def expected_text(tp, meta=None):
    """What a value of type ``tp`` must be, in words."""
    meta = meta or {}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)][0]
        return expected_text(inner, meta) + ' or null'
    if origin is list:
        return 'a {}list of {}'.format(
            'non-empty ' if meta.get('nonempty', True) else '',
            expected_text(args[0], meta))
    if origin is dict or tp is dict:
        return 'a mapping'
    if origin is typing.Literal:
        return 'one of ' + ', '.join(map(str, args))
    if tp is bool:
        return 'true or false'
    if tp is int:
        return 'an integer' + _bounds(meta)
    if tp is float:
        return 'a number' + _bounds(meta)
    if tp is str:
        return 'a string'
    if dataclasses.is_dataclass(tp):
        return 'a mapping'
    return tp.expected


def check_value(tp, meta, value, key):
    """``value`` checked against type ``tp`` (and the field's ``meta``),
    normalized; raises ConfigError naming ``key``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)][0]
        try:
            return check_value(inner, meta, value, key)
        except ConfigError as e:
            # restate a type mismatch with "or null"; a specific reason
            # (e.g. "block must be an integer ≥ 1, got 0") is kept as is
            if e.key == key and e.generic and ' or null' not in str(e):
                fail(key, expected_text(tp, meta), value)
            raise
    if origin is list:
        if not isinstance(value, (list, tuple)):
            value = [value]
        if meta.get('nonempty', True) and not value:
            fail(key, expected_text(tp, meta), value)
        out = []
        for i, v in enumerate(value):
            v = check_value(args[0], meta, v, '{}[{}]'.format(key, i))
            if v not in out:
                out.append(v)
        return out
    if tp is dict:
        if not isinstance(value, dict):
            fail(key, 'a mapping', value)
        return dict(value)
    if origin is dict:
        if not isinstance(value, dict):
            fail(key, 'a mapping', value)
        return {k: check_value(args[1], meta, v, '{}.{}'.format(key, k))
                for k, v in value.items()}
    if origin is typing.Literal:
        if value not in args:
            fail(key, expected_text(tp), value)
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key + '.')
    if tp is bool:
        if not isinstance(value, bool):
            fail(key, 'true or false', value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int) or (
                meta.get('minimum') is not None and value < meta['minimum']):
            fail(key, expected_text(tp, meta), value)
        return value
    if tp is float:
        if isinstance(value, str):      # YAML 1.1 reads 1e-4 as a string
            try:
                value = float(value)
            except ValueError:
                fail(key, expected_text(tp, meta), value)
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:   # an int beyond float's range
                fail(key, expected_text(tp, meta), value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or (
                    meta.get('positive') and value <= 0) or (
                    meta.get('minimum') is not None
                    and value < meta['minimum']):
            fail(key, expected_text(tp, meta), value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            fail(key, 'a string', value)
        return value
    return tp.parse(value, key)


def _parsed(tp):
    """Whether values of type ``tp`` hold parsed objects (:data:`PARSED_TYPES`,
    also inside Optional, List or Dict)."""
    if tp in PARSED_TYPES:
        return True
    return any(_parsed(a) for a in typing.get_args(tp))


def _hints(cls):
    return typing.get_type_hints(cls, include_extras=False)


def from_dict(cls, raw, prefix='', partial=False):
    """A ``cls`` instance from a raw mapping: defaults filled, every value
    checked (``prefix``: the dotted key of the mapping). With ``partial``
    a dict of the given keys only, checked (per-model overrides)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(prefix.rstrip('.') or '<root>',
                          'expected a mapping, got {!r}'.format(raw))
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    renamed = getattr(cls, 'renamed', {})
    for key in raw:
        if key not in names:
            hint = ' ({0}{1} was renamed {0}{2})'.format(
                prefix, key, renamed[key]) if key in renamed else ''
            raise ConfigError(prefix + str(key), 'unknown key{}; allowed '
                              'keys here: {}'.format(hint, ', '.join(
                                  sorted(names))))
    values = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if f.name in raw:
            values[f.name] = check_value(tp, f.metadata, raw[f.name],
                                         prefix + f.name)
        elif partial:
            continue
        elif dataclasses.is_dataclass(tp):    # a section left out
            values[f.name] = from_dict(tp, {}, prefix + f.name + '.')
        elif _parsed(tp):                     # its default, parsed
            default = f.default if f.default is not dataclasses.MISSING \
                else f.default_factory()
            values[f.name] = check_value(tp, f.metadata, default,
                                         prefix + f.name)
    if partial:
        return values
    obj = cls(**values)
    if hasattr(obj, 'check'):
        obj.check()
    return obj


def to_dict(cfg):
    """A config as plain nested dicts and lists (YAML-ready; parsed values
    as text)."""
    return to_plain(cfg)


def replace(cfg, **changes):
    """A copy of a config with some fields changed (no re-checking)."""
    return dataclasses.replace(copy.deepcopy(cfg), **changes)


# -- files and overrides ------------------------------------------------------------
def _deep_merge(base, top):
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _short(text, limit=60):
    """``repr(text)``, cut in the middle when longer than ``limit``."""
    if len(text) <= limit:
        return repr(text)
    return '{!r}...{!r} ({} characters)'.format(text[:limit // 2],
                                                text[-10:], len(text))


def yaml_reason(error):
    """A YAML error in one line: the problem and where (PyYAML's text
    spans several lines, and an ``error:`` line is one)."""
    if not isinstance(error, yaml.YAMLError):
        if 'integer string conversion' in str(error):
            return 'an integer of more than {} digits'.format(
                sys.get_int_max_str_digits())
        return ' '.join(str(error).split())
    problem = getattr(error, 'problem', None) or str(error)
    mark = getattr(error, 'problem_mark', None)
    if mark is not None:
        problem += ' (line {}, column {})'.format(mark.line + 1,
                                                  mark.column + 1)
    return ' '.join(problem.split())


def read_yaml(path, _seen=()):
    """A YAML config file as a raw dict; ``extends: other.yaml`` (relative to
    the file) loads that file first and merges this one over it."""
    path = os.path.abspath(path)
    if path in _seen:
        raise ConfigError('extends', 'circular extends: {}'.format(path))
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError('', 'cannot read config file {}: {}'.format(
            path, e.strerror))
    except (yaml.YAMLError, ValueError) as e:
        # ValueError: PyYAML's int() of a number of thousands of digits
        raise ConfigError('', 'config file {} is not valid YAML: {}'.format(
            path, yaml_reason(e)))
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ConfigError('', 'config file {} must hold a mapping'.format(
            path))
    parent = raw.pop('extends', None)
    if parent is not None:
        if not isinstance(parent, str):
            raise ConfigError('extends', 'expected a file name')
        base = read_yaml(os.path.join(os.path.dirname(path), parent),
                         _seen + (path,))
        raw = _deep_merge(base, raw)
    return raw


_OVERRIDE = re.compile(r'^\s*([A-Za-z_][\w\-]*(?:\.[\w\-:]+)*)\s*=(.*)$',
                       re.S)


def parse_override(text):
    """``'train.lr=0.05'`` -> ``(['train', 'lr'], 0.05)`` (value as YAML)."""
    m = _OVERRIDE.match(text)
    if not m:
        raise ConfigError('', 'bad override {!r}: expected '
                          'section.key=value, e.g. train.lr=0.05'.format(text))
    text = m.group(2).strip()
    if text.startswith('@'):
        # YAML reserves '@' (no YAML value starts with it): a device
        # specifier such as @cupy:0 is read as that string
        return m.group(1).split('.'), text
    try:
        value = yaml.safe_load(m.group(2)) if text else None
    except (yaml.YAMLError, ValueError) as e:
        raise ConfigError(m.group(1), 'override value {} is not valid '
                          'YAML: {}'.format(_short(m.group(2)),
                                            yaml_reason(e)))
    return m.group(1).split('.'), value


def apply_overrides(raw, overrides):
    """Sets each ``key.path=value`` of ``overrides`` in a copy of ``raw``."""
    raw = copy.deepcopy(raw)
    for text in overrides or ():
        path, value = parse_override(text)
        node = raw
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError('.'.join(path[:i + 1]),
                                  'is not a section; cannot set {}'.format(
                                      '.'.join(path)))
            node = child
        node[path[-1]] = value
    return raw


def load(cls, path=None, overrides=(), raw=None):
    """Reads, overrides and checks a config of class ``cls``.

    Args:
        cls: the config dataclass.
        path (str): YAML file, or ``None`` for the defaults (or ``raw``).
        overrides (list of str): ``key.path=value`` items.
        raw (dict): a raw config used instead of a file.
    """
    base = read_yaml(path) if path else copy.deepcopy(raw or {})
    return from_dict(cls, apply_overrides(base, overrides))


def dump(cfg):
    """YAML text of a config (a dataclass or a plain dict)."""
    if dataclasses.is_dataclass(cfg):
        cfg = to_dict(cfg)
    return yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None)


def describe(cls, prefix=''):
    """``--help-config``: ``section.key: expected (default ...) -- doc``
    lines, generated from the types."""
    lines = []
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines.extend(describe(tp, prefix + f.name + '.'))
            continue
        default = f.default if f.default is not dataclasses.MISSING \
            else f.default_factory()
        lines.append('{}{}: {} (default {!r}) -- {}'.format(
            prefix, f.name, expected_text(tp, f.metadata), default,
            f.metadata.get('doc', '')))
    return lines
