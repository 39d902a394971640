"""The harness trains on a GPU (``device: '@cupy:0'``, ``--set
device=@cupy:0``): a tiny depth-study grid finishes with finite metrics in
float32 and in mixed16 with the fixed, dynamic and adaptive modes; a run
killed twice and resumed on the device is bit for bit the uninterrupted
device run; the device's losses are close to the CPU's; ``--jobs 2`` trains
two runs at once on the one GPU. Skipped, with the reason, where CuPy or a
GPU is missing (nothing here imports CuPy at collection)."""
import json
import math
import os
from functools import partial

import pytest
import yaml

import ondisk_fixtures
import test_kill_resume as KR
from gpu_helpers import requires_gpu

from ada_loss.experiment import runner
from ada_loss.experiment.studies import classification, depth

pytestmark = requires_gpu

DEVICE = '@cupy:0'


def write(folder, cfg, name='cfg.yaml'):
    path = os.path.join(str(folder), name)
    with open(path, 'w') as f:
        yaml.safe_dump(cfg, f)
    return path


def runs_of(out):
    """{run folder name: run.json} of every run under ``out``."""
    found = {}
    for root, _, files in os.walk(out):
        if 'run.json' in files:
            with open(os.path.join(root, 'run.json')) as f:
                found[os.path.relpath(root, out)] = json.load(f)
    return found


def tiny_depth(**top):
    """A depth-study grid small enough for seconds on a GPU: ResNet-20 at
    width 4 on 16x16 digits (sklearn's, no download; Fashion-MNIST is not
    on the GPU machine), 4 iterations, the FP32 run plus mixed16 with a
    fixed, the dynamic and the adaptive mode; no Fig. 4 (probed runs are
    CPU-only)."""
    cfg = {
        'table': 'depth_gpu', 'device': DEVICE,
        'study': {'fp32': True, 'downsample': 1, 'fig4': {'run': False}},
        'grid': {'models': ['resnet20'], 'datasets': ['digits'],
                 'precisions': ['mixed16'],
                 'modes': ['dynamic', 'adaptive'], 'fixed_scales': [64],
                 'seeds': [0]},
        'model': {'width': 4},
        'data': {'train_size': 256, 'test_size': 64},
        'train': {'batchsize': 32, 'lr': 0.05, 'max_iterations': 4,
                  'eval_batchsize': 64},
        'log': {'log_interval': '1 iteration', 'eval_interval': '2 iteration',
                'snapshot_interval': '2 iteration', 'loss_scale_interval': 1,
                'progress': 'none', 'plot': False},
    }
    cfg.update(top)
    return cfg


def assert_finished_on_device(info, device=DEVICE):
    assert info['status'] == 'finished', info.get('error')
    assert info['device'] == device
    assert info['iterations'] == 4
    for key in ('final_train_loss', 'final_test_loss',
                'final_test_accuracy', 'loss_scale'):
        assert isinstance(info[key], (int, float)), key
        assert math.isfinite(info[key]), key


def test_depth_study_grid_trains_on_the_gpu(tmp_path):
    out = str(tmp_path / 'out')
    config = write(tmp_path, tiny_depth())
    assert runner.main(depth.STUDY, ['--config', config, '--out', out,
                                     '--no-table', '--jobs', '1']) == 0
    runs = runs_of(out)
    # fp32 (float32) + mixed16 x (fixed:64, dynamic, adaptive)
    assert len(runs) == 4, sorted(runs)
    for name, info in runs.items():
        assert_finished_on_device(info)
    modes = {(info['precision'], info['mode']) for info in runs.values()}
    assert modes == {('float32', 'fp32'), ('mixed16', 'fixed:64'),
                     ('mixed16', 'dynamic'), ('mixed16', 'adaptive')}
    adaptive = [os.path.join(out, n) for n, i in runs.items()
                if i['mode'] == 'adaptive'][0]
    # loss_scales.csv read the per-layer scales back from the device
    with open(os.path.join(adaptive, 'loss_scales.csv')) as f:
        rows = f.read().splitlines()
    assert len(rows) > 1 and rows[0] == 'iteration,layer,alpha,beta'


@pytest.mark.parametrize('mode', ['adaptive', 'dynamic:growth_interval=2'])
def test_killed_and_resumed_device_run_is_bit_identical(tmp_path, mode):
    cifar = ondisk_fixtures.make_cifar10(str(tmp_path))
    path = KR.write_config(tmp_path, cifar, modes=(mode,))
    with open(path) as f:
        cfg = yaml.safe_load(f)
    cfg['device'] = DEVICE
    with open(path, 'w') as f:
        yaml.safe_dump(cfg, f)
    folder, whole = KR.run_killed_twice(path, tmp_path, mode)
    KR.assert_same_run(folder, whole)
    for f in (folder, whole):
        with open(os.path.join(f, 'run.json')) as fh:
            assert json.load(fh)['device'] == DEVICE


#: the tolerance of the device's final losses against the CPU's. Not bit
#: for bit: cuBLAS and CuPy's reductions sum in another order than
#: OpenBLAS and NumPy (CuPy leaves TF32 off unless CUPY_TF32=1). In float32
#: each GEMM then differs by a few units in the last place (~1e-6
#: relative), and four SGD steps of a small CNN amplify that by far less
#: than 1000x: rtol 1e-3. In mixed16 a last-bit difference can move an
#: FP16 rounding (2^-11 relative) and the adaptive scales follow the
#: gradients: rtol 2e-2, still well below what one SGD step changes the loss
#: by at lr 0.05.
RTOL = {'fp32': 1e-3, 'adaptive': 2e-2}


@pytest.mark.parametrize('mode', sorted(RTOL))
def test_device_losses_are_close_to_the_cpu_ones(tmp_path, mode):
    cfg = tiny_depth(table='cmp')
    for key in ('device', 'study'):
        del cfg[key]
    cfg['grid'] = {'models': ['small_cnn'], 'datasets': ['digits'],
                   'modes': [mode], 'fixed_scales': [], 'seeds': [0]}
    main = partial(runner.main, classification.STUDY)
    infos = {}
    for device in ('@numpy', DEVICE):
        out = str(tmp_path / device.strip('@').replace(':', ''))
        config = write(tmp_path, dict(cfg, device=device))
        assert main(['--config', config, '--out', out, '--no-table']) == 0
        (info,) = runs_of(out).values()
        assert info['status'] == 'finished', info.get('error')
        infos[device] = info
    cpu, gpu = infos['@numpy'], infos[DEVICE]
    assert cpu['device'] == '@numpy' and gpu['device'] == DEVICE
    for key in ('final_train_loss', 'final_test_loss'):
        assert gpu[key] == pytest.approx(cpu[key], rel=RTOL[mode]), key
    assert gpu['skipped_steps'] == cpu['skipped_steps']


def test_two_jobs_share_the_gpu(tmp_path):
    out = str(tmp_path / 'out')
    cfg = tiny_depth()
    cfg['study']['fp32'] = False
    cfg['grid'].update(modes=['adaptive'], fixed_scales=[64])
    config = write(tmp_path, cfg)
    assert runner.main(depth.STUDY, ['--config', config, '--out', out,
                                     '--no-table', '--jobs', '2']) == 0
    runs = runs_of(out)
    assert len(runs) == 2, sorted(runs)
    for info in runs.values():
        assert_finished_on_device(info)


def test_fp8_cells_train_on_the_gpu(tmp_path):
    """The third edition's FP8 cells on the device: E4M3 unscaled and with
    the recipe's forward (grad=loss), the default adaptive mode (its guard
    decided on the device) and init_scale=auto."""
    out = str(tmp_path / 'out')
    cfg = tiny_depth()
    cfg['study']['fp32'] = False
    cfg['grid'].update(
        precisions=['fp8_e4m3', 'fp8_e4m3:recipe=current,grad=loss'],
        modes=['adaptive', 'adaptive:init_scale=auto'], fixed_scales=[])
    config = write(tmp_path, cfg)
    assert runner.main(depth.STUDY, ['--config', config, '--out', out,
                                     '--no-table', '--jobs', '2']) == 0
    runs = runs_of(out)
    assert len(runs) == 4, sorted(runs)
    for info in runs.values():
        assert_finished_on_device(info)
