"""Training on the GPU with Chainer's Trainer: CIFAR ResNet-20 on real data
(scikit-learn digits, upsampled to 32x32, three channels) in float32 and in
mixed16 with every loss-scaling mode; the loss falls, no step is skipped
without cause, and the adaptive run's scales are powers of two."""
import numpy
import pytest

import chainer
from chainer import training
from chainer.training import extensions

from ada_loss.models import build_model
from ada_loss.scaling import make_loss_scaling, resolve_precision
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, dtype_config, setup_optimizer)

import substrate_helpers as H
from gpu_helpers import requires_gpu

pytestmark = requires_gpu

STEPS = 120
BATCH = 64


def _digits32():
    train, _ = H.digits_split(16)
    out = []
    for x, t in train:
        x = numpy.repeat(numpy.repeat(x, 2, axis=1), 2, axis=2)  # 16 -> 32
        out.append((numpy.repeat(x, 3, axis=0).astype(numpy.float32), t))
    return out


@pytest.mark.parametrize('mode,precision', [
    ('fp32', 'float32'), ('fixed:128', 'mixed16'), ('dynamic', 'mixed16'),
    ('adaptive', 'mixed16'), ('amax', 'mixed16')])
def test_resnet20_trains_on_gpu(mode, precision, tmp_path):
    numpy.random.seed(0)
    with dtype_config(precision):
        model = Classifier(build_model('resnet20', 10), precision)
    model.to_device('@cupy:0')
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(0.05), model,
                          precision)
    it = chainer.iterators.SerialIterator(_digits32(), BATCH, shuffle=True)
    scaling = make_loss_scaling(mode, precision)
    updater = MixedPrecisionUpdater(it, opt, scaling, mode=mode,
                                    device='@cupy:0')
    trainer = training.Trainer(updater, (STEPS, 'iteration'),
                               out=str(tmp_path))
    log = extensions.LogReport(trigger=(1, 'iteration'), log_name=None)
    trainer.extend(log)
    trainer.run()
    losses = [e['main/loss'] for e in log.log]
    assert len(losses) == STEPS and numpy.isfinite(losses).all()
    first, last = numpy.mean(losses[:10]), numpy.mean(losses[-20:])
    assert first > 1.5 and last < 0.5 * first, (first, last)
    assert updater.skipped_steps <= (2 if mode in (
        'dynamic', 'adaptive', 'amax') else 0)
    if mode == 'adaptive':
        scales = scaling.loss_scales()
        assert len(scales) == 20
        assert all(v >= 1 and numpy.frexp(v)[0] == 0.5
                   for v in scales.values())
        assert model.predictor.conv1.W.array.dtype == numpy.float16
