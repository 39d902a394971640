"""Issue 47: ``adaptive``'s ``init_scale`` default moved from 1 to
``format``. A run now records ``mode_resolved`` (every option's value,
defaults included), and the depth and GPT tables footnote a pooled run
recorded before the change (plain ``adaptive``, no ``mode_resolved``) whose
loss-gradient format cannot hold 1/B as a normal number: it ran with
α_{N+1} = 1, not today's ``adaptive``. Planted run folders."""
import inspect
import json
import os

import chainer
import pytest
import yaml

from ada_loss.experiment import config as C
from ada_loss.experiment import recipe as RC
from ada_loss.experiment import runinfo as R
from ada_loss.experiment.mode_history import ran_with_constant_alpha
from ada_loss.experiment.studies import depth
from ada_loss.experiment.studies import gpt as G
from ada_loss.scaling import make_loss_scaling, parse_mode, resolved_mode

E4M3 = 'fp8_e4m3:recipe=current,grad=loss'


def _state(mode, precision):
    m = make_loss_scaling(mode, precision)
    m.bind(chainer.Chain(), verbose=False)
    return type(m).__name__, m.fmt.name, sorted(
        (k, repr(v)) for k, v in vars(m.ada).items()
        if isinstance(v, (bool, int, float, str, type(None))))


@pytest.mark.parametrize('mode, precision', [
    ('adaptive', E4M3), ('adaptive', 'mixed16'), ('adaptive', 'fp8'),
    ('adaptive:init_scale=1', 'fp8_e4m3'),
    ('adaptive:style=authors,update_interval=10', None),
    ('adaptive:fmt=e5m2,t_uf=0.01', 'bf16'), ('amax', 'fp8_e4m3'),
    ('amax:margin=4', None)])
def test_resolved_mode_writes_every_option_and_builds_the_same(mode,
                                                               precision):
    text = resolved_mode(mode, precision)
    spec = parse_mode(text)
    name = parse_mode(mode).name
    # every keyword of the method is written out (none left to a default)
    cls = type(make_loss_scaling(mode, precision))
    keys = set(inspect.signature(cls.__init__).parameters) - {'self'}
    written = dict(kv.split('=') for kv in text.partition(':')[2].split(','))
    assert set(written) == keys
    assert spec.name == name
    assert _state(text, precision) == _state(mode, precision)


def test_resolved_mode_keeps_init_scale_explicit():
    assert 'init_scale=format' in resolved_mode('adaptive', E4M3)
    assert 'fmt=fp8_e4m3' in resolved_mode('adaptive', E4M3)
    assert 'init_scale=1,' in resolved_mode('adaptive:init_scale=1', E4M3)
    assert 'init_scale=1,' in resolved_mode('amax', E4M3)
    assert resolved_mode('dynamic:style=chainer') == (
        'dynamic:init_scale=1,interval=1000,max_scale=65504,min_scale=1,'
        'style=chainer')
    for mode in ('fixed:64', 'none', 'fp32'):
        assert resolved_mode(mode, 'mixed16') == mode


def test_run_json_records_the_resolved_mode():
    fields = dict(RC.mode_fields(parse_mode('adaptive'), E4M3))
    assert fields['mode'] == 'adaptive'
    assert fields['mode_resolved'] == resolved_mode('adaptive', E4M3)


def _old(mode, **extra):
    """A run.json of before the change: mode fields without mode_resolved."""
    spec = parse_mode(mode)
    return dict({'mode': str(spec), 'mode_name': spec.name,
                 'mode_options': spec.options}, **extra)


def test_which_records_ran_with_the_old_constant():
    assert ran_with_constant_alpha(_old('adaptive'), 'adaptive', E4M3, 128)
    assert ran_with_constant_alpha(_old('adaptive'), 'adaptive',
                                   'fp8_e4m3', 768)
    # E4M3 holds 1/64 (its smallest normal): the old and new agree there
    assert not ran_with_constant_alpha(_old('adaptive'), 'adaptive', E4M3,
                                       64)
    # FP16, BF16, the hybrid's E5M2: bit-identical, nothing to say
    for p in ('mixed16', 'bf16', 'fp8:recipe=current,grad=loss'):
        assert not ran_with_constant_alpha(_old('adaptive'), 'adaptive', p,
                                           128)
    # explicit options, other modes, new records
    for mode in ('adaptive:init_scale=1', 'adaptive:init_scale=amax',
                 'amax', 'fixed:64', 'none'):
        assert not ran_with_constant_alpha(_old(mode), mode, E4M3, 128)
    new = dict(_old('adaptive'),
               mode_resolved=resolved_mode('adaptive', E4M3))
    assert not ran_with_constant_alpha(new, 'adaptive', E4M3, 128)
    # a results.json entry (no mode fields): the table's mode text
    assert ran_with_constant_alpha({'seed': 0}, 'adaptive', E4M3, 128)
    # a format option targets its own format
    assert not ran_with_constant_alpha(_old('adaptive:fmt=float16'),
                                       'adaptive:fmt=float16', E4M3, 128)


def _plant(folder, info, config):
    os.makedirs(folder)
    with open(os.path.join(folder, R.RUN_JSON), 'w') as f:
        json.dump(dict(info, status=R.FINISHED, final_test_accuracy=0.5),
                  f)
    with open(os.path.join(folder, R.CONFIG_YAML), 'w') as f:
        f.write(config)


def test_depth_table_footnotes_old_default_runs(tmp_path):
    study = depth.STUDY
    cfg = study.load_config(None, [
        'grid.models=[resnet20]', 'grid.precisions=["{}",mixed16]'.format(
            E4M3), 'grid.modes=[adaptive,"adaptive:init_scale=1"]',
        'grid.fixed_scales=[]', 'grid.seeds=[0,1,2]', 'study.fp32=false'])
    out = str(tmp_path)
    for cell in study.cells(cfg):
        config = study.run_config(cfg, cell)
        info = _old(str(cell.mode), seed=cell.seed,
                    precision=str(cell.precision))
        if cell.seed == 1:         # recorded since the change
            info['mode_resolved'] = resolved_mode(cell.mode, cell.precision)
        text = C.dump(config)
        if cell.seed == 2:         # ran at batch 64: E4M3 holds 1/64
            plain = C.to_plain(config)
            plain['train']['batchsize'] = 64
            text = yaml.safe_dump(plain)
        _plant(study.folder(out, cfg, cell), info, text)
    runs, _ = depth.collect(study, cfg, out)
    note = depth.provenance_note(runs, cfg.train.batchsize)
    line = [x for x in note.splitlines() if 'α_{N+1} = 1' in x]
    assert len(line) == 1
    assert line[0].startswith('1 pooled `adaptive` run ran with α_{N+1} = 1')
    assert "today's `adaptive` is `init_scale=format`" in line[0]
    assert line[0].endswith(': resnet20 {} adaptive seed 0.'.format(E4M3))
    # no such run: no footnote
    del runs[(E4M3, 'resnet20', 'adaptive')]
    assert 'α_{N+1} = 1' not in depth.provenance_note(runs, 128)


def test_gpt_table_footnotes_old_default_runs(tmp_path):
    out = str(tmp_path / 'out')
    rows = [{'precisions': ['float32'], 'modes': ['fp32']},
            {'precisions': ['fp8_e4m3', 'mixed16'],
             'modes': ['adaptive', 'adaptive:init_scale=1']}]
    cfg_path = str(tmp_path / 'tiny.yaml')
    with open(cfg_path, 'w') as f:
        yaml.safe_dump({
            'table': 'tiny', 'grid': {'seeds': [0, 1], 'rows': rows},
            'model': {'n_layer': 1, 'n_head': 2, 'n_embd': 16,
                      'block_size': 8},
            'data': {'kjv_root': str(tmp_path)},
            'train': {'batchsize': 16, 'max_iterations': 20,
                      'warmup_iterations': 5,
                      'lr_decay_iterations': 20}}, f)
    cfg = G.STUDY.load_config(cfg_path, [])
    for cell in G.STUDY.cells(cfg):
        info = _old(str(cell.mode), seed=cell.seed, status=R.FINISHED,
                    precision=str(cell.precision), final_val_loss=1.6,
                    unigram_val_loss=3.0)
        if cell.seed == 1:
            info['mode_resolved'] = resolved_mode(cell.mode, cell.precision)
        folder = G.STUDY.folder(out, cfg, cell)
        os.makedirs(folder)
        with open(os.path.join(folder, R.RUN_JSON), 'w') as f:
            json.dump(info, f)
    results = G.results(cfg, G.collect(G.STUDY, cfg, out))
    flagged = {r['method']: r['constant_alpha'] for r in results}
    # 16 windows × 8 tokens = 128 rows: E4M3 cannot hold 1/128
    assert flagged['fp8_e4m3 adaptive'] == [0]
    assert flagged['fp8_e4m3 adaptive:init_scale=1'] == []
    assert flagged['mixed16 adaptive'] == []
    text = G.render(results)
    assert ('1 pooled `adaptive` run ran with α_{N+1} = 1' in text and
            text.rstrip().endswith(': fp8_e4m3 adaptive seed 0.'))
