"""The ``dynamic`` mode's styles and options through the mode string
(ada_loss.scaling: parse_mode, make_loss_scaling, DynamicScaling): valid
settings reach the state; bad ones fail with a clear ValueError before
anything is built."""
import numpy as np
import pytest

from ada_loss.loss_scale.dynamic import (
    ChainerLossScale, DynamicLossScale, TFLossScale)
from ada_loss.scaling import DynamicScaling, make_loss_scaling, parse_mode


@pytest.mark.parametrize('mode, cls, scale, attrs', [
    ('dynamic', DynamicLossScale, 2.0 ** 16, {'growth_interval': 2000}),
    ('dynamic:style=pytorch,growth_interval=7,backoff_factor=0.25',
     DynamicLossScale, 2.0 ** 16,
     {'growth_interval': 7, 'backoff_factor': 0.25}),
    ('dynamic:style=chainer', ChainerLossScale, 1.0,
     {'interval': 1000, 'min_scale': 1.0, 'max_scale': 65504.0}),
    ('dynamic:style=CHAINER,interval=10,max_scale=1024', ChainerLossScale,
     1.0, {'interval': 10, 'max_scale': 1024.0}),
    ('dynamic:style=tf', TFLossScale, 2.0 ** 32,
     {'incr_every_n_steps': 1000, 'decr_every_n_nan_or_inf': 2,
      'decr_ratio': 0.5}),
    ('dynamic:style=tf,decr_ratio=0.8,decr_every_n_nan_or_inf=3,'
     'init_scale=1024', TFLossScale, 1024.0,
     # TF's ratio is a float32 (its tensors' dtype): stored as used
     {'decr_ratio': float(np.float32(0.8)), 'decr_every_n_nan_or_inf': 3}),
])
def test_styles_and_options_reach_the_state(mode, cls, scale, attrs):
    s = make_loss_scaling(mode)
    assert type(s) is DynamicScaling and s.recovers
    assert type(s.state) is cls and s.style == cls.style
    assert s.scale == scale
    for key, value in attrs.items():
        assert getattr(s.state, key) == value, key
    spec = parse_mode(mode)
    assert parse_mode(str(spec)) == spec


def test_none_keeps_the_styles_default():
    s = make_loss_scaling('dynamic:style=chainer,min_scale=none')
    assert s.state.min_scale == 1.0


@pytest.mark.parametrize('mode, needles', [
    ('dynamic:style=foo', ['dynamic', "'foo'", 'pytorch, chainer, tf']),
    ('dynamic:style=1', ['pytorch, chainer, tf']),
    ('dynamic:style=chainer,growth_interval=5',
     ['chainer', 'growth_interval', 'interval, init_scale, min_scale']),
    ('dynamic:style=chainer,growth_factor=2', ['chainer', 'growth_factor']),
    ('dynamic:decr_every_n_nan_or_inf=2',
     ['pytorch', 'decr_every_n_nan_or_inf', 'growth_interval']),
    ('dynamic:style=tf,interval=2', ['tf', 'interval', 'incr_ratio']),
    ('dynamic:growth_factor=1', ['growth_factor', '> 1']),
    ('dynamic:style=tf,incr_ratio=0.5', ['incr_ratio', '> 1']),
    ('dynamic:style=tf,decr_ratio=1', ['decr_ratio', '(0, 1)']),
    ('dynamic:style=chainer,interval=0', ['interval', 'positive integer']),
    ('dynamic:style=chainer,interval=inf', ['interval']),
    ('dynamic:style=tf,incr_every_n_steps=0', ['incr_every_n_steps']),
    ('dynamic:style=tf,decr_every_n_nan_or_inf=-1',
     ['decr_every_n_nan_or_inf']),
    ('dynamic:style=chainer,min_scale=0', ['min_scale']),
    ('dynamic:style=chainer,min_scale=4,max_scale=2', ['max_scale']),
])
def test_bad_dynamic_options_rejected(mode, needles):
    parse_mode(mode)   # the keys are known; the values are checked on build
    with pytest.raises(ValueError) as info:
        make_loss_scaling(mode)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_unknown_key_rejected_by_the_parser():
    with pytest.raises(ValueError) as info:
        parse_mode('dynamic:stlye=chainer')
    assert 'style, init_scale' in str(info.value)
    assert 'decr_every_n_nan_or_inf' in str(info.value)


@pytest.mark.parametrize('name', ['table1', 'table2_imagenet', 'table3_ssd',
                                  'mini'])
def test_reproduction_configs_run_the_papers_dynamic_style(name):
    """The paper's "Dynamic" is Chainer's own dynamic loss scaling; every
    reproduction config that has a dynamic column runs that style (Table 5
    extends Table 3's config and has none)."""
    import os
    import yaml
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    with open(os.path.join(root, 'configs', name + '.yaml')) as f:
        modes = yaml.safe_load(f)['grid']['modes']
    dynamic = [m for m in modes if parse_mode(m).name == 'dynamic']
    assert dynamic, modes
    for mode in dynamic:
        assert make_loss_scaling(mode).style == 'chainer', mode
    with open(os.path.join(root, 'configs', 'table5_ssd.yaml')) as f:
        table5 = yaml.safe_load(f)
    assert table5['extends'] == 'table3_ssd.yaml'
    assert not any(parse_mode(m).name == 'dynamic'
                   for m in table5['grid']['modes'])
