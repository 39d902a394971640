"""Property-based tests of what a user's text reaches in the harness
(docs/reliability.md): ``--set`` values, ``--only`` filters, and whole
YAML configs (every shipped config, mutated). Every input either gives a
checked value that survives its own round trip (``config.yaml`` text read
back), or a ConfigError / ValueError that names the key at fault and the
reason in one line."""
import dataclasses
import math
import os
import typing
import warnings

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from ada_loss.experiment import config as C
from ada_loss.experiment import runner

from property_helpers import assert_specific, examples
from repo_modules import ROOT, load


def _entry(name):
    module = load(os.path.join('experiments', name + '.py'), 'entry_' + name)
    study, = [v for v in vars(module).values()
              if isinstance(v, runner.Study)]
    return study, os.path.normpath(module.CONFIG)


ENTRIES = {n[:-3]: _entry(n[:-3]) for n in sorted(os.listdir(
    os.path.join(ROOT, 'experiments'))) if n.endswith('.py')}
TABLE1, TABLE1_YAML = ENTRIES['table1']


def _settings(cls, prefix=''):
    """{dotted key: (type, field metadata)} of a config class."""
    out = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.update(_settings(tp, prefix + f.name + '.'))
        else:
            out[prefix + f.name] = (tp, f.metadata)
    return out


SETTINGS = _settings(TABLE1.Config)
SECTIONS = {k.rpartition('.')[0] for k in SETTINGS} - {''}

#: YAML texts of values of every kind a setting may be given
YAML_VALUES = [
    '0', '1', '-1', '2', '0.5', '1e-3', '1.0e-3', '.nan', '.inf', '-.inf',
    'nan', 'inf', '9' * 400, '1e400', 'true', 'false', 'yes', 'null', '~',
    '', '""', "''", '[]', '{}', '[0, 1]', '[0, 0]', '[fp32, adaptive]',
    '{a: 1}', 'ünïcödé', '"\\u2028"', '1 epoch', '2 iteration', '[1, epoch]',
    'mixed16', 'fp8', 'mxfp8:block=0', 'mxfp8:block=16', 'fp8:recipe=foo',
    'fp8:recipe=delayed,history=-1', '"fp8:recipe=delayed,history=16"',
    'fwd=float16,bwd=fp8_e4m3', '[adaptive:t_uf=abc]', 'fixed:128',
    'dynamic:style=chainer', 'resnet20', 'resnet7', 'digits', 'cifar10',
    'e4m3', 'e9m9', 'ring', 'A', 'table4', '[', ']', ':', '{', '&a 1',
    '!!python/object:os.system', '"a\nb"', '*x', '|', 'a: b: c']
_yaml_value = st.sampled_from(YAML_VALUES) | st.text(max_size=12) | \
    st.integers().map(str) | st.floats().map(repr)
_key = st.sampled_from(sorted(SETTINGS)) | st.sampled_from(
    ['train', 'grid.seed', 'train.lr.x', 'per_model.resnet20.train.lr',
     'per_model.resnet20.grid.seeds', 'extends', '.lr', 'x y',
     'train.ünï']) | st.text(max_size=8)


def _same(a, b):
    """Equal, NaN aside (no checked float is NaN: checked separately)."""
    return a == b


def _no_nan(value):
    if isinstance(value, float):
        assert not math.isnan(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _no_nan(v)
    elif isinstance(value, dict):
        for v in value.values():
            _no_nan(v)


@given(_key, _yaml_value)
def test_set_values_are_checked_or_name_the_key(key, text):
    override = '{}={}'.format(key, text)
    try:
        path, value = C.parse_override(override)
    except C.ConfigError as e:
        assert_specific(e, 'override', repr(override), repr(key))
        return
    dotted = '.'.join(path)
    if dotted not in SETTINGS:     # the whole load names the unknown key
        try:
            C.load(TABLE1.Config, raw={}, overrides=[override])
        except C.ConfigError as e:     # the key, or one inside it
            assert_specific(e, "'{}".format(path[0]))
            assert e.key.startswith(path[0]) or e.key == '<root>', e.key
        else:   # a section given as null or {} keeps its defaults
            assert dotted.startswith('per_model.') or dotted in SECTIONS
        return
    tp, meta = SETTINGS[dotted]
    try:
        checked = C.check_value(tp, meta, value, dotted)
    except C.ConfigError as e:
        assert_specific(e, dotted)
        assert e.key.startswith(dotted)
        return
    _no_nan(checked)
    # what config.yaml holds reads back to the same value
    again = yaml.safe_load(yaml.safe_dump(C.to_plain(checked)))
    assert _same(C.check_value(tp, meta, again, dotted), checked)


# -- --only -------------------------------------------------------------------
def _grid_cells():
    cfg = TABLE1.load_config(TABLE1_YAML, [
        'grid.modes=[none, "dynamic:style=chainer", adaptive, '
        '"adaptive:t_uf=0.001,update_interval=10"]',
        'grid.fixed_scales=[128, 54321.125]', 'grid.seeds=[0]',
        'grid.precisions=[mixed16, "fp8:recipe=delayed,history=16"]'])
    return TABLE1.cells(cfg)


CELLS = _grid_cells()
FIELDS = list(CELLS[0]._fields)
_only_value = st.sampled_from(sorted({str(getattr(c, f)) for c in CELLS
                                      for f in FIELDS}) + [
    'ADAPTIVE', 'fixed:128.0', 'fixed:54321.125', 'fixed:54321.1', 'x', '',
    '1.5', 'true',
    'fp8:recipe=delayed,history=-1', 'mxfp8:block=0']) | st.text(
    max_size=8)
_only_item = st.builds('{}={}'.format, st.sampled_from(FIELDS + [
    'batch', 'modes', '']) | st.text(max_size=4), st.lists(
        _only_value, min_size=1, max_size=3).map('|'.join))
only_texts = st.lists(_only_item, min_size=1, max_size=3).map(','.join) | \
    st.text(max_size=16)


@given(only_texts)
def test_only_filters_select_or_say_why(text):
    try:
        chosen = runner.select(CELLS, [text], TABLE1.only_aliases)
    except ValueError as e:
        assert_specific(e, '--only', 'bad')
        return
    assert chosen and all(c in CELLS for c in chosen)
    # the values of the chosen cells, given as text, select them again
    again = ','.join('{}={}'.format(f, '|'.join(sorted({str(getattr(c, f))
                                                        for c in chosen})))
                     for f in FIELDS)
    assert set(chosen) <= set(runner.select(CELLS, [again]))


# -- whole YAML configs, mutated ------------------------------------------
def _leaves(raw, prefix=()):
    for k, v in raw.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, prefix + (k,))
        yield prefix + (k,)


RAW = {name: C.read_yaml(path) for name, (_, path) in ENTRIES.items()}
MUTANTS = [float('nan'), float('inf'), -float('inf'), 10 ** 30, 10 ** 400,
           -1, 0, 0.0, '', 'ünïcödé', [], {}, None, True, 'x' * 300, [None],
           {'k': 1}, 1e308, -0.0, '1 epoch', 'fp8:recipe=foo', [float('nan')]]


@st.composite
def mutated_configs(draw):
    name = draw(st.sampled_from(sorted(RAW)))
    raw = yaml.safe_load(yaml.safe_dump(RAW[name]))     # a deep copy
    paths = list(_leaves(raw))
    path = draw(st.sampled_from(paths)) if paths else ('table',)
    node = raw
    for p in path[:-1]:
        node = node[p]
    old = node.get(path[-1])
    how = draw(st.sampled_from(['drop', 'rename', 'retype', 'wrap', 'text',
                                'none']))
    if how == 'drop':
        node.pop(path[-1], None)
    elif how == 'rename':
        node[path[-1] + draw(st.sampled_from(['_', 'ü', 's', ' ']))] = \
            node.pop(path[-1], None)
    elif how == 'retype':
        node[path[-1]] = draw(st.sampled_from(MUTANTS) | st.floats() |
                              st.integers() | st.text(max_size=6))
    elif how == 'wrap':
        node[path[-1]] = [old] if not isinstance(old, list) else {'a': old}
    elif how == 'text':
        node[path[-1]] = str(old)
    return name, path, how, raw


@settings(max_examples=examples(1000))
@given(mutated_configs())
def test_mutated_shipped_configs_load_or_name_the_key(case):
    name, path, how, raw = case
    study, _ = ENTRIES[name]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            cfg = C.from_dict(study.Config, raw)
            cells = study.cells(cfg)
    except C.ConfigError as e:
        assert_specific(e)
        assert e.key, str(e)
        return
    except ValueError as e:      # prepare() turns these into error: lines
        assert_specific(e)
        return
    assert isinstance(cells, list)
    # config.yaml's text of the checked config reads back to it
    again = C.from_dict(study.Config, yaml.safe_load(C.dump(cfg)))
    assert C.to_dict(again) == C.to_dict(cfg)
    _no_nan(C.to_dict(cfg))


@pytest.mark.parametrize('name', sorted(RAW))
def test_every_shipped_config_round_trips(name):
    study, path = ENTRIES[name]
    cfg = study.load_config(path, [])
    again = C.from_dict(study.Config, yaml.safe_load(C.dump(cfg)))
    assert C.to_dict(again) == C.to_dict(cfg)
