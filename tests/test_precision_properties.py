"""Property-based tests of the precision parser (:func:`parse_precision`):
every text either parses to a Precision whose canonical name parses back
to the same object, or raises a ValueError naming the text and, for a
scaled precision's option, the option and its specific reason
(docs/reliability.md)."""
from hypothesis import given, settings, strategies as st

from ada_loss.precision import parse_precision

from property_helpers import assert_specific, examples

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


# -- one precision, one name (issue 50, item 6) -----------------------------
#: spellings of one format each (aliases, case)
ONE_FORMAT = [['fp8_e4m3', 'float8_e4m3fn', 'FP8_E4M3'],
              ['fp8_e5m2', 'float8_e5m2', 'e5m2', 'E05M02'],
              ['e4m3', 'float8_e4m3', 'e04m3'], ['e3m0', 'E3M0'],
              ['float32', 'e8m23', 'Float32'], ['bfloat16', 'e8m7'],
              ['float16', 'e5m10'], ['fp4_e2m1', 'float4_e2m1fn'],
              ['fp6_e3m2', 'float6_e3m2fn']]
#: spellings of one scaled precision each (integers and words as parsed)
ONE_SCALED = [['mxfp8', 'mxfp8:block=32', 'mxfp8:block=032', 'MXFP8:block=+32'],
              ['mxfp8:block=16', 'mxfp8:block=1_6', 'mxfp8:block=0016'],
              ['mxfp8:out=bf16', 'mxfp8:out=bfloat16', 'mxfp8:out=BF16'],
              ['fp8:recipe=delayed,history=16',
               'fp8:history=016,recipe=delayed'],
              ['fp8:recipe=current', 'fp8:recipe=current,out=fp32',
               'fp8:recipe=current,out=float32,pow2=false']]


def _named_state(p):
    """What a precision builds: its formats' numbers, storage and recipe
    (formats by their numbers)."""
    def numbers(f):
        return (f.exp_bits, f.man_bits, f.emax, f.overflow)
    recipe = None if p.recipe is None else tuple(
        numbers(v) if hasattr(v, 'exp_bits') else v for v in p.recipe)
    return numbers(p.fwd), numbers(p.bwd), p.storage, recipe


@st.composite
def _one_precision(draw):
    """A spelling of a fwd=,bwd= pair, of a named precision, or of a
    scaled one."""
    kind = draw(st.sampled_from(['pair', 'named', 'scaled']))
    if kind == 'pair':
        i, j = (draw(st.integers(0, len(ONE_FORMAT) - 1)) for _ in 'ij')
        return 'fwd={},bwd={}'.format(draw(st.sampled_from(ONE_FORMAT[i])),
                                      draw(st.sampled_from(ONE_FORMAT[j])))
    if kind == 'named':
        return draw(st.sampled_from(PLAIN)).upper() if draw(
            st.booleans()) else draw(st.sampled_from(PLAIN))
    return draw(st.sampled_from(draw(st.sampled_from(ONE_SCALED))))


@settings(max_examples=examples(1000))
@given(_one_precision(), _one_precision())
def test_one_precision_one_name(a, b):
    """Two spellings have one canonical name exactly when they build the
    same precision (fwd=bfloat16,bwd=e8m7 is bf16), and the name parses
    back to it."""
    pa, pb = parse_precision(a), parse_precision(b)
    assert parse_precision(pa.name) == pa and parse_precision(pb.name) == pb
    assert (_named_state(pa) == _named_state(pb)) == (pa.name == pb.name), \
        (a, b, pa.name, pb.name)
