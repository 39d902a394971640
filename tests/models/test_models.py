"""Tests of ada_loss.models: sizes, shapes, GEMM link types, mixed16, backward.

Exact parameter counts (gamma/beta of BN counted, running statistics not):

* CIFAR ResNet, 10 classes, option A: 97216 n - 21926 for depth 6n+2, i.e.
  ResNet-20 269,722; ResNet-56 853,018; ResNet-110 1,727,962 (0.27M, 0.85M,
  1.7M in He et al. 2016, Table 6). Option B adds 2,752.
* ImageNet, 1000 classes: ResNet-18 11,689,512; ResNet-50 25,557,032.
"""
import numpy
import pytest

import chainer
import chainer.functions as F
import chainer.links as L

from ada_loss import links as AL
from ada_loss import models


def num_params(model):
    return sum(p.size for p in model.params())


def link_paths(model):
    return {name for name, _ in model.namedlinks(skipself=True)}


def input_of(shape, dtype=numpy.float32, seed=0):
    return numpy.random.RandomState(seed).standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- sizes

@pytest.mark.parametrize('depth, exact, paper', [
    (20, 269722, 0.27e6), (56, 853018, 0.85e6), (110, 1727962, 1.7e6)])
def test_cifar_resnet_num_params(depth, exact, paper):
    model = models.CifarResNet(depth)
    assert num_params(model) == exact
    assert exact == 97216 * ((depth - 2) // 6) - 21926
    assert models.cifar_resnet_num_params(depth) == exact
    assert abs(exact - paper) / paper < 0.02
    assert abs(num_params(model) - exact) / exact < 0.01


def test_cifar_resnet_option_b_num_params():
    model = models.CifarResNet(20, shortcut='B')
    assert num_params(model) == 269722 + 2752
    assert models.cifar_resnet_num_params(20, shortcut='B') == 272474


def test_cifar_resnet_formula_other_configs():
    for kwargs in (dict(num_classes=100), dict(in_channels=1, width=8),
                   dict(shortcut='B', width=4, num_classes=7)):
        model = models.CifarResNet(32, **kwargs)
        assert num_params(model) == models.cifar_resnet_num_params(
            32, **kwargs)


@pytest.mark.parametrize('name, exact', [
    ('resnet18', 11689512), ('resnet50', 25557032)])
def test_imagenet_resnet_num_params(name, exact):
    model = models.build_imagenet_resnet(name)
    assert all(p.array is not None for p in model.params())
    assert num_params(model) == exact


# ---------------------------------------------------------------- structure

def test_cifar_resnet_link_paths():
    paths = link_paths(models.resnet20())
    for p in ('/conv1', '/bn1', '/fc', '/res2/0/conv1', '/res2/2/bn2',
              '/res3/0/conv2', '/res4/2/conv2'):
        assert p in paths
    assert '/res2/3' not in paths
    assert not any('shortcut' in p for p in paths)  # option A: no params
    paths_b = link_paths(models.resnet20(shortcut='B'))
    assert {'/res3/0/shortcut_conv', '/res3/0/shortcut_bn',
            '/res4/0/shortcut_conv'} <= paths_b
    assert '/res2/0/shortcut_conv' not in paths_b


def test_imagenet_resnet_link_paths():
    paths = link_paths(models.resnet50())
    for p in ('/conv1', '/bn1', '/fc', '/res2/0/conv3',
              '/res2/0/shortcut_conv', '/res5/2/bn3', '/res4/5/conv1'):
        assert p in paths
    assert '/res2/1/shortcut_conv' not in paths
    model = models.resnet50()
    # v1.5: stride on the 3x3 convolution of the subsampling block.
    assert model.res3[0].conv2.stride == (2, 2)
    assert model.res3[0].conv1.stride == (1, 1)
    assert '/res5/1/conv2' in link_paths(models.resnet18())


@pytest.mark.parametrize('name', sorted(models.MODELS))
def test_gemm_links_are_ada_loss_links(name):
    model = models.build_model(name, 10)
    gemm = [link for link in model.links()
            if isinstance(link, (L.Convolution2D, L.Linear,
                                 L.Deconvolution2D))]
    assert gemm
    for link in gemm:
        assert isinstance(link, (AL.Convolution2D, AL.Linear))
    convs = [link for link in gemm if isinstance(link, AL.Convolution2D)]
    if name != 'plain_cnn':
        assert all(link.b is None for link in convs)
        assert any(isinstance(link, L.BatchNormalization)
                   for link in model.links())
    else:
        assert not any(isinstance(link, L.BatchNormalization)
                       for link in model.links())


def test_option_a_shortcut_is_subsampled_zero_padded_identity():
    block = models.CifarResNet(8, width=4).res3[0]
    x = input_of((2, 4, 8, 8))
    s = block.shortcut(x).array
    assert s.shape == (2, 8, 4, 4)
    numpy.testing.assert_array_equal(s[:, :4], x[:, :, ::2, ::2])
    assert not s[:, 4:].any()


def test_build_model_and_errors():
    model = models.build_model('resnet20', 100, shortcut='B')
    assert isinstance(model, models.CifarResNet)
    assert model.fc.W.shape == (100, 64)
    assert isinstance(models.build_cifar_resnet('resnet32', 10),
                      models.CifarResNet)
    with pytest.raises(ValueError) as e:
        models.build_model('resnet19', 10)
    for name in models.MODELS:
        assert name in str(e.value)
    with pytest.raises(ValueError):
        models.CifarResNet(21)
    with pytest.raises(ValueError):
        models.CifarResNet(20, shortcut='C')
    with pytest.raises(ValueError):
        models.build_imagenet_resnet('resnet20')


# ---------------------------------------------------------------- forward

@pytest.mark.parametrize('depth', [20, 56, 110])
def test_cifar_resnet_output_shape(depth):
    model = models.CifarResNet(depth, num_classes=10)
    with chainer.no_backprop_mode():
        y = model(input_of((2, 3, 32, 32)))
    assert y.shape == (2, 10) and y.dtype == numpy.float32


def test_reduced_cifar_resnet_on_digits():
    model = models.resnet20(num_classes=10, in_channels=1, width=8)
    with chainer.no_backprop_mode():
        y = model(input_of((2, 1, 16, 16)))
    assert y.shape == (2, 10)


@pytest.mark.parametrize('name', ['resnet18', 'resnet50'])
def test_imagenet_resnet_output_shape(name):
    model = models.build_model(name, 1000)
    with chainer.no_backprop_mode():
        y = model(input_of((2, 3, 64, 64)))
    assert y.shape == (2, 1000) and y.dtype == numpy.float32


@pytest.mark.parametrize('size', [16, 28])
def test_small_models_output_shape(size):
    x = input_of((2, 1, size, size))
    for model in (models.SmallCNN(), models.PlainConvNet(4, 8, 10, 1)):
        with chainer.no_backprop_mode():
            assert model(x).shape == (2, 10)


# ---------------------------------------------------------------- backward

@pytest.mark.parametrize('model_fn, shape', [
    (lambda: models.resnet20(), (2, 3, 32, 32)),
    (lambda: models.resnet20(shortcut='B', width=4), (2, 3, 16, 16)),
    (lambda: models.SmallCNN(), (2, 1, 16, 16)),
    (lambda: models.PlainConvNet(6, 8), (2, 1, 16, 16)),
])
def test_backward_float32(model_fn, shape):
    model = model_fn()
    model.cleargrads()  # Chainer fills fresh gradients with NaN
    x = chainer.Variable(input_of(shape))
    y = model(x)
    F.softmax_cross_entropy(y, numpy.array([1, 2], numpy.int32)).backward()
    assert x.grad is not None and numpy.isfinite(x.grad).all()
    for name, p in model.namedparams():
        assert p.grad is not None, name
        assert numpy.isfinite(p.grad).all(), name


# ---------------------------------------------------------------- mixed16

@pytest.mark.parametrize('name, kwargs, shape', [
    ('resnet20', {}, (2, 3, 32, 32)),
    ('resnet20', dict(shortcut='B', in_channels=1, width=4), (2, 1, 16, 16)),
    ('resnet18', {}, (2, 3, 32, 32)),
    ('small_cnn', {}, (2, 1, 16, 16)),
    ('plain_cnn', dict(depth=4, width=8), (2, 1, 16, 16)),
])
def test_mixed16(name, kwargs, shape):
    with chainer.using_config('dtype', chainer.mixed16):
        model = models.build_model(name, 10, **kwargs)
        for link in model.links():
            if isinstance(link, (AL.Convolution2D, AL.Linear)):
                assert link.W.dtype == numpy.float16
                if link.b is not None:
                    assert link.b.dtype == numpy.float16
            elif isinstance(link, L.BatchNormalization):
                assert link.gamma.dtype == numpy.float32
                assert link.beta.dtype == numpy.float32
        model.cleargrads()
        x = chainer.Variable(input_of(shape, numpy.float16))
        y = model(x)
        assert y.dtype == numpy.float16 and y.shape == (2, 10)
        loss = F.softmax_cross_entropy(
            F.cast(y, numpy.float32), numpy.array([0, 3], numpy.int32))
        loss.backward()
    assert x.grad is not None and x.grad.dtype == numpy.float16
    for path, p in model.namedparams():
        assert p.grad is not None, path
        assert p.grad.dtype == p.dtype, path
        assert numpy.isfinite(p.grad).all(), path
