"""Parsing and validation of the loss-scaling mode (and the precision it
runs in), and the method a mode makes (:func:`make_loss_scaling`)."""
import collections
import inspect
import math

import numpy

from ada_loss.formats import canonical_format, get_format
from ada_loss.loss_scale.checks import stored_number
from ada_loss.loss_scale.dynamic import (
    check_style, style_defaults, style_option_kinds)
from ada_loss.precision import parse_precision
from ada_loss.scaling.methods import (
    AdaptiveScaling, AmaxScaling, DynamicScaling, FixedScaling, NoScaling)

MODES = ('fp32', 'none', 'fixed', 'dynamic', 'adaptive', 'amax')

_MODE_HELP = ('fp32, none, fixed:S (S a positive number, e.g. fixed:128), '
              'dynamic[:key=value,...], adaptive[:key=value,...], '
              'amax[:key=value,...]')


class LossScalingSpec(collections.namedtuple('LossScalingSpec',
                                             ('name', 'options'))):
    """A parsed mode: ``name`` in :data:`MODES`, ``options`` a dict.

    :func:`parse_mode` makes it canonical (as :func:`parse_precision` does
    a precision): the name and text values lower case, a format by its one
    name (``fmt=float8_e4m3fn`` -> ``fmt=fp8_e4m3``), a number as the
    method stores it (an int, a double, or a double rounded to float32
    where the method keeps it in float32: ``dynamic:init_scale=1000.00001``
    is ``init_scale=1000``), options equal to their default left out, so
    every spelling of one mode is one spec, and ``str(spec)``
    (:meth:`text`) its one canonical text (``DYNAMIC:style=Chainer`` ->
    ``dynamic:style=chainer``; ``dynamic:style=pytorch`` -> ``dynamic``;
    ``amax:margin=8`` -> ``amax``; ``fixed:1e3`` -> ``fixed:1000``), used
    for folder names, ``run.json`` and tables. Numbers print by one rule
    (:func:`_value_text`)."""

    __slots__ = ()

    def __hash__(self):     # options is a dict: hash what equality compares
        return hash((self.name, tuple(sorted(self.options))))

    def __str__(self):
        if self.name == 'fixed':
            return 'fixed:' + _value_text(self.options['scale'])
        if not self.options:
            return self.name
        kinds = _option_kinds(self.name, self.options.get('style'))
        return '{}:{}'.format(self.name, ','.join(
            '{}={}'.format(k, _value_text(v, kinds.get(k) == 'float32'))
            for k, v in sorted(self.options.items())))

    def text(self):
        """The canonical text of the mode (``str(self)``)."""
        return str(self)


def _value_text(v, single=False):
    """An option value (or a fixed scale) in the canonical text, by one
    rule for every number: a double that is an integer below 2^53 in
    magnitude as that integer (``65536``, not ``65536.0`` nor
    ``6.5536e+04``), any other in the fewest digits that read back as the
    same value, written as Python's ``repr`` writes a double (``0.001``,
    ``1e+16``, ``inf``); an int in digits; a boolean and None as a mode
    string spells them (``guard=false``, ``none``). ``single``: the value
    is stored as a float32 (:func:`_canonical_options`), so "the same
    value" is the same float32 (``0.8``, not ``0.800000011920929``, for
    float32's 0.8). Which of int, double and float32 a number is, is the
    option's, so one stored value has one text."""
    if isinstance(v, bool):
        return 'true' if v else 'false'     # as written in a mode string
    if v is None:
        return 'none'
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 2 ** 53:
            return str(int(v))
        if single and _is_float32(v):
            # float32's shortest digits, as a double: its repr is those
            # digits (no shorter text is nearer the float32 value)
            v = float(numpy.format_float_scientific(
                numpy.float32(v), unique=True, trim='-'))
        return repr(v)
    return str(v)


def _is_float32(v):
    """Whether the double ``v`` is a finite float32 value."""
    with numpy.errstate(over='ignore'):
        return math.isfinite(v) and float(numpy.float32(v)) == v


def _number(text, what):
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ValueError('{} must be a number, got {!r}'.format(what, text))


def _parse_value(text):
    low = text.strip().lower()
    if low in ('true', 'false'):
        return low == 'true'
    if low in ('none', 'null'):
        return None
    try:
        v = float(text)
    except ValueError:
        return text.strip()
    if v.is_integer() and 'e' not in low and '.' not in low:
        try:
            return int(low)     # every digit (float() rounds beyond 2^53)
        except ValueError:      # digits beyond int()'s limit
            return v
    return v


def _option_defaults(name):
    """{option: default} of a mode's method (its keyword arguments)."""
    cls = {'dynamic': DynamicScaling,
           'adaptive': AdaptiveScaling,
           'amax': AmaxScaling}[name]
    sig = inspect.signature(cls.__init__)
    return {k: p.default for k, p in sig.parameters.items() if k != 'self'}


def _allowed_options(name):
    return list(_option_defaults(name))


def _option_kinds(name, style):
    """{numeric option: how the method stores it} (``'int'``, ``'float'``,
    ``'float32'``), the methods' own tables; a dynamic ``style`` None is
    the default style, an unknown one has none (its options are not
    rounded: make_loss_scaling names the style)."""
    if name == 'dynamic':
        try:
            return style_option_kinds('pytorch' if style is None else style)
        except ValueError:
            return {}
    return {'adaptive': AdaptiveScaling, 'amax': AmaxScaling}[
        name].option_kinds


def _canonical_format(value):
    """A format option's value by its one name (``float8_e4m3fn`` and
    ``FP8_E4M3`` are ``fp8_e4m3``, ``e5m2`` is ``fp8_e5m2``); a value that
    names no format as given (the method names it)."""
    try:
        return canonical_format(value).name
    except ValueError:
        return value


def _canonical_options(name, options):
    """``options`` as the method stores them, without those equal to their
    default (a dynamic style's own defaults included): text values lower
    case (the methods read them case-insensitively: style, bound,
    init_scale=auto), a format by its one name, a number as the method
    stores it (:func:`~ada_loss.loss_scale.checks.stored_number`), so that
    two spellings of one state are one spec and one text."""
    options = {k: v.lower() if isinstance(v, str) else v
               for k, v in options.items()}
    if isinstance(options.get('fmt'), str):
        options['fmt'] = _canonical_format(options['fmt'])
    defaults = {k: [v] for k, v in _option_defaults(name).items()}
    style = None
    if name == 'dynamic':
        given = options.get('style')
        try:
            # (None is the default style; 0 or false is no style)
            style = check_style('pytorch' if given is None else given)
        except ValueError:
            pass                    # make_loss_scaling names the bad style
        if style is not None:
            options['style'] = style
            for k, v in style_defaults(style).items():
                defaults[k].append(v)
    kinds = _option_kinds(name, options.get('style'))
    for k, v in options.items():
        if k in kinds:
            options[k] = stored_number(kinds[k], v)
        elif isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 53:
            # a number no method stores here (an option of another dynamic
            # style: refused when built) as its text reads back: 2.0 is 2
            options[k] = int(v)
    if name == 'adaptive':
        # the overflow bound's default follows the style: the paper's text
        # takes this project's 'output', the authors' code its 'fan_in'
        style = options.get('style') or 'paper'
        defaults.setdefault('bound', []).append(
            'fan_in' if style == 'authors' else 'output')
    return {k: v for k, v in options.items()
            if not any(_same(v, d) for d in defaults.get(k, ()))}


def _same(value, default):
    """Whether an option value is its default (``True`` is not ``1``)."""
    if isinstance(value, bool) or isinstance(default, bool) or \
            value is None or default is None:
        return value is default
    return value == default


def parse_mode(spec):
    """Parses a mode string (or returns a :class:`LossScalingSpec` as is).

    Raises:
        ValueError: naming the allowed modes and options.
    """
    if isinstance(spec, LossScalingSpec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError('loss-scaling mode must be a string, one of: {}; '
                         'got {!r}'.format(_MODE_HELP, spec))
    name, _, arg = spec.strip().partition(':')
    name = name.strip().lower()
    if name not in MODES:
        raise ValueError('unknown loss-scaling mode {!r}; expected one of: {}'
                         .format(spec, _MODE_HELP))
    if name in ('fp32', 'none'):
        if arg:
            raise ValueError('mode {!r} takes no argument, got {!r}'
                             .format(name, spec))
        return LossScalingSpec(name, {})
    if name == 'fixed':
        if not arg:
            raise ValueError('mode fixed needs a scale: fixed:S with S > 0, '
                             'e.g. fixed:128; got {!r}'.format(spec))
        scale = _number(arg, 'the scale S of fixed:S')
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError('the scale S of fixed:S must be a positive '
                             'finite number, got {!r}'.format(arg))
        return LossScalingSpec('fixed', {'scale': scale})
    options = {}
    allowed = _allowed_options(name)
    for item in filter(None, (s.strip() for s in arg.split(','))):
        key, eq, value = item.partition('=')
        key = key.strip()
        if key in options:
            raise ValueError('bad option {!r} for mode {}: {} is given '
                             'twice'.format(item, name, key))
        if not eq or key not in allowed:
            raise ValueError('bad option {!r} for mode {}; expected '
                             'key=value with key one of: {}'
                             .format(item, name, ', '.join(allowed)))
        options[key] = _parse_value(value)
        if isinstance(options[key], float) and math.isnan(options[key]):
            # no option means anything by NaN (and NaN != NaN: a spec
            # holding it would not equal itself)
            raise ValueError('bad option {!r} for mode {}: {} must be a '
                             'number, not NaN'.format(item, name, key))
    return LossScalingSpec(name, _canonical_options(name, options))


def resolved_mode(mode, precision=None):
    """The canonical text of ``mode`` with *every* option written out, its
    defaults included (``adaptive`` in fp8_e4m3 is
    ``adaptive:backoff_window=100,bound=output,fmt=fp8_e4m3,...,
    init_scale=format,...``): what the mode meant when a run ran, which a
    later change of a default cannot change (issue 47: ``adaptive``'s
    ``init_scale`` default moved from 1 to ``format``). ``fmt`` None is the
    format the method targets in ``precision`` (float16 when None),
    ``bound`` None the style's; a dynamic mode's options are its style's.
    It parses back to a mode that builds the same method in ``precision``."""
    spec = parse_mode(mode)
    if spec.name in ('fp32', 'none', 'fixed'):
        return str(spec)
    options = dict(_option_defaults(spec.name))
    if spec.name == 'dynamic':
        style = check_style(spec.options.get('style') or 'pytorch')
        options = dict(style_defaults(style), style=style)
    options.update(spec.options)
    if 'fmt' in options:
        options['fmt'] = make_loss_scaling(spec, precision).fmt.name
    if spec.name == 'adaptive' and options.get('bound') is None:
        options['bound'] = 'fan_in' if options.get('style') == 'authors' \
            else 'output'
    return str(LossScalingSpec(spec.name, options))


def resolve_precision(mode, precision=None):
    """The precision a run uses (its canonical name): ``fp32`` implies
    float32, other modes default to mixed16.

    An explicit ``precision`` (see :mod:`ada_loss.precision`) is
    allowed for every mode but ``fp32`` (which *is* float32): e.g.
    ``adaptive`` in ``fp8``, or ``fixed:S`` in float32 for tests.
    """
    spec = parse_mode(mode)
    if precision is None:
        return 'float32' if spec.name == 'fp32' else 'mixed16'
    name = parse_precision(precision).name
    if spec.name == 'fp32' and name != 'float32':
        raise ValueError('mode fp32 means no mixed precision; it cannot run '
                         'with precision {!r} (use mode none for low '
                         'precision without loss scaling)'.format(name))
    return name


def make_loss_scaling(mode, precision=None):
    """The :class:`LossScaling` of a mode string (see :func:`parse_mode`),
    targeting the gradient format of ``precision`` (default: float16, as in
    mixed16; see :mod:`ada_loss.precision`). ``mode`` None: the precision's
    default mode (``none`` for a scaled precision such as ``mxfp8``; there
    is none for one with ``grad=loss``).

    Raises:
        ValueError: a bad mode or option, or a fixed scale that is not
            below the gradient format's largest value.
    """
    if mode is None:
        default = None if precision is None else \
            parse_precision(precision).default_mode
        if default is None:
            raise ValueError('no loss-scaling mode given, and precision {!r} '
                             'has no default (only the scaled precisions '
                             'do: none; not with grad=loss, whose gradients '
                             'need loss scaling)'.format(precision))
        mode = default
    spec = parse_mode(mode)
    fmt = get_format('float16')
    if precision is not None:
        fmt = parse_precision(precision).grad_format
    if spec.name in ('fp32', 'none'):
        method = NoScaling()
    elif spec.name == 'fixed':
        if not spec.options['scale'] < fmt.u_max:
            raise ValueError(
                'fixed loss scale {:g} is not below the largest value {:g} '
                'of the gradient format {}: the scaled loss gradient itself '
                'would overflow'.format(spec.options['scale'], fmt.u_max,
                                        fmt))
        method = FixedScaling(spec.options['scale'])
    else:
        cls = {'dynamic': DynamicScaling, 'adaptive': AdaptiveScaling,
               'amax': AmaxScaling}[spec.name]
        try:
            method = cls(**spec.options)
            if isinstance(method, AdaptiveScaling):
                method.set_format(fmt)
        except (TypeError, ValueError, OverflowError) as e:
            # e.g. a string where a number is needed, int(inf) for an
            # interval (OverflowError), an out-of-range value
            raise ValueError('bad options for mode {}: {}'.format(spec, e))
    if not isinstance(method, AdaptiveScaling):
        method.fmt = fmt
    return method
