"""Property-based tests of the precision parser (:func:`parse_precision`):
every text either parses to a Precision whose canonical name parses back
to the same object, or raises a ValueError naming the text and, for a
scaled precision's option, the option and its specific reason
(docs/reliability.md)."""
from hypothesis import given, strategies as st

from ada_loss.precision import parse_precision

from property_helpers import assert_specific

PLAIN = ['float32', 'mixed16', 'bf16', 'fp8', 'fp8_e4m3', 'fp8_e5m2']
MX = ['mxfp8', 'mxfp6', 'mxfp4']
PER_TENSOR = ['fp8', 'fp8_e4m3', 'fp8_e5m2']
KEYS = ['recipe', 'history', 'margin', 'pow2', 'out', 'block', 'scale']
VALUES = ['current', 'delayed', 'true', 'false', 'bf16', 'fp32', 'float32',
          'bfloat16', 'up', 'floor', '0', '-1', '1', '32', '1024', '1e3',
          'nan', 'inf', '1.5', '', '-0', '+3', '٣', '9' * 5000, 'foo']
FORMATS = ['float32', 'float16', 'bfloat16', 'fp8_e4m3', 'e5m2', 'e3m0',
           'e9m1', 'float8_e4m3fn', 'fp4_e2m1', 'x', '']

_value = st.sampled_from(VALUES) | st.integers(-2 ** 70, 2 ** 70).map(str) \
    | st.text(max_size=6)
_key = st.sampled_from(KEYS) | st.text(max_size=4)
_option = st.builds('{}={}'.format, _key, _value) | st.sampled_from(
    ['', 'block', '=', 'recipe=current=1'])


def _variants(text):
    """The text, upper-cased or with spaces (the parser ignores both)."""
    return st.sampled_from([text, text.upper(), ' {} '.format(text),
                            text.replace(',', ' , ')])


_scaled = st.builds(
    lambda base, opts: base + ':' + ','.join(opts),
    st.sampled_from(MX + PER_TENSOR + ['bf16', 'fp7']),
    st.lists(_option, max_size=4))
_fwd_bwd = st.builds('fwd={},bwd={}'.format, st.sampled_from(FORMATS),
                     st.sampled_from(FORMATS))

precision_texts = st.one_of(
    st.sampled_from(PLAIN + MX), _scaled, _fwd_bwd, st.text(max_size=20),
).flatmap(_variants)
#: what a YAML value may hold instead of a name
not_texts = st.one_of(st.none(), st.integers(), st.floats(), st.binary(),
                      st.lists(st.text(max_size=3), max_size=2))


def _well_formed_options(text):
    """The option keys of a scaled text if they are allowed and distinct
    (then an error must name the option or value at fault)."""
    base, _, arg = text.strip().lower().replace(' ', '').partition(':')
    items = [i for i in arg.split(',') if i]
    keys = [i.partition('=')[0] for i in items]
    allowed = ('block', 'scale', 'out') if base in MX else (
        'recipe', 'history', 'margin', 'pow2', 'out')
    if base in MX + PER_TENSOR and ':' in text and all(
            '=' in i for i in items) and len(set(keys)) == len(keys) \
            and set(keys) <= set(allowed):
        return keys
    return None


@given(precision_texts | not_texts)
def test_precisions_round_trip_or_say_why(text):
    try:
        p = parse_precision(text)
    except ValueError as e:
        assert_specific(e, repr(text))
        if not isinstance(text, str):
            assert 'precision must be a string' in str(e)
            return
        keys = _well_formed_options(text)
        if keys is not None and keys:     # the reason names an option
            assert any(k in str(e).split(': ', 1)[1] for k in keys), str(e)
    else:
        assert parse_precision(p.name) == p
        assert parse_precision(str(p)).name == p.name
        assert parse_precision(p) is p


def test_the_reason_of_each_named_defect_is_given():
    """The issue's examples: the library's own reason, not the list."""
    for text, reason in [
            ('mxfp8:block=0', 'block must be an integer ≥ 1, got 0'),
            ('fp8:recipe=foo', "recipe=current or recipe=delayed is "
                               "required, got 'foo'"),
            ('fp8:recipe=delayed,history=-1',
             'history must be an integer in 1..1048576, got -1')]:
        try:
            parse_precision(text)
        except ValueError as e:
            assert reason in str(e), str(e)
        else:
            raise AssertionError(text)
