"""Mode and dtype parsing: valid settings, bad input rejected up front with
messages naming the allowed values, and a warning-free ``import ada_loss``."""
import os
import subprocess
import sys
import warnings

import pytest

import ada_loss
from ada_loss.scaling import (
    AdaptiveScaling, DynamicScaling, FixedScaling, MODES, NoScaling,
    LossScalingSpec, make_loss_scaling, parse_mode, resolve_precision)
from ada_loss.precision import PRECISIONS, parse_precision

import substrate_helpers as H

MODE_LIST = 'fp32, none, fixed:S'
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


# ------------------------------------------------ valid modes

def test_public_names():
    assert MODES == ('fp32', 'none', 'fixed', 'dynamic', 'adaptive', 'amax')
    assert PRECISIONS[:2] == ('float32', 'mixed16')
    assert ada_loss.parse_mode is parse_mode
    assert ada_loss.make_loss_scaling is make_loss_scaling


@pytest.mark.parametrize('mode, name, options, text', [
    ('fp32', 'fp32', {}, 'fp32'),
    ('none', 'none', {}, 'none'),
    (' None ', 'none', {}, 'none'),
    ('fixed:128', 'fixed', {'scale': 128.0}, 'fixed:128'),
    ('FIXED:0.5', 'fixed', {'scale': 0.5}, 'fixed:0.5'),
    ('fixed:1e3', 'fixed', {'scale': 1000.0}, 'fixed:1000'),
    ('dynamic', 'dynamic', {}, 'dynamic'),
    ('dynamic:init_scale=1024, growth_interval=3', 'dynamic',
     {'init_scale': 1024, 'growth_interval': 3},
     'dynamic:growth_interval=3,init_scale=1024'),
    ('adaptive:t_uf=0.01,bound=fan_in,max_layer_scale=none',
     'adaptive',
     {'t_uf': 0.01, 'bound': 'fan_in'}, 'adaptive:bound=fan_in,t_uf=0.01'),
])
def test_parse_valid(mode, name, options, text):
    spec = parse_mode(mode)
    assert isinstance(spec, LossScalingSpec)
    assert spec.name == name
    assert spec.options == options
    assert str(spec) == text
    assert parse_mode(spec) is spec
    assert parse_mode(str(spec)) == spec  # round trip


@pytest.mark.parametrize('spelling, canonical', [
    ('DYNAMIC:style=Chainer', 'dynamic:style=chainer'),
    ('dynamic:style=pytorch', 'dynamic'),
    ('dynamic:style=chainer,interval=1000', 'dynamic:style=chainer'),
    ('dynamic:style=tf,init_scale=4294967296', 'dynamic:style=tf'),
    ('dynamic:init_scale=none', 'dynamic'),
    ('amax:margin=8', 'amax'),
    ('amax:margin=8.0,history=16', 'amax'),
    ('adaptive:guard=true', 'adaptive'),
    ('Adaptive:guard=TRUE,init_scale=Format,t_uf=1e-3', 'adaptive'),
    # the paper's constant α_{N+1} = 1 is no longer the default (issue 47)
    ('Adaptive:guard=TRUE,init_scale=1,t_uf=1e-3', 'adaptive:init_scale=1'),
    ('adaptive:init_scale=1.0', 'adaptive:init_scale=1'),
    ('adaptive:init_scale=AUTO', 'adaptive:init_scale=auto'),
    ('adaptive:update_interval=100.0', 'adaptive:update_interval=100'),
    ('adaptive:bound=Product,guard=false', 'adaptive:bound=product,'
     'guard=false'),
    ('adaptive:guard=FALSE', 'adaptive:guard=false'),
])
def test_canonical_text(spelling, canonical):
    """Every spelling of one mode is one spec with one text (issue 39 item
    2: separate folders and table cells for one run otherwise)."""
    spec = parse_mode(spelling)
    assert spec.text() == str(spec) == canonical
    assert spec == parse_mode(canonical)
    assert hash(spec) == hash(parse_mode(canonical))
    assert parse_mode(canonical).text() == canonical


def test_canonical_keeps_what_differs():
    """Non-default values stay, and ``guard=1`` is not ``guard=true``."""
    assert str(parse_mode('dynamic:style=chainer,interval=100')) == \
        'dynamic:interval=100,style=chainer'
    assert parse_mode('amax:margin=2') != parse_mode('amax')
    assert parse_mode('adaptive:init_scale=auto') != parse_mode('adaptive')
    assert parse_mode('adaptive:init_scale=1') != parse_mode('adaptive')
    assert parse_mode('adaptive:init_scale=amax') != parse_mode('adaptive')
    # amax's α_{N+1} stays the constant 1 by default
    assert str(parse_mode('amax:init_scale=1')) == 'amax'
    assert parse_mode('adaptive:guard=false') != parse_mode('adaptive')


def test_parse_value_types():
    opts = parse_mode('dynamic:init_scale=1e3,growth_interval=10').options
    assert opts == {'init_scale': 1000.0, 'growth_interval': 10}
    assert isinstance(opts['growth_interval'], int)
    assert isinstance(opts['init_scale'], float)


@pytest.mark.parametrize('mode, cls, scale, recovers', [
    ('fp32', NoScaling, 1.0, False),
    ('none', NoScaling, 1.0, False),
    ('fixed:256', FixedScaling, 256.0, False),
    ('dynamic', DynamicScaling, 2.0 ** 16, True),
    ('dynamic:init_scale=8', DynamicScaling, 8.0, True),
    ('adaptive', AdaptiveScaling, 1.0, True),
    ('adaptive:init_scale=16', AdaptiveScaling, 16.0, True),
])
def test_make_loss_scaling(mode, cls, scale, recovers):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        s = make_loss_scaling(mode)
    assert type(s) is cls
    assert s.scale == scale
    assert s.recovers is recovers


def test_dynamic_options_reach_the_state():
    s = make_loss_scaling('dynamic:init_scale=4,growth_factor=3,'
                          'backoff_factor=0.25,growth_interval=7')
    st = s.state
    assert (st.scale, st.growth_factor, st.backoff_factor,
            st.growth_interval) == (4.0, 3.0, 0.25, 7)


@pytest.mark.parametrize('mode, dtype, want', [
    ('fp32', None, 'float32'),
    ('fp32', 'float32', 'float32'),
    ('none', None, 'mixed16'),
    ('fixed:8', None, 'mixed16'),
    ('dynamic', None, 'mixed16'),
    ('adaptive', None, 'mixed16'),
    ('none', 'float32', 'float32'),
    ('fixed:8', 'float32', 'float32'),
    ('adaptive', 'mixed16', 'mixed16'),
])
def test_resolve_precision(mode, dtype, want):
    assert resolve_precision(mode, dtype) == want


# ------------------------------------------------ bad input

@pytest.mark.parametrize('mode, needles', [
    ('foo', [MODE_LIST, 'dynamic', 'adaptive', "'foo'"]),
    ('', [MODE_LIST]),
    (None, [MODE_LIST]),
    (128, [MODE_LIST]),
    ('fixed128', [MODE_LIST]),
    ('fixed', ['fixed:S', 'S > 0']),
    ('fixed:', ['fixed:S', 'S > 0']),
    ('fixed:0', ['fixed:S', 'positive finite']),
    ('fixed:-1', ['fixed:S', 'positive finite']),
    ('fixed:abc', ['fixed:S', 'number', "'abc'"]),
    ('fixed:inf', ['fixed:S', 'positive finite']),
    ('fixed:nan', ['fixed:S', 'positive finite']),
    ('fixed:1e400', ['fixed:S', 'positive finite']),
    ('none:3', ['none', 'no argument']),
    ('fp32:1', ['fp32', 'no argument']),
    ('adaptive:bogus=1', ['bogus', 'init_scale, t_uf, update_interval, fmt']),
    ('adaptive:t_uf', ['key=value', 't_uf']),
    ('adaptive:verbose=1', ['verbose', 'max_accum_scale']),
    ('dynamic:min_scal=1',
     ['style, init_scale, growth_factor, backoff_factor, growth_interval']),
])
def test_parse_mode_rejects(mode, needles):
    with pytest.raises(ValueError) as info:
        parse_mode(mode)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    # make_loss_scaling parses first, so it fails the same way
    with pytest.raises(ValueError):
        make_loss_scaling(mode)


@pytest.mark.parametrize('mode, needles', [
    ('dynamic:growth_factor=0.5', ['dynamic', 'growth_factor', '> 1']),
    ('dynamic:growth_factor=1', ['growth_factor', '> 1']),
    ('dynamic:growth_factor=inf', ['growth_factor', 'finite']),
    ('dynamic:backoff_factor=1.5', ['backoff_factor', '(0, 1)']),
    ('dynamic:init_scale=0', ['init_scale', 'positive finite']),
    ('dynamic:init_scale=abc', ['dynamic']),
    ('dynamic:growth_interval=0', ['growth_interval', 'positive integer']),
    ('dynamic:growth_interval=2.5', ['growth_interval', 'positive integer']),
    ('dynamic:growth_interval=inf', ['dynamic', 'growth_interval']),
    ('adaptive:t_uf=0', ['t_uf', '(0, 1)']),
    ('adaptive:t_uf=abc', ['adaptive']),
    ('adaptive:init_scale=-1', ['init_scale', 'positive finite']),
    ('adaptive:update_interval=0', ['update_interval', 'positive integer']),
    ('adaptive:update_interval=inf', ['adaptive', 'update_interval']),
    ('adaptive:fmt=float64', ['float64', 'float32, float16, bfloat16, fp8_e4m3']),
    ('adaptive:max_layer_scale=0.5', ['max_layer_scale', '>= 1']),
])
def test_make_loss_scaling_rejects_bad_option_values(mode, needles):
    """Option values are checked when the method is made, before any model
    exists (parse_mode only checks the keys)."""
    with pytest.raises(ValueError) as info:
        make_loss_scaling(mode)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


@pytest.mark.parametrize('dtype', ['float64', 'float16', 'fp16', 'mixed',
                                   None, 'fwd=e9m2,bwd=float16',
                                   'fwd=float16'])
def test_unknown_precision(dtype):
    with pytest.raises(ValueError, match='float32, mixed16|accepted'):
        parse_precision(dtype)
    if dtype is not None:
        with pytest.raises(ValueError, match='float32, mixed16|accepted'):
            resolve_precision('fixed:8', dtype)


def test_fp32_with_mixed16_is_rejected():
    with pytest.raises(ValueError) as info:
        resolve_precision('fp32', 'mixed16')
    msg = str(info.value)
    assert 'fp32' in msg and 'mixed16' in msg and 'none' in msg


@pytest.mark.parametrize('mode, dtype', [
    ('foo', None), ('fixed:0', None), ('fixed:-1', None), ('fixed:abc', None),
    ('fixed:inf', None), ('adaptive:bogus=1', None),
    ('dynamic:growth_factor=0.5', None), ('fp32', 'mixed16'),
    ('none', 'float64')])
def test_bad_input_fails_before_a_model_is_built(mode, dtype):
    built = []

    def predictor():
        built.append(1)
        return H.MLP()

    with pytest.raises(ValueError):
        H.build(mode, predictor, dtype=dtype)
    assert built == []


# ------------------------------------------------ import

def test_import_prints_no_warnings():
    env = dict(os.environ)
    env.pop('PYTHONWARNINGS', None)
    proc = subprocess.run(
        [sys.executable, '-W', 'default', '-c', 'import ada_loss'],
        capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ''
    assert proc.stdout == ''


def test_import_submodules_prints_no_warnings():
    # (ada_loss.datasets is left out: it imports ChainerCV, whose classes
    # trigger Chainer's "Overriding method 'to_cpu'" DeprecationWarning)
    code = ('import ada_loss, ada_loss.models, ada_loss.training, '
            'ada_loss.links, ada_loss.functions, ada_loss.formats, '
            'ada_loss.scaling')
    proc = subprocess.run(
        [sys.executable, '-W', 'default', '-c', code],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ''


def test_adaptive_style_default_is_omitted():
    """style=paper is the default: the same mode, the same canonical text;
    style=authors resolves its bound to the authors' (fan_in)."""
    assert parse_mode('adaptive:style=paper') == parse_mode('adaptive')
    assert str(parse_mode('adaptive:style=paper,t_uf=0.01')) == \
        'adaptive:t_uf=0.01'
    assert str(parse_mode('adaptive:style=authors')) == \
        'adaptive:style=authors'
    m = make_loss_scaling('adaptive:style=authors,max_layer_scale=128')
    assert m.options['bound'] == 'fan_in' and m.options['style'] == 'authors'
    assert make_loss_scaling('adaptive').options['bound'] == 'output'
    with pytest.raises(ValueError, match='fan_in'):
        make_loss_scaling('adaptive:style=authors,bound=product')
    with pytest.raises(ValueError, match='style'):
        make_loss_scaling('adaptive:style=mine')
