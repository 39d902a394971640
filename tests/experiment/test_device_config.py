"""The harness's ``device`` setting on the CPU: parsed once ('@numpy' or
null: the CPU; '@cupy:N': GPU N), a bad value named with what is expected,
what a device run cannot do refused at config time, and a GPU asked for
where CuPy is missing refused before anything trains. The device runs
themselves: ``test_device_runs_gpu.py``."""
import os
from functools import partial

import pytest

from ada_loss.experiment import config as C
from ada_loss.experiment import devices
from ada_loss.experiment import runner
from ada_loss.experiment.studies import classification, depth

from gpu_helpers import GPU_SKIP_REASON


def load(*overrides, cls=classification.Config):
    return C.load(cls, overrides=list(overrides))


def test_default_is_the_cpu():
    assert load().device is None
    assert load('device=@numpy').device is None
    assert load('device=null').device is None


@pytest.mark.parametrize('text', ['@cupy:0', '@cupy:1', '@cupy:12'])
def test_a_gpu_is_kept_as_its_specifier(text):
    # '@' needs no quotes on the command line (YAML reserves it)
    assert load('device=' + text).device == text
    assert load("device='{}'".format(text)).device == text


@pytest.mark.parametrize('text', ['cupy:0', '@cupy', '@cupy:-1', '@cupy:01',
                                  '@cuda:0', 'gpu', '0', '-1', '@numpy:0',
                                  '[0]'])
def test_a_bad_device_names_what_is_expected(text):
    with pytest.raises(ValueError) as e:
        load('device=' + text)
    assert isinstance(e.value, C.ConfigError)
    assert "config key 'device'" in str(e.value)
    assert "'@numpy'" in str(e.value) and "'@cupy:N'" in str(e.value)


def test_the_setting_is_in_the_schema_and_the_config_yaml():
    lines = C.describe(depth.Config)
    assert any(line.startswith('device: ') and '@cupy:N' in line
               for line in lines)
    # a CPU run's config.yaml says null: it compares equal to one written
    # before the setting existed (no 'device' key)
    assert C.to_dict(load())['device'] is None
    assert C.to_dict(load('device=@cupy:0'))['device'] == '@cupy:0'


@pytest.mark.parametrize('override,key', [
    ('grid.modes=[adaptive:style=authors]', 'grid.modes'),
    ('log.probe_every=5', 'log.probe_every'),
    ('log.record_every=5', 'log.record_every'),
    ('distributed=true', 'device'),
    ('per_model={small_cnn: {log: {probe_every: 2}}}',
     'per_model.small_cnn.log.probe_every'),
])
def test_what_a_device_cannot_run_is_refused_at_config_time(override, key):
    load(override)                      # fine on the CPU
    with pytest.raises(C.ConfigError) as e:
        load(override, 'device=@cupy:0')
    assert e.value.key == key
    assert '@cupy:0' in str(e.value)


def test_the_guard_and_the_loss_gradient_rules_are_not_refused():
    # decided on the device (tests/adaptive/test_guard_gpu.py)
    assert load('grid.modes=[adaptive, amax, dynamic, fixed:8, fp32, '
                '"adaptive:init_scale=auto", "adaptive:init_scale=amax"]',
                'device=@cupy:0').device == '@cupy:0'


def test_depth_study_refuses_probed_fig4_runs_on_a_device():
    with pytest.raises(C.ConfigError) as e:
        load('device=@cupy:0', cls=depth.Config)
    assert e.value.key == 'study.fig4.run'
    assert load('device=@cupy:0', 'study.fig4.run=false',
                cls=depth.Config).device == '@cupy:0'


def test_cpu_runs_need_no_device():
    assert devices.training_device(None) is None


@pytest.mark.skipif(GPU_SKIP_REASON is None, reason='CuPy and a GPU are '
                    'here: the missing-CuPy error cannot happen')
def test_a_gpu_without_cupy_is_refused_before_training(tiny_config, out_dir,
                                                       capsys):
    main = partial(runner.main, classification.STUDY)
    code = main(['--config', tiny_config(), '--out', out_dir,
                 '--set', 'device=@cupy:0'])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config key 'device': device @cupy:0 "
                          'needs CuPy and a CUDA GPU')
    assert not os.path.exists(out_dir)      # nothing created


def test_cuda_graph_on_without_a_gpu_is_refused_at_config_time():
    with pytest.raises(C.ConfigError) as e:
        load('train.cuda_graph=on')
    assert "config key 'train.cuda_graph'" in str(e.value)
    assert 'needs a CUDA device' in str(e.value)
    # auto (or null: a config written before the key) and off are fine
    assert load().train.cuda_graph is None
    assert load('train.cuda_graph=off').train.cuda_graph in ('off', False)
    assert load("train.cuda_graph='off'").train.cuda_graph == 'off'
    with pytest.raises(C.ConfigError, match='needs a CUDA device'):
        load("train.cuda_graph='on'")
    assert load('train.cuda_graph=auto').train.cuda_graph == 'auto'
    with pytest.raises(C.ConfigError):
        load('train.cuda_graph=yes')
