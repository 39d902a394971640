"""What the property tests of the parsers share (docs/reliability.md): how
many inputs a slow property gets under the active Hypothesis profile, and
what a "specific" error message is."""
import re

from hypothesis import settings

#: inputs of the ``ci`` profile per string parser (tests/conftest.py)
CI_EXAMPLES = 10000

#: phrases of Python's own exceptions leaking through a parser: a message
#: holding one says what broke inside, not what the input should have been
INTERNAL = re.compile(
    r"not supported between instances|object is not|has no attribute|"
    r"invalid literal for|could not convert|unhashable type|"
    r"argument must be|takes \d+ positional|unexpected keyword|"
    r"Exceeds the limit|index out of range|^\S+Error\b|"
    r"cannot convert float|object of type")


def examples(ci):
    """``ci`` inputs under the ``ci`` profile, scaled with the active
    profile's ``max_examples`` (nightly: ten times as many), at least 10."""
    return max(10, ci * settings.default.max_examples // CI_EXAMPLES)


def assert_specific(error, *names):
    """``error``'s message is one line, holds no leaked Python-internal
    phrase and names at least one of ``names`` (the input, its key or the
    option at fault)."""
    text = str(error)
    assert '\n' not in text, text
    assert not INTERNAL.search(text), text
    if names:
        assert any(n in text for n in names), (names, text)
