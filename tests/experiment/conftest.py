"""Shared fixtures: a tiny config (small CNN on 16x16 digits, a few
iterations) so that every test trains in about a second."""
import os

import pytest
import yaml

TINY = {
    'table': 'tiny',
    'grid': {'models': ['small_cnn'], 'datasets': ['digits'],
             'modes': ['fp32'], 'fixed_scales': [], 'seeds': [0]},
    'model': {'width': 4},
    'data': {'train_size': 256, 'test_size': 64},
    'train': {'batchsize': 32, 'lr': 0.05, 'max_iterations': 2,
              'eval_batchsize': 64},
    'log': {'log_interval': '1 iteration', 'eval_interval': '1 iteration',
            'snapshot_interval': '1 iteration', 'loss_scale_interval': 1,
            'progress': 'none'},
}


def merge(base, top):
    out = dict(base)
    for k, v in top.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and \
            isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def tiny_config(tmp_path):
    """``tiny_config(**sections)`` writes a YAML config and returns its
    path; keyword arguments are merged into the sections of :data:`TINY`."""
    def make(name='tiny.yaml', **sections):
        path = os.path.join(str(tmp_path), name)
        with open(path, 'w') as f:
            yaml.safe_dump(merge(TINY, sections), f)
        return path
    return make


@pytest.fixture
def out_dir(tmp_path):
    return os.path.join(str(tmp_path), 'results')


@pytest.fixture
def overflowing_fixed(monkeypatch):
    """``fixed:8192`` backpropagates at 2^100 instead (an injected overflow:
    a scale that large is refused as a mode, being above FP16's largest
    value, but the harness must still record a run that overflows)."""
    from ada_loss.scaling import methods

    def backward(self, loss):
        with methods._scaled_backward():    # as FixedScaling.backward
            loss.backward(loss_scale=2.0 ** 100 if self._scale == 8192
                          else self._scale)
    monkeypatch.setattr(methods.FixedScaling, 'backward', backward)
    return 8192
