"""SSD on ChainerCV in float32/mixed16 with every loss-scaling mode."""
import os
import random

import chainer
import numpy
import pytest
from chainer import initializers
from chainercv.links.model.ssd import Normalize

from ada_loss.datasets.voc import get_voc_detection_test
from ada_loss.datasets.voc import get_voc_detection_train
from ada_loss.detection import (
    FP32Normalize, MultiboxTrainChain, SSDTrainTransform, build_ssd,
    evaluate_detection, setup_ssd_optimizer)
from ada_loss.links import GEMM_LINK_TYPES
from ada_loss.scaling import make_loss_scaling, resolve_precision
from ada_loss.training import MixedPrecisionUpdater, all_grads_finite

MODES = ('fp32', 'none', 'fixed:128', 'dynamic', 'adaptive')
SLOW = os.environ.get('ADA_LOSS_SLOW_TESTS') == '1'


def test_fp32_normalize_is_safe_in_fp16():
    # |x| ~ 12 on 512 channels: sum(x^2) > 65504 in FP16.
    x = numpy.abs(numpy.random.RandomState(0).randn(1, 512, 2, 2) * 15)
    x = x.astype(numpy.float16)
    with chainer.using_config('dtype', chainer.mixed16):
        norm = Normalize(512, initial=initializers.Constant(20))
    with numpy.errstate(all='ignore'):
        assert not norm(x).array.any()        # ChainerCV's: all zeros
    norm.__class__ = FP32Normalize
    xv = chainer.Variable(x)
    y = norm(xv)
    assert y.dtype == numpy.float16
    x32 = x.astype(numpy.float32)
    ref = 20 * x32 / (numpy.sqrt((x32 ** 2).sum(1, keepdims=True)) + 1e-5)
    numpy.testing.assert_allclose(y.array, ref, rtol=2e-3, atol=1e-3)
    y.grad = numpy.ones_like(y.array)
    y.backward()
    assert xv.grad.dtype == numpy.float16 and numpy.isfinite(xv.grad).all()


_GemmLink = tuple(GEMM_LINK_TYPES.values())


def test_build_ssd512_mixed16():
    model = build_ssd('ssd512', 20, 'mixed16')
    assert model.insize == 512 and model.n_fg_class == 20
    assert isinstance(model.extractor.norm4, FP32Normalize)
    assert model.extractor.norm4.scale.dtype == numpy.float16
    assert isinstance(model.extractor.conv5_1, _GemmLink)   # dilated
    assert all(isinstance(model.multibox.loc[i], _GemmLink)
               for i in range(7))
    initialized = [p for p in model.params() if p.array is not None]
    assert initialized and all(p.dtype == numpy.float16 for p in initialized)
    with pytest.raises(ValueError, match='local .npz'):
        build_ssd('ssd512', 20, 'float32', pretrained_model='imagenet')


def _one_iteration(model_name, mode, voc_root, batch_size=1, seed=0):
    random.seed(seed)
    numpy.random.seed(seed)
    precision = resolve_precision(mode)
    model = build_ssd(model_name, 20, precision)
    chain = MultiboxTrainChain(model)
    train = chainer.datasets.TransformDataset(
        get_voc_detection_train(voc_root),
        SSDTrainTransform(model.coder, model.insize, model.mean,
                          photometric=False))
    iterator = chainer.iterators.SerialIterator(train, batch_size)
    optimizer = setup_ssd_optimizer(chain, precision=precision)
    scaling = make_loss_scaling(mode)
    if mode.startswith('adaptive'):
        scaling.bind = lambda m, s=scaling: type(s).bind(s, m, verbose=False)
    updater = MixedPrecisionUpdater(iterator, optimizer, scaling, mode)
    reporter = chainer.Reporter()
    reporter.add_observer('main', chain)
    observation = {}
    with reporter.scope(observation):
        updater.update()
    loss = float(observation['main/loss'].array)
    return model, chain, updater, loss


@pytest.mark.parametrize('mode', MODES)
def test_tiny_ssd_one_iteration_per_mode(voc_root, mode):
    model, chain, updater, loss = _one_iteration('ssd_tiny', mode, voc_root,
                                                 batch_size=2)
    assert numpy.isfinite(loss) and loss > 0
    want = numpy.float32 if mode == 'fp32' else numpy.float16
    assert model.extractor.conv1.W.dtype == want
    if mode == 'dynamic':
        # 2^16 initial scale overflows FP16: step skipped, scale halved.
        assert updater.skipped_steps in (0, 1)
    else:
        assert updater.skipped_steps == 0 and all_grads_finite(chain)
    if mode != 'fp32' and updater.skipped_steps == 0:
        master = chain.model.extractor.conv1.W.update_rule._fp32_param
        assert master is not None and master.dtype == numpy.float32


@pytest.mark.parametrize('mode', MODES if SLOW else ('adaptive',))
def test_ssd512_mixed16_one_iteration(voc_root, mode):
    """SSD512 (512x512) takes ~15-60 s per iteration on 2 CPU cores; all
    modes run with ADA_LOSS_SLOW_TESTS=1."""
    model, chain, updater, loss = _one_iteration('ssd512', mode, voc_root)
    assert numpy.isfinite(loss) and loss > 0
    assert updater.skipped_steps == (1 if mode == 'dynamic' else 0)
    if mode == 'adaptive':
        scales = updater.loss_scaling.loss_scales()
        assert len(scales) == 39        # every conv of SSD512
        assert all(numpy.isfinite(a) and a >= 1 for a in scales.values())


def test_evaluator_runs_in_mixed16(voc_root):
    model, _, _, _ = _one_iteration('ssd_tiny', 'adaptive', voc_root)
    test = get_voc_detection_test(voc_root)
    result = evaluate_detection(model, test, batch_size=2)
    assert 0 <= result['map'] <= 1
    assert numpy.isfinite(result['ap/dog']) and numpy.isnan(
        result['ap/aeroplane'])
    assert chainer.config.train      # predict restored the config


def test_train_transform_outputs(voc_root):
    model = build_ssd('ssd_tiny', 20, 'float32')
    transform = SSDTrainTransform(model.coder, model.insize, model.mean,
                                  photometric=False)
    numpy.random.seed(1)
    random.seed(1)
    img, mb_loc, mb_label = transform(get_voc_detection_train(voc_root)[0])
    n_default = len(model.coder._default_bbox)
    assert img.shape == (3, 64, 64) and img.dtype == numpy.float32
    assert mb_loc.shape == (n_default, 4) and mb_loc.dtype == numpy.float32
    assert mb_label.shape == (n_default,) and mb_label.dtype == numpy.int32


def test_photometric_distortion_with_opencv(voc_root):
    model = build_ssd('ssd_tiny', 20, 'float32')
    transform = SSDTrainTransform(model.coder, model.insize, model.mean,
                                  photometric=True)
    assert transform.photometric
    img, _, _ = transform(get_voc_detection_train(voc_root)[0])
    assert img.shape == (3, 64, 64)


