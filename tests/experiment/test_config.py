"""Config loading and validation: every bad value is reported, naming its
key, before anything runs."""
import os

import pytest
import yaml

from functools import partial

from ada_loss.experiment import config as C
from ada_loss.experiment import runner
from ada_loss.experiment.studies.classification import STUDY, Config, run_name
from ada_loss.precision import Precision
from ada_loss.scaling import parse_mode

main = partial(runner.main, STUDY)

ROOT = os.path.join(os.path.dirname(__file__), '..', '..')


def load(**raw):
    return C.load(Config, raw=raw)


def test_defaults_are_he_et_al_recipe():
    cfg = load()
    t = cfg.train
    assert (t.batchsize, t.lr, t.momentum, t.weight_decay,
            t.epochs, t.lr_steps, t.lr_decay) == \
        (128, 0.1, 0.9, 1e-4, 164, [81, 122], 0.1)
    assert cfg.log.eval_interval == [1, 'epoch']


@pytest.mark.parametrize('raw, key, words', [
    ({'trian': {}}, 'trian', 'unknown key'),
    ({'train': {'learning_rate': 0.1}}, 'train.learning_rate', 'unknown key'),
    ({'train': {'lr': 'fast'}}, 'train.lr', 'number'),
    ({'train': {'lr': -1}}, 'train.lr', '> 0'),
    ({'train': {'batchsize': 12.5}}, 'train.batchsize', 'integer'),
    ({'train': {'batchsize': True}}, 'train.batchsize', 'integer'),
    ({'train': {'precision': 'float16'}}, 'train.precision', 'mixed16'),
    ({'train': {'dtype': 'mixed16'}}, 'train.dtype', 'renamed train.precision'),
    ({'log': {'eval_interval': '2 weeks'}}, 'log.eval_interval', 'epoch'),
    ({'log': {'progress': True}}, 'log.progress', 'report, bar'),
    ({'log': {'probe_every': 0}}, 'log.probe_every', '>= 1'),
    ({'log': {'probe_every': 5, 'record_every': 5}}, 'log.record_every',
     'null while log.probe_every'),
    ({'data': {'augment': 'yes'}}, 'data.augment', 'true or false'),
    ({'grid': {'seeds': ['a']}}, 'grid.seeds[0]', 'integer'),
    ({'grid': {'models': ['resnet21']}}, 'grid.models[0]', '6n+2'),
    ({'grid': {'models': ['vgg16']}}, 'grid.models[0]', 'unknown model'),
    ({'grid': {'datasets': ['imagenet']}}, 'grid.datasets[0]', 'cifar10'),
    ({'grid': {'modes': ['adaptve']}}, 'grid.modes[0]', 'unknown loss'),
    ({'grid': {'modes': ['fixed:0']}}, 'grid.modes[0]', 'positive'),
    ({'grid': {'modes': ['fixed']}}, 'grid.modes[0]', 'fixed:S'),
    ({'grid': {'fixed_scales': [0]}}, 'grid.fixed_scales[0]', 'positive'),
    ({'grid': {'fixed_scales': ['big']}}, 'grid.fixed_scales[0]',
     'positive number'),
    ({'grid': {'modes': ['adaptive:t_uf=5']}}, 'grid.modes', 't_uf'),
    ({'grid': {'modes': ['adaptive:speed=2']}}, 'grid.modes[0]', 'speed'),
    ({'grid': {'modes': ['fp32']}, 'train': {'precision': 'mixed16'}},
     'grid.modes', 'fp32'),
    ({'grid': {'modes': [], 'fixed_scales': []}}, 'grid.modes', 'no mode'),
    ({'per_model': {'vgg': {}}}, 'per_model.vgg', 'unknown model'),
    ({'per_model': {'resnet110': {'grid': {}}}}, 'per_model.resnet110.grid',
     'unknown section'),
    ({'per_model': {'resnet110': {'train': {'warmup': 4}}}},
     'per_model.resnet110.train.warmup', 'unknown key'),
])
def test_errors_name_the_key(raw, key, words):
    with pytest.raises(C.ConfigError) as e:
        load(**raw)
    assert e.value.key == key
    assert words in str(e.value)


def test_overrides_are_yaml_values():
    cfg = C.load(Config, raw={}, overrides=[
        'train.lr=0.05', 'grid.seeds=[0, 1]', 'train.weight_decay=1e-4',
        'grid.modes=[fp32, "fixed:128", adaptive:t_uf=0.01]',
        'per_model.resnet110.train.warmup_iterations=400',
        'log.eval_interval=5 iteration'])
    assert cfg.train.lr == 0.05
    assert cfg.grid.seeds == [0, 1]
    assert cfg.train.weight_decay == 1e-4
    # modes are parsed once, here: the studies get LossScalingSpecs
    assert cfg.grid.modes == [parse_mode('fp32'), parse_mode('fixed:128'),
                              parse_mode('adaptive:t_uf=0.01')]
    assert [str(m) for m in cfg.grid.modes] == ['fp32', 'fixed:128',
                                                'adaptive:t_uf=0.01']
    assert cfg.log.eval_interval == [5, 'iteration']
    r110 = cfg.for_model('resnet110')
    assert r110.train.warmup_iterations == 400
    assert cfg.for_model('resnet20').train.warmup_iterations == 0


@pytest.mark.parametrize('text', ['train.lr', '=3', 'train.lr=[1,'])
def test_bad_override_syntax(text):
    with pytest.raises(C.ConfigError):
        C.load(Config, raw={}, overrides=[text])


def test_override_unknown_key_is_rejected():
    with pytest.raises(C.ConfigError) as e:
        C.load(Config, raw={}, overrides=['train.lrr=0.1'])
    assert e.value.key == 'train.lrr'


def test_extends_and_shipped_configs():
    table1 = C.load(Config, os.path.join(ROOT, 'configs', 'table1.yaml'))
    table4 = C.load(Config, os.path.join(ROOT, 'configs', 'table4.yaml'))
    mini = C.load(Config, os.path.join(ROOT, 'configs', 'mini.yaml'))
    # Table 1: 3 depths x 2 datasets x (fp32, none, dynamic, adaptive, six
    # fixed scales) x 4 seeds
    assert len(STUDY.cells(table1)) == 3 * 2 * 10 * 4
    assert table1.per_model['resnet110']['train'][
        'warmup_iterations'] == 400
    # Table 4 extends Table 1: same recipe, scales 1 .. 16384
    assert len(STUDY.cells(table4)) == 2 * 1 * 7 * 4
    assert table4.train == table1.train
    assert str(table4.modes()[0]) == 'fixed:1'
    cells = STUDY.cells(mini)
    assert len(cells) == 14 and {c.seed for c in cells} == {0, 1}
    assert sum(c.mode.name == 'fixed' for c in cells) == 6


def test_grid_order_and_only_filter():
    cfg = load(grid={'models': ['small_cnn'], 'datasets': ['digits'],
                     'modes': ['adaptive', 'fp32', 'dynamic', 'none'],
                     'fixed_scales': [1024, 16], 'seeds': [0, 1]})
    cells = STUDY.cells(cfg)
    assert [str(c.mode) for c in cells[:6]] == [
        'fp32', 'none', 'fixed:16', 'fixed:1024', 'dynamic', 'adaptive']
    assert run_name(cells[2]) == 'small_cnn-digits-fixed_16-s0'
    sel = runner.select(cells, ['mode=adaptive|fixed:16,seed=1'])
    assert [(str(c.mode), c.seed) for c in sel] == [('fixed:16', 1),
                                                    ('adaptive', 1)]
    # a mode's options contain commas; values are parsed as the config does
    cfg = load(grid={'models': ['small_cnn'], 'datasets': ['digits'],
                     'modes': ['adaptive:update_interval=10,t_uf=0.0001',
                               'adaptive'], 'seeds': [0]})
    sel = runner.select(STUDY.cells(cfg), [
        'mode=adaptive:t_uf=1e-4,update_interval=10,seed=0'])
    assert [str(c.mode) for c in sel] == [
        'adaptive:t_uf=0.0001,update_interval=10']
    # a default written out is the mode without it (canonical modes)
    sel = runner.select(STUDY.cells(cfg), ['mode=adaptive:t_uf=1e-3'])
    assert [str(c.mode) for c in sel] == ['adaptive']
    with pytest.raises(ValueError, match="bad --only mode='fixed:0'"):
        runner.select(STUDY.cells(cfg), ['mode=fixed:0'])
    with pytest.raises(ValueError, match='matches no run'):
        runner.select(cells, ['model=resnet20'])
    with pytest.raises(ValueError, match='bad --only'):
        runner.select(cells, ['colour=red'])


def test_scaled_precisions_in_the_grid_and_only_filter():
    cfg = load(grid={'models': ['small_cnn'], 'datasets': ['digits'],
                     'modes': ['none'], 'fixed_scales': [], 'seeds': [0],
                     'precisions': ['FP8:recipe=delayed,history=16',
                                    'fp8:recipe=current', 'mxfp8']})
    cells = STUDY.cells(cfg)
    assert [str(c.precision) for c in cells] == [
        'fp8:recipe=delayed,history=16', 'fp8:recipe=current', 'mxfp8']
    # a precision's options after the comma belong to it; names normalized
    sel = runner.select(cells, ['precision=fp8:recipe=delayed,history=16'])
    assert [str(c.precision) for c in sel] == ['fp8:recipe=delayed,history=16']
    sel = runner.select(cells, ['precision=MXFP8|fp8:recipe=current'])
    assert [str(c.precision) for c in sel] == ['fp8:recipe=current', 'mxfp8']
    with pytest.raises(C.ConfigError, match='grid.precisions'):
        load(grid={'precisions': ['fp8:recipe=later']})


def test_cli_rejects_bad_config_before_running(tiny_config, out_dir, capsys):
    path = tiny_config(grid={'modes': ['fp32', 'fixed:0']})
    assert main(['--config', path, '--out', out_dir]) == 2
    err = capsys.readouterr().err
    assert "grid.modes[1]" in err and 'fixed:S' in err
    assert not os.path.exists(out_dir)
    assert main(['--config', tiny_config(), '--out', out_dir,
                 '--set', 'train.momentum=lots']) == 2
    assert 'train.momentum' in capsys.readouterr().err
    assert not os.path.exists(out_dir)


def test_help_config_lists_schema(capsys):
    assert main(['--config', 'x.yaml', '--help-config']) == 0
    text = capsys.readouterr().out
    assert 'train.warmup_iterations' in text and 'grid.fixed_scales' in text


def test_bad_precision_in_config_fails_before_running():
    with pytest.raises(C.ConfigError, match='train.precision'):
        load(train={'precision': 'fp9'})
    with pytest.raises(C.ConfigError, match='grid.precisions'):
        load(grid={'precisions': ['bf16', 'e9m2']})
    # a fixed scale above the gradient format's largest value (448)
    with pytest.raises(C.ConfigError, match='largest value 448'):
        load(grid={'modes': ['fixed:1024']},
             train={'precision': 'fp8_e4m3'})


def test_modes_and_precisions_are_parsed_once_and_written_as_text():
    """Config values of the types Mode and PrecisionName are parsed objects
    (defaults included); config.yaml and run names hold their text."""
    cfg = load(train={'precision': 'FP8'},
               grid={'precisions': ['bf16', 'fwd=float16,bwd=e4m3'],
                     'modes': ['adaptive:t_uf=1e-3']})
    assert isinstance(cfg.train.precision, Precision)
    assert cfg.train.precision.bwd.name == 'fp8_e5m2'
    assert [p.name for p in cfg.grid.precisions] == [
        'bf16', 'fwd=float16,bwd=e4m3']
    assert cfg.grid.modes[0].options == {}      # t_uf=0.001: the default
    assert load().grid.modes[0] == parse_mode('fp32')     # a default
    plain = C.to_dict(cfg)
    assert plain['train']['precision'] == 'fp8'
    assert plain['grid']['precisions'] == ['bf16', 'fwd=float16,bwd=e4m3']
    assert plain['grid']['modes'] == ['adaptive']
    assert C.load(Config, raw=yaml.safe_load(C.dump(cfg))) == cfg
    cell = STUDY.cells(cfg)[0]
    assert STUDY.run_config(cfg, cell)['run'] == {
        'model': 'resnet20', 'dataset': 'cifar10',
        'mode': 'adaptive', 'seed': 0, 'precision': 'bf16'}
