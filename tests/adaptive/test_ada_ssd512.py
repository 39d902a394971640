"""ChainerCV SSD512 converted by AdaLossScaled: all 39 GEMM layers (incl. the
DilatedConvolution2D layers of VGG16) become scale-aware, the forward result
is bitwise unchanged, and one float32 training step with the multibox loss
matches plain backprop bit for bit, with Algorithm 5 rescaling at the
feature maps feeding several heads.

Heavy on CPU (one 512x512 image: two forward/backward passes, ~1 min)."""
import copy

import chainer
import chainer.links as L
import numpy as np
import pytest

from ada_loss import links as AL
from ada_loss.adaptive import AdaLossScaled

chainercv = pytest.importorskip('chainercv')
from chainercv.links import SSD512  # NOQA
from chainercv.links.model.ssd import multibox_loss  # NOQA

# (head index, extractor layer producing that feature map, next consumer)
FEATURE_MAPS = [
    (0, 'extractor/conv4_3', 'extractor/conv5_1'),   # via norm4 / max pool
    (1, 'extractor/conv7', 'extractor/conv8_1'),
    (2, 'extractor/conv8_2', 'extractor/conv9_1'),
    (3, 'extractor/conv9_2', 'extractor/conv10_1'),
    (4, 'extractor/conv10_2', 'extractor/conv11_1'),
    (5, 'extractor/conv11_2', 'extractor/conv12_1'),
    (6, 'extractor/conv12_2', None),
]


def test_ssd512_conversion_forward_and_one_step_bit_exact(capsys):
    np.random.seed(0)
    plain = SSD512(n_fg_class=20, pretrained_model=None)
    x = np.random.uniform(-100, 100, (1, 3, 512, 512)).astype(np.float32)
    bbox = np.array([[100, 120, 300, 260], [20, 300, 200, 480]], np.float32)
    label = np.array([3, 11], np.int32)
    gt_loc, gt_label = plain.coder.encode(bbox, label)
    assert (gt_label > 0).sum() > 0

    # Materialize the lazily-shaped parameters. Chainer fills the gradient of
    # a lazily initialized parameter with NaN: clear it.
    with chainer.using_config('train', False), \
            chainer.no_backprop_mode():
        plain(np.zeros((1, 3, 384, 384), np.float32))  # smallest that fits
    plain.cleargrads()
    dilated = sorted(p.lstrip('/') for p, link in plain.namedlinks()
                     if type(link) is L.DilatedConvolution2D)
    assert dilated == ['extractor/conv5_1', 'extractor/conv5_2',
                       'extractor/conv5_3', 'extractor/conv6']
    gemm = sorted(p.lstrip('/') for p, link in plain.namedlinks()
                  if isinstance(link, (L.Convolution2D,
                                       L.DilatedConvolution2D)))
    assert len(gemm) == 39

    model = copy.deepcopy(plain)
    capsys.readouterr()
    ada = AdaLossScaled(model)             # verbose: prints the report
    report = capsys.readouterr().out
    assert sorted(ada.converted) == gemm
    assert ada.not_converted == []
    assert '39 GEMM layers' in report
    for path in dilated + ['multibox/loc/0', 'multibox/conf/6']:
        assert path in report
    links = dict(model.namedlinks())
    for path in dilated:
        assert isinstance(links['/' + path], AL.DilatedConvolution2D)
    for path in gemm:
        assert getattr(links['/' + path], 'scale_key', None) == path
    assert model.extractor.conv6.dilate == (6, 6)

    results = {}
    for name, m, a in (('plain', plain, None), ('ada', model, ada)):
        opt = chainer.optimizers.MomentumSGD(lr=1e-3)
        opt.setup(m)
        m.cleargrads()
        mb_locs, mb_confs = m(x)
        loc_loss, conf_loss = multibox_loss(
            mb_locs, mb_confs, gt_loc[None], gt_label[None], 3)
        loss = loc_loss + conf_loss
        results[name] = (mb_locs.array.copy(), mb_confs.array.copy(),
                         float(loss.array))
        if a is None:
            loss.backward()
        else:
            a.backward(loss)
        opt.update()
        del loss, mb_locs, mb_confs, loc_loss, conf_loss

    # the forward result is bitwise unchanged by the conversion
    assert results['plain'][0].dtype == np.float32
    assert np.array_equal(results['plain'][0], results['ada'][0])
    assert np.array_equal(results['plain'][1], results['ada'][1])
    assert np.isfinite(results['plain'][2])

    # one step: every parameter bit for bit
    pa = dict(plain.namedparams())
    pb = dict(model.namedparams())
    assert sorted(pa) == sorted(pb)
    bad = [n for n in pa if not np.array_equal(pa[n].array, pb[n].array)]
    assert not bad, bad
    assert all(np.isfinite(p.array).all() for p in pa.values())

    alphas, betas = ada.loss_scales(), ada.layer_scales()
    assert sorted(alphas) == gemm
    assert max(alphas.values()) > 1 and max(betas.values()) > 1
    # Fan-out: gradients arriving at a feature map from its loc head, its
    # conf head and the next extractor stage carry different scales in at
    # least one map; the producer then carries the common (largest) one.
    rescaled = 0
    for i, producer, nxt in FEATURE_MAPS:
        consumers = ['multibox/loc/{}'.format(i), 'multibox/conf/{}'.format(i)]
        consumers += [nxt] if nxt else []
        arriving = [alphas[k] * betas[k] for k in consumers]
        if len(set(arriving)) > 1:
            rescaled += 1
        assert alphas[producer] == max(arriving)
    assert rescaled >= 1, (alphas, betas)
