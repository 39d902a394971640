"""One configuration, one text (issue 50, items 6 and 7): a mode's and a
precision's canonical text names run folders and table columns, so two
spellings print the same text exactly when they build the same state.

* Format aliases (``fp8_e4m3`` / ``float8_e4m3fn``, ``float32`` /
  ``e8m23``, ``e5m2`` / ``fp8_e5m2``, ...) print one name, in modes
  (``adaptive:fmt=``) and precisions (``fwd=,bwd=``; a pair a named
  precision holds is that precision).
* Numbers print as the method stores them: ``1e16`` and
  ``10000000000000000`` are one text; ``dynamic:init_scale=1000.00001`` is
  ``dynamic:init_scale=1000`` (PyTorch's style keeps the scale in float32),
  while Chainer's style (a double) keeps them apart.
* A property test over generated spellings (aliases in any case, numbers
  as int, float, exponent, trailing zeros, float32-equal variants, option
  order): equal built state <=> equal text, and the text parses back to the
  same spec.
* The texts of the committed results print as before.
"""
import warnings

import chainer
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ada_loss.precision import parse_precision
from ada_loss.scaling import (
    AdaptiveScaling, DynamicScaling, FixedScaling, make_loss_scaling,
    parse_mode)

from property_helpers import examples


def _text(mode):
    return str(parse_mode(mode))


# -- item 6: format aliases ------------------------------------------------
@pytest.mark.parametrize('spellings, text', [
    (['adaptive:fmt=fp8_e4m3', 'adaptive:fmt=float8_e4m3fn',
      'ADAPTIVE:fmt=Float8_E4M3FN'], 'adaptive:fmt=fp8_e4m3'),
    (['adaptive:fmt=float32', 'adaptive:fmt=e8m23'], 'adaptive:fmt=float32'),
    (['adaptive:fmt=fp4_e2m1', 'adaptive:fmt=float4_e2m1fn'],
     'adaptive:fmt=fp4_e2m1'),
    (['amax:fmt=fp8_e5m2', 'amax:fmt=float8_e5m2', 'amax:fmt=e5m2',
      'amax:fmt=e05m02'], 'amax:fmt=fp8_e5m2'),
    (['adaptive:fmt=e4m3', 'adaptive:fmt=float8_e4m3', 'adaptive:fmt=e04m3'],
     'adaptive:fmt=e4m3'),
    (['adaptive:fmt=bfloat16', 'adaptive:fmt=e8m7'], 'adaptive:fmt=bfloat16'),
    (['adaptive:fmt=fp6_e3m2', 'adaptive:fmt=float6_e3m2fn'],
     'adaptive:fmt=fp6_e3m2'),
])
def test_format_aliases_in_a_mode_print_one_name(spellings, text):
    assert {_text(s) for s in spellings} == {text}
    assert len({parse_mode(s) for s in spellings}) == 1
    # and the same format object reaches the method
    fmts = {make_loss_scaling(s, 'mixed16').fmt.name for s in spellings}
    assert fmts == {text.rpartition('=')[2]}


def test_distinct_formats_keep_distinct_names():
    """OCP E4M3 (max 448, no Inf) is not IEEE-style e4m3 (max 240)."""
    assert _text('adaptive:fmt=fp8_e4m3') != _text('adaptive:fmt=e4m3')
    assert _text('adaptive:fmt=fp6_e3m2') != _text('adaptive:fmt=e3m2')


@pytest.mark.parametrize('spellings, name', [
    (['fp8_e4m3', 'fwd=fp8_e4m3,bwd=fp8_e4m3',
      'fwd=float8_e4m3fn,bwd=FP8_E4M3'], 'fp8_e4m3'),
    (['fp8_e5m2', 'fwd=e5m2,bwd=e5m2', 'fwd=float8_e5m2,bwd=fp8_e5m2'],
     'fp8_e5m2'),
    (['bf16', 'fwd=bfloat16,bwd=e8m7'], 'bf16'),
    (['float32', 'fwd=e8m23,bwd=float32'], 'float32'),
    (['fp8', 'fwd=float8_e4m3fn,bwd=e5m2'], 'fp8'),
    (['fwd=float16,bwd=fp8_e5m2', 'fwd=e5m10,bwd=e5m2',
      'fwd=float16,bwd=float8_e5m2'], 'fwd=float16,bwd=fp8_e5m2'),
    (['fwd=float16,bwd=e4m3', 'fwd=float16,bwd=float8_e4m3',
      'fwd=float16,bwd=e04m3'], 'fwd=float16,bwd=e4m3'),
])
def test_format_aliases_in_a_precision_print_one_name(spellings, name):
    parsed = [parse_precision(s) for s in spellings]
    assert {p.name for p in parsed} == {name}
    assert all(p == parsed[0] for p in parsed)
    assert parse_precision(name) == parsed[0]


def test_fp16_storage_is_not_an_emulated_pair():
    """mixed16 stores float16 arrays; fwd=float16,bwd=float16 emulates them
    in float32: two states, two names."""
    assert parse_precision('fwd=float16,bwd=float16').name != 'mixed16'


# -- item 7: numbers --------------------------------------------------------
@pytest.mark.parametrize('spellings, text', [
    (['dynamic:init_scale=1e16', 'dynamic:init_scale=10000000000000000',
      'dynamic:init_scale=1.0E+16', 'dynamic:init_scale=10000000272564224'],
     'dynamic:init_scale=1e+16'),
    # PyTorch's scale is a float32: 1000.00001 is 1000.0 there
    (['dynamic:init_scale=1000.00001', 'dynamic:init_scale=1000',
      'dynamic:init_scale=1e3', 'dynamic:init_scale=1000.000'],
     'dynamic:init_scale=1000'),
    (['dynamic:style=tf,decr_ratio=0.8', 'dynamic:decr_ratio=8e-1,style=tf',
      'dynamic:style=tf,decr_ratio=0.80000001'],
     'dynamic:decr_ratio=0.8,style=tf'),
    (['dynamic:init_scale=65536.001', 'dynamic', 'dynamic:init_scale=65536.0'],
     'dynamic'),
    (['amax:history=7', 'amax:history=7.0', 'amax:history=7e0'],
     'amax:history=7'),
    (['adaptive:max_layer_scale=128', 'adaptive:max_layer_scale=128.0',
      'adaptive:max_layer_scale=1.28e2'], 'adaptive:max_layer_scale=128'),
    (['fixed:2000000', 'fixed:2e6', 'fixed:2000000.0'], 'fixed:2000000'),
    (['fixed:1048576', 'fixed:1048576.0', 'fixed:1.048576e6'],
     'fixed:1048576'),
    (['fixed:1e16', 'fixed:10000000000000000'], 'fixed:1e+16'),
    (['adaptive:t_uf=0.001', 'adaptive:t_uf=1e-3', 'adaptive:t_uf=1.000e-03'],
     'adaptive'),
    # an infinite cap is no cap
    (['adaptive:max_layer_scale=inf', 'adaptive:max_accum_scale=1e400',
      'adaptive:max_layer_scale=none', 'adaptive'], 'adaptive'),
    (['amax:max_accum_scale=inf', 'amax:max_accum_scale=None'],
     'amax:max_accum_scale=none'),
])
def test_number_spellings_of_one_state_print_one_text(spellings, text):
    assert {_text(s) for s in spellings} == {text}
    states = {_state(s) for s in spellings}
    assert len(states) == 1 and None not in states


@pytest.mark.parametrize('a, b', [
    # Chainer's scale is a double: 1000.00001 is not 1000
    ('dynamic:style=chainer,init_scale=1000.00001',
     'dynamic:style=chainer,init_scale=1000'),
    ('fixed:1000.00001', 'fixed:1000'),
    ('adaptive:init_scale=1000.00001', 'adaptive:init_scale=1000'),
    # an int beyond 2^53 keeps every digit
    ('amax:history=9007199254740993', 'amax:history=9007199254740992'),
    # PyTorch's factors are doubles
    ('dynamic:growth_factor=2.00000001', 'dynamic:growth_factor=2'),
])
def test_distinct_states_keep_distinct_texts(a, b):
    assert _state(a) != _state(b)
    assert _text(a) != _text(b) and parse_mode(a) != parse_mode(b)


@pytest.mark.parametrize('mode, needle', [
    # float32 rounds these to 1 and to 0: no ratio, no scale
    ('dynamic:style=tf,incr_ratio=1.00000001', 'incr_ratio'),
    ('dynamic:style=tf,decr_ratio=1e-50', 'decr_ratio'),
    ('dynamic:init_scale=1e-46', 'init_scale'),
])
def test_a_value_float32_makes_degenerate_is_refused(mode, needle):
    with pytest.raises(ValueError, match=needle):
        make_loss_scaling(mode)


# -- committed texts ---------------------------------------------------------
#: the mode and precision texts of configs/*.yaml and benchmarks/ (folder
#: names, results.json keys, tables), each printed as itself
COMMITTED_MODES = [
    'fp32', 'none', 'fixed:1', 'fixed:4', 'fixed:8', 'fixed:16', 'fixed:64',
    'fixed:128', 'fixed:256', 'fixed:1024', 'fixed:2048', 'fixed:4096',
    'fixed:8192', 'fixed:16384', 'dynamic', 'dynamic:style=chainer',
    'adaptive', 'adaptive:guard=false', 'adaptive:bound=gauss',
    'adaptive:bound=product', 'adaptive:bound=product,guard=false',
    'adaptive:bound=gauss,guard=false', 'adaptive:init_scale=64',
    'adaptive:init_scale=amax', 'adaptive:init_scale=auto',
    'adaptive:update_interval=100',
    'adaptive:guard=false,max_accum_scale=4096,max_layer_scale=128,'
    'style=authors,update_interval=1000', 'amax']
COMMITTED_PRECISIONS = [
    'float32', 'mixed16', 'bf16', 'fp8', 'fp8_e4m3', 'fp8_e5m2', 'mxfp8',
    'nvfp4', 'nvfp4:bf16=conv1+fc', 'nvfp4:rht=false', 'nvfp4:sr=false',
    'nvfp4:tiles=1d', 'fp8:recipe=blockwise', 'fp8_e4m3:recipe=current',
    'fp8_e4m3:recipe=delayed', 'fp8_e4m3:recipe=current,grad=loss']


@pytest.mark.parametrize('text', COMMITTED_MODES)
def test_committed_mode_texts_are_unchanged(text):
    assert _text(text) == text


@pytest.mark.parametrize('text', COMMITTED_PRECISIONS)
def test_committed_precision_texts_are_unchanged(text):
    assert parse_precision(text).name == text


# -- the property -------------------------------------------------------------
def _state(mode):
    """What ``mode`` builds, under two precisions (a format option naming
    the precision's own gradient format is that precision's default there,
    not in the other): per precision the method's class, its format's
    numbers and every scalar it stores; None where the mode is refused."""
    out = []
    for precision in ('mixed16', 'bf16'):
        with warnings.catch_warnings():    # "not a power of two"
            warnings.simplefilter('ignore')
            try:
                m = make_loss_scaling(mode, precision)
            except ValueError:
                out.append(None)
                continue
            if isinstance(m, AdaptiveScaling):
                m.bind(chainer.Chain(), verbose=False)
        f = m.fmt
        held = {}
        if isinstance(m, DynamicScaling):
            held = vars(m.state)
        elif isinstance(m, AdaptiveScaling):
            held = vars(m.ada)
        elif isinstance(m, FixedScaling):
            held = {'scale': m.scale}
        out.append((type(m).__name__, (f.exp_bits, f.man_bits, f.emax,
                                       f.overflow),
                    tuple(sorted((k, repr(v)) for k, v in held.items()
                                 if isinstance(v, (bool, int, float, str,
                                                   type(None)))))))
    return None if out == [None, None] else tuple(out)


#: numbers and their spellings: the same double, a float32-equal one
#: (the last of each list where there is one), trailing zeros, exponents
NUMBERS = {
    1: ['1', '1.0', '1e0', '01', '1.00000001'],
    2: ['2', '2.0', '2e0', '2.00000001'],
    7: ['7', '7.0', '7e0', '0007', '7.0000001'],
    128: ['128', '128.0', '1.28e2', '128.00001'],
    1000: ['1000', '1e3', '1000.0', '1.000E+03', '1000.00001'],
    4096: ['4096', '4.096e3', '4096.000', '4096.0001'],
    65536: ['65536', '6.5536e4', '65536.0', '65536.001'],
    1e16: ['1e16', '10000000000000000', '1.0e+16', '10000000272564224'],
    0.5: ['0.5', '.5', '5e-1', '0.50000001'],
    0.8: ['0.8', '8e-1', '0.80', '0.80000001'],
    0.001: ['0.001', '1e-3', '1.0e-03', '0.00100000001'],
    float('inf'): ['inf', 'Infinity', 'INF', '1e400'],
}
#: the format aliases (groups of one format)
FORMATS = [['fp8_e4m3', 'float8_e4m3fn', 'FP8_E4M3'],
           ['fp8_e5m2', 'float8_e5m2', 'e5m2', 'E05M02'],
           ['e4m3', 'float8_e4m3'], ['float32', 'e8m23', 'Float32'],
           ['bfloat16', 'e8m7'], ['float16', 'e5m10'],
           ['fp4_e2m1', 'float4_e2m1fn'], ['fp6_e2m3', 'float6_e2m3fn']]
WORDS = {'true': ['true', 'True', 'TRUE'], 'false': ['false', 'False'],
         'auto': ['auto', 'AUTO'], 'amax': ['amax', 'Amax'],
         'output': ['output', 'Output'], 'product': ['product'],
         'gauss': ['gauss', 'GAUSS'], 'fan_in': ['fan_in'],
         'paper': ['paper', 'Paper'], 'authors': ['authors'],
         'none': ['none', 'null', 'None'],
         'pytorch': ['pytorch', 'PyTorch'], 'chainer': ['chainer', 'CHAINER'],
         'tf': ['tf', 'TF']}

#: per mode: option -> the values drawn for it (keys of NUMBERS, of WORDS,
#: or an index into FORMATS)
SCALE = [1, 1000, 65536, 1e16, 0.5]
OPTIONS = {
    'dynamic': {'style': ['pytorch', 'chainer', 'tf', 'none'],
                'init_scale': SCALE, 'growth_factor': [2, 1000],
                'backoff_factor': [0.5, 0.8], 'growth_interval': [7, 1000],
                'interval': [7, 1000], 'incr_every_n_steps': [7, 1000],
                'decr_every_n_nan_or_inf': [2, 7], 'incr_ratio': [2, 128],
                'decr_ratio': [0.5, 0.8], 'min_scale': [1, 0.5],
                'max_scale': [65536, 1e16, 'none']},
    'adaptive': {'init_scale': [1, 1000, 'auto', 'amax'],
                 't_uf': [0.001, 0.5, 0.8], 'update_interval': [1, 7],
                 'fmt': list(range(len(FORMATS))),
                 'bound': ['output', 'product', 'gauss', 'fan_in'],
                 'max_layer_scale': [128, 1e16, 'none', float('inf')],
                 'max_accum_scale': [4096, 65536, 'none', float('inf')],
                 'guard': ['true', 'false'], 'backoff_window': [7, 1000],
                 'style': ['paper', 'authors']},
    'amax': {'init_scale': [1, 1000], 'margin': [1, 7], 'history': [7, 128],
             'fmt': list(range(len(FORMATS))),
             'max_accum_scale': [4096, 65536, 'none', float('inf')],
             'guard': ['true', 'false'],
             'backoff_window': [7, 1000]},
}


@st.composite
def configs(draw):
    """(mode name, {option: value}) from the pools above."""
    name = draw(st.sampled_from(['fixed', 'dynamic', 'adaptive', 'amax']))
    if name == 'fixed':
        return name, {'scale': draw(st.sampled_from([1, 7, 1000, 65536,
                                                     1e16, 0.5]))}
    keys = draw(st.lists(st.sampled_from(sorted(OPTIONS[name])),
                         max_size=3, unique=True))
    return name, {k: draw(st.sampled_from(OPTIONS[name][k])) for k in keys}


def _mutated(draw, config):
    """``config``, or one option of it changed or left out, or another."""
    name, options = config
    how = draw(st.sampled_from(['same', 'same', 'change', 'drop', 'other']))
    if how == 'same':
        return config
    if how == 'other' or not options:
        return draw(configs())
    options = dict(options)
    key = draw(st.sampled_from(sorted(options)))
    if how == 'drop' and name != 'fixed':
        del options[key]
    elif how == 'change':
        pool = [1, 7, 1000, 65536, 1e16, 0.5] if name == 'fixed' else \
            OPTIONS[name][key]
        options[key] = draw(st.sampled_from(pool))
    return name, options


def _spelling(draw, config):
    """One text of ``config``: the name in any case, options in any order,
    each value in one of its spellings."""
    name, options = config
    head = draw(st.sampled_from([name, name.upper(), name.title()]))

    def value(v):
        if isinstance(v, str):
            return draw(st.sampled_from(WORDS[v]))
        return draw(st.sampled_from(NUMBERS[v]))
    if name == 'fixed':
        return head + ':' + value(options['scale'])
    items = ['{}={}'.format(k, draw(st.sampled_from(FORMATS[v]))
                            if k == 'fmt' else value(v))
             for k, v in options.items()]
    items = draw(st.permutations(items))
    sep = draw(st.sampled_from([',', ', ', ' ,']))
    return head + (':' + sep.join(items) if items else '')


@st.composite
def spelling_pairs(draw):
    a = draw(configs())
    b = _mutated(draw, a)
    return _spelling(draw, a), _spelling(draw, b)


def _typed(spec):
    return spec.name, sorted((k, type(v).__name__, repr(v))
                             for k, v in spec.options.items())


@settings(max_examples=examples(600), deadline=None)
@given(spelling_pairs())
def test_equal_state_iff_equal_text(pair):
    """Two spellings print one text exactly when they build one state (of
    those built at all: a refused mode has no state), and each text parses
    back to the same spec, value types included."""
    a, b = pair
    sa, sb = _state(a), _state(b)
    for s in (a, b):
        spec = parse_mode(s)
        again = parse_mode(str(spec))
        assert str(again) == str(spec) and _typed(again) == _typed(spec), s
    if sa is None and sb is None:
        return
    assert (sa == sb) == (_text(a) == _text(b)), (a, b, _text(a), _text(b))


def test_every_numeric_option_has_a_stored_kind():
    """A number the methods take is canonicalized only through their
    option_kinds tables: a new numeric option without an entry would print
    as spelled. The non-numeric ones are the words and the format."""
    from ada_loss.loss_scale.dynamic import STYLES, style_option_kinds, \
        style_options
    from ada_loss.scaling import AmaxScaling
    from ada_loss.scaling.modes import _allowed_options
    words = {'fmt', 'bound', 'guard', 'style', 'nonlinear_scale',
             'split_scales'}
    for name, cls in (('adaptive', AdaptiveScaling), ('amax', AmaxScaling)):
        assert set(cls.option_kinds) == set(_allowed_options(name)) - words
    for style in STYLES:
        assert set(style_option_kinds(style)) == set(style_options(style))
