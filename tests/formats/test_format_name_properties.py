"""Property-based tests of the format-name parser (:func:`get_format`) and
of :func:`make_recipe`'s checks: every text either names a format whose own
name parses back to the same object, or raises a ValueError that names the
text and lists what is accepted (docs/reliability.md)."""
from hypothesis import given, settings, strategies as st

from ada_loss.formats import get_format, make_recipe
from ada_loss.formats.float_format import ML_DTYPES_NAMES

from property_helpers import assert_specific, examples

NAMES = sorted(set(ML_DTYPES_NAMES) | set(ML_DTYPES_NAMES.values()))

#: e<E>m<M> with digits of any length (leading zeros, huge numbers)
_ieee = st.builds('e{}m{}'.format, st.integers(0, 40) | st.text(
    '0123456789', min_size=1, max_size=30) | st.just('9' * 5000),
    st.integers(0, 40) | st.text('0123456789', min_size=1, max_size=30))


def _cased(s):
    return st.sampled_from([s, s.upper(), s.title(), ' {} '.format(s),
                            s + '\t', s[:-1], s + 'x'])


format_texts = st.one_of(
    st.sampled_from(NAMES).flatmap(_cased),
    _ieee.flatmap(_cased),
    st.text(max_size=12),
    st.text('efm0123456789_p', max_size=10),
)
#: what a YAML value or a caller may pass instead of a name
not_texts = st.one_of(st.none(), st.integers(), st.floats(), st.binary(),
                      st.lists(st.integers(), max_size=3),
                      st.dictionaries(st.text(max_size=3), st.integers(),
                                      max_size=2))


@given(format_texts | not_texts)
def test_format_names_round_trip_or_name_the_text(text):
    try:
        fmt = get_format(text)
    except ValueError as e:     # the text as given, or as normalized
        assert_specific(e, repr(text), repr(str(text).strip().lower()))
    else:
        assert get_format(fmt.name) is fmt
        assert get_format(str(fmt)) is fmt


_numbers = st.one_of(st.integers(-10, 10 ** 6), st.floats(allow_nan=True),
                     st.text(max_size=4), st.none(), st.booleans())


@settings(max_examples=examples(1000))
@given(kind=st.sampled_from(['current', 'delayed', 'mx', 'foo', '']),
       history=_numbers, margin=_numbers, block=_numbers,
       scale=st.sampled_from(['up', 'floor', 'UP', '', 'x']),
       out=st.sampled_from(['float32', 'bfloat16', 'float16', 'bf16', 'e9m9']))
def test_make_recipe_refuses_with_the_option_named(kind, history, margin,
                                                   block, scale, out):
    try:
        recipe = make_recipe(kind, 'fp8_e4m3', 'fp8_e5m2', history=history,
                             margin=margin, block_size=block,
                             scale_rounding=scale, out=out)
    except ValueError as e:
        assert_specific(e, 'recipe', 'history', 'margin', 'block', 'scale',
                        'out', 'format')
    else:
        assert recipe.history >= 1 and recipe.block_size >= 1
        for v in (recipe.history, recipe.margin, recipe.block_size):
            assert type(v) is int
        assert recipe.history <= 2 ** 20 and -126 <= recipe.margin <= 127
