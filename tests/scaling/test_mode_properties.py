"""Property-based tests of the loss-scaling mode parser
(:func:`parse_mode`), of the methods a mode makes
(:func:`make_loss_scaling`, which checks the options' values) and of fixed
scales: every text either parses to a spec whose text parses back to an
equal spec, or raises a ValueError naming the text, the option and the
specific reason (docs/reliability.md).

Equality is the parsed object's (``LossScalingSpec``), so the property
holds whatever canonical spelling ``str`` gives a mode."""
import math

import warnings

from hypothesis import given, settings, strategies as st

from ada_loss.experiment.config import ConfigError, FixedScale
from ada_loss.scaling import make_loss_scaling, parse_mode
from ada_loss.scaling.modes import _allowed_options

from property_helpers import assert_specific, examples

OPTIONED = ('dynamic', 'adaptive', 'amax')
OPTIONS = sorted({k for m in OPTIONED for k in _allowed_options(m)})
VALUES = ['true', 'false', 'True', 'none', 'null', 'auto', '0', '1', '-1',
          '2', '0.5', '1e-3', '1e3', '65504', '1e400', 'nan', 'inf', '-inf',
          '', ' ', 'pytorch', 'chainer', 'tf', 'TF', 'output', 'product',
          'gauss', 'float16', 'fp8_e4m3', 'e9m9', '9' * 5000, '1_000',
          '0x10', '٣']

_value = st.sampled_from(VALUES) | st.floats().map(repr) | st.integers(
    -2 ** 80, 2 ** 80).map(str) | st.text(max_size=6)
_key = st.sampled_from(OPTIONS) | st.text(max_size=4)
_option = st.builds('{}={}'.format, _key, _value) | st.sampled_from(
    ['', 'guard', '=1'])


def _variants(text):
    return st.sampled_from([text, text.upper(), ' {} '.format(text),
                            text.replace(',', ' , ')])


mode_texts = st.one_of(
    st.sampled_from(['fp32', 'none', 'fixed', 'fixed:', 'fp32:1']),
    st.builds('fixed:{}'.format, _value),
    st.builds(lambda m, o: m + ':' + ','.join(o),
              st.sampled_from(OPTIONED + ('none', 'fixd')),
              st.lists(_option, max_size=4)),
    st.text(max_size=20),
).flatmap(_variants)

PRECISIONS = st.sampled_from([None, 'mixed16', 'float32', 'fp8', 'fp8_e4m3',
                              'mxfp8', 'bf16'])


def _option_keys(text):
    """The option keys of an optioned mode whose items are key=value with
    allowed keys (then an error must name one of them)."""
    name, _, arg = text.strip().partition(':')
    name = name.strip().lower()
    if name not in OPTIONED:
        return None
    items = [i.strip() for i in arg.split(',') if i.strip()]
    keys = [i.partition('=')[0].strip() for i in items]
    if all('=' in i for i in items) and set(keys) <= set(
            _allowed_options(name)):
        return keys
    return None


not_texts = st.one_of(st.none(), st.integers(), st.floats(), st.binary(),
                      st.lists(st.text(max_size=3), max_size=2))


@given(mode_texts | not_texts)
def test_modes_round_trip_or_say_why(text):
    try:
        spec = parse_mode(text)
    except ValueError as e:
        if not isinstance(text, str):
            assert_specific(e, 'must be a string')
            return
        # the text, its argument or the option item at fault
        arg = text.strip().partition(':')[2]
        assert_specific(e, repr(text), repr(text.strip()), repr(arg),
                        *[repr(i.strip()) for i in arg.split(',')])
    else:
        assert parse_mode(str(spec)) == spec
        assert parse_mode(spec) is spec
        for v in spec.options.values():      # NaN never equals itself
            assert not (isinstance(v, float) and math.isnan(v)), spec


@settings(max_examples=examples(1000))
@given(mode_texts, PRECISIONS)
def test_methods_build_or_name_the_option(text, precision):
    try:
        with warnings.catch_warnings():    # "not a power of two"
            warnings.simplefilter('ignore')
            method = make_loss_scaling(text, precision)
    except ValueError as e:
        assert_specific(e, repr(text), repr(text.strip()), 'mode',
                        'precision', 'option', 'scale')
        keys = _option_keys(text)
        if keys:    # the reason (after the mode's text) names the option
            reason = str(e).split(': ', 1)[-1]
            values = [i.partition('=')[2].strip() for i in
                      text.strip().partition(':')[2].split(',')]
            assert any(k in reason for k in keys + ['style']) or any(
                repr(v) in reason for v in values), str(e)
    else:
        assert math.isfinite(method.scale) and method.scale > 0


@given(st.one_of(st.integers(), st.floats(), st.booleans(), st.none(),
                 st.text(max_size=5),
                 st.integers(10 ** 300, 10 ** 320)))
def test_fixed_scales_are_positive_finite_or_refused(scale):
    """``grid.fixed_scales`` (:class:`FixedScale`): a positive finite
    scale whose mode text ``fixed:S`` names it exactly, or a ConfigError."""
    try:
        s = FixedScale.parse(scale, 'grid.fixed_scales[0]')
    except ConfigError as e:
        assert_specific(e, "'grid.fixed_scales[0]'")
    else:
        assert isinstance(s, float) and 0 < s < math.inf
        spec = parse_mode('fixed:{!r}'.format(s))
        again = parse_mode(str(spec))
        assert again == spec and again.options['scale'] == s


def test_a_fixed_scale_of_thousands_of_digits_is_refused_by_key():
    try:
        FixedScale.parse(10 ** 5000, 'grid.fixed_scales[0]')
    except ConfigError as e:
        assert_specific(e, "'grid.fixed_scales[0]'", 'positive finite')
    else:
        raise AssertionError('accepted')
