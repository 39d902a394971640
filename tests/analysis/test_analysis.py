"""Gradient statistics and the recorder."""
import json
import math
import os
import subprocess
import sys

import chainer
import numpy
import pytest

from ada_loss.analysis import (
    RecordingLossScaling, expected_loss_scale, load_csv, underflow_rate)
from ada_loss.analysis import grad_stats
from ada_loss.models import build_model
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import Classifier, dtype_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_statistics_definitions():
    g = numpy.zeros(1000, numpy.float32)
    g[:200] = numpy.linspace(1e-3, 1, 200)
    g[200:203] = (1e-9, 2e-8, -5e-8)            # below 2^-24 = 5.96e-8
    g[203] = 2.0 ** -24                          # representable: not counted
    assert underflow_rate(g) == pytest.approx(3 / 1000)
    # 204 nonzeros: k = ceil(2.04) = 3 -> third smallest |g| is 5e-8
    assert expected_loss_scale(g) == pytest.approx(1 / 5e-8, rel=1e-6)
    assert math.isnan(expected_loss_scale(numpy.zeros(4)))
    rng = numpy.random.RandomState(0)
    h = (rng.randn(5000) * 10.0 ** rng.uniform(-10, -3, 5000)).astype(
        numpy.float32)
    for a in (1.0, 8.0, 1024.0):
        count = grad_stats.underflow_count_from_histogram(
            grad_stats.exponent_histogram(h * a), a)
        assert count / h.size == underflow_rate(h)


class _Spy(object):
    """A loss scaling that reports whether a hook is installed."""

    recovers = False
    scale = 4.0

    def __init__(self):
        self.hooked = []

    def bind(self, model):
        pass

    def backward(self, loss):
        self.hooked.append(bool(chainer.get_function_hooks()))
        loss.backward(loss_scale=self.scale)

    def update(self, found_nonfinite):
        pass


def _classifier(dtype):
    with dtype_config(dtype):
        net = build_model('plain_cnn', 10, depth=3, width=4)
    return Classifier(net, dtype)


def _step(chain, scaling, seed=0):
    rng = numpy.random.RandomState(seed)
    x = rng.rand(4, 1, 8, 8).astype(numpy.float32)
    t = rng.randint(0, 10, 4).astype(numpy.int32)
    chain.cleargrads()
    reporter = chainer.Reporter()
    reporter.add_observer('main', chain)
    with reporter.scope({}):
        loss = chain(x, t)
    scaling.backward(loss)
    scaling.update(False)


def test_recorder_installed_only_on_recorded_iterations():
    chain = _classifier('float32')
    spy = _Spy()
    scaling = RecordingLossScaling(spy, every=3)
    scaling.bind(chain)
    for _ in range(6):
        _step(chain, scaling)
    assert spy.hooked == [True, False, True, False, False, True]
    rows = scaling.recorder.records
    assert sorted({r['iteration'] for r in rows}) == [1, 3, 6]
    first = [r for r in rows if r['iteration'] == 1]
    # Layer IDs follow the backward order: the classifier first.
    assert [r['layer'] for r in first] == [
        'predictor/fc', 'predictor/conv3', 'predictor/conv2',
        'predictor/conv1']
    assert [r['layer_id'] for r in first] == [0, 1, 2, 3]
    assert all(r['alpha'] == 4.0 for r in rows)
    assert all(math.isnan(r['fp16_underflow']) for r in rows)  # FP32 run


@pytest.mark.parametrize('mode', ['fixed:128', 'adaptive'])
def test_recorder_in_mixed16(mode):
    chain = _classifier('mixed16')
    inner = make_loss_scaling(mode)
    scaling = RecordingLossScaling(inner, every=1)
    if mode == 'adaptive':
        inner.bind = lambda m: type(inner).bind(inner, m, verbose=False)
    scaling.bind(chain)
    _step(chain, scaling)
    rows = {r['layer']: r for r in scaling.recorder.records}
    assert len(rows) == 4
    for name, r in rows.items():
        assert r['dtype'] == 'float16'
        if name == 'predictor/conv1':     # its input needs no gradient
            assert math.isnan(r['fp16_underflow'])
        else:
            assert 0 <= r['zeros_fp32'] <= r['zeros_fp16'] <= 1
    if mode == 'fixed:128':
        assert {r['alpha'] for r in rows.values()} == {128.0}
    else:
        assert {k: r['alpha'] for k, r in rows.items()} == dict(
            inner.loss_scales())
    assert scaling.recorder.summary()['sigma_max'] > 0
