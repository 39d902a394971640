"""CifarResNet(shortcut='authors'): the authors' CIFAR ResNet
(kumasento/gradient-scaling, chainerlp/links/models/resnet.py: ResNetCIFAR).
The parameter counts below were read off their model, instantiated from
their repository at 0ca4354 (sum of its parameter sizes, 10 classes)."""
import chainer
import numpy as np
import pytest

from ada_loss.models import CifarResNet, cifar_resnet_num_params

THEIR_PARAMS = {20: 272762, 56: 856058, 110: 1731002}


@pytest.mark.parametrize('depth', [20, 56, 110])
def test_parameter_count_as_theirs(depth):
    assert cifar_resnet_num_params(depth, shortcut='authors') == \
        THEIR_PARAMS[depth]
    if depth == 20:     # building the others takes long on 2 cores
        model = CifarResNet(depth, shortcut='authors')
        assert sum(p.size for p in model.params()) == THEIR_PARAMS[depth]
    assert THEIR_PARAMS[depth] - cifar_resnet_num_params(depth) == 3040


def test_shortcut_structure_as_theirs():
    model = CifarResNet(56, shortcut='authors')
    projections = sorted(path for path, _ in model.namedlinks()
                         if path.endswith('/shortcut_conv'))
    assert projections == ['/res2/0/shortcut_conv', '/res3/0/shortcut_conv',
                           '/res4/0/shortcut_conv']
    for stage, stride in (('res2', 1), ('res3', 2), ('res4', 2)):
        first = getattr(model, stage)[0]
        # theirs: conv1 stride 1, conv2 and the 1x1 projection stride 2
        assert first.conv1.stride == (1, 1)
        assert first.conv2.stride == (stride, stride)
        assert first.shortcut_conv.stride == (stride, stride)
        assert first.shortcut_conv.W.shape[2:] == (1, 1)
        assert not getattr(model, stage)[1].projection
    # option A (ours by default) has none
    assert not any(p.endswith('shortcut_conv') for p, _ in
                   CifarResNet(20).namedlinks())


def test_he_normal_fan_out_initialization():
    np.random.seed(0)
    model = CifarResNet(20, shortcut='authors', num_classes=10)
    W = model.res3[1].conv1.W.array         # (32, 32, 3, 3): fan_out 288
    assert W.std() == pytest.approx(np.sqrt(2.0 / 288), rel=0.05)
    W = model.res3[0].conv1.W.array         # (32, 16, 3, 3): fan_in 144
    assert W.std() == pytest.approx(np.sqrt(2.0 / 288), rel=0.05)
    assert model.fc.W.array.std() == pytest.approx(np.sqrt(2.0 / 10),
                                                   rel=0.15)
    assert (model.fc.b.array == 0).all()
    np.random.seed(0)
    ours = CifarResNet(20)                  # He-normal fan-in
    assert ours.res3[0].conv1.W.array.std() == pytest.approx(
        np.sqrt(2.0 / 144), rel=0.05)


def test_forward_shapes_and_mixed16():
    x = np.random.RandomState(0).randn(2, 3, 14, 14).astype(np.float32)
    y = CifarResNet(20, shortcut='authors', width=4)(x)
    assert y.shape == (2, 10)
    with chainer.using_config('dtype', chainer.mixed16):
        model = CifarResNet(20, shortcut='authors', width=4)
        y = model(x.astype(np.float16))
    assert y.dtype == np.float16
    with pytest.raises(ValueError, match='authors'):
        CifarResNet(20, shortcut='C')
