"""mixed16 training steps of a CIFAR ResNet: the fast element-wise path
(``fp16_elementwise = 'emulated'``, the default) against Chainer's own
float16 arithmetic (``'native'``), bit for bit.

A ResNet-8 (width 8, option-A shortcuts: stride-2 slicing and zero padding)
built as training builds it (``Classifier`` in mixed16, which converts its
batch normalizations, ``setup_optimizer`` with FP32 master weights,
``MixedPrecisionUpdater``) runs three steps on the same batches, once per
path; the GEMMs are the emulated FP16 GEMMs in both, and Chainer's backward
sums the gradients of each block's input through the nodes'
``backward_accumulate`` in the fast path. Compared, as bit
patterns: the loss of every step, every parameter's gradient after the last
step (FP16 for the GEMM weights, FP32 for γ/β), the FP16 weights, the FP32
master weights, and the batch-norm running averages. With Chainer's backward
(``fixed``) and with the ⟨α, δ⟩ backward (``adaptive``).

The run also checks that the fast nodes ran (and the native ones did not in
the reference), that the gradients they saw hold FP16 subnormals, and that
the comparison catches one addition rounded toward zero.
"""
import contextlib
import io
import sys

import numpy
import pytest

import chainer
from chainer.functions.activation import relu as chainer_relu
from chainer.functions.math import basic_math

from ada_loss import formats
from ada_loss import links as AL
from ada_loss.functions.add import Add
from ada_loss.functions.batch_normalization import (
    Float16BatchNormalizationImpl)
from ada_loss.functions.relu import ReLU, ReLUGrad
from ada_loss.models.cifar_resnet import CifarResNet
from ada_loss.scaling import make_loss_scaling
from ada_loss.training import (
    Classifier, MixedPrecisionUpdater, dtype_config, setup_optimizer)

F16 = numpy.float16


class NodeRecorder(chainer.FunctionHook):
    """Types of the nodes applied, BN implementations, and how many FP16
    subnormals the element-wise gradient nodes received."""

    name = 'NodeRecorder'

    def __init__(self):
        self.types = set()
        self.subnormals = 0

    def forward_preprocess(self, function, in_data):
        self.types.add(type(function))
        if isinstance(function, (ReLUGrad, chainer_relu.ReLUGrad2, Add,
                                 basic_math.Add)):
            for a in in_data:
                if a.dtype == F16:
                    m = numpy.abs(a.astype(numpy.float32))
                    self.subnormals += int(((m > 0) & (m < 2.0 ** -14)).sum())

    def forward_postprocess(self, function, in_data):
        # the batch-normalization implementation is chosen in forward
        impl = getattr(function, '_impl', None)
        if impl is not None:
            self.types.add(type(impl))


def _data(n=32, seed=0):
    rs = numpy.random.RandomState(seed)
    x = rs.standard_normal((n, 3, 32, 32)).astype(numpy.float32)
    t = rs.randint(0, 10, n).astype(numpy.int32)
    return [(x[i], t[i]) for i in range(n)]


def _run(path, mode, steps=3, batch=16):
    numpy.random.seed(0)
    with dtype_config('mixed16'):
        model = Classifier(CifarResNet(8, 10, width=8), 'mixed16')
    opt = setup_optimizer(chainer.optimizers.MomentumSGD(0.1), model,
                          'mixed16')
    it = chainer.iterators.SerialIterator(_data(), batch, shuffle=False)
    with contextlib.redirect_stdout(io.StringIO()):
        up = MixedPrecisionUpdater(it, opt, make_loss_scaling(mode, 'mixed16'),
                                   mode)
    reporter = chainer.Reporter()
    reporter.add_observer('main', model)
    rec = NodeRecorder()
    losses = []
    with chainer.using_config('fp16_elementwise', path), rec:
        for _ in range(steps):
            obs = {}
            with reporter.scope(obs):
                up.update()
            losses.append(numpy.asarray(obs['main/loss'].array))
    out = {'loss/{}'.format(i): l for i, l in enumerate(losses)}
    for name, p in model.namedparams():
        out['param' + name] = p.array.copy()
        out['grad' + name] = p.grad.copy()
        master = getattr(p.update_rule, '_fp32_param', None)
        if master is not None:
            out['master' + name] = master.array.copy()
    for name, link in model.namedlinks():
        if isinstance(link, chainer.links.BatchNormalization):
            out['avg_mean' + name] = link.avg_mean.copy()
            out['avg_var' + name] = link.avg_var.copy()
    return model, out, rec


def _differences(a, b):
    assert a.keys() == b.keys()
    diff = []
    for k in a:
        x, y = numpy.atleast_1d(a[k]), numpy.atleast_1d(b[k])
        if x.dtype != y.dtype or x.shape != y.shape or not numpy.array_equal(
                x.view(numpy.uint8), y.view(numpy.uint8)):
            diff.append(k)
    return diff


@pytest.mark.parametrize('mode', ['fixed:16', 'adaptive'])
def test_mixed16_step_bit_identical_to_native(mode):
    model, fast, rec = _run('emulated', mode)
    _, ref, rec_ref = _run('native', mode)
    # the paths ran where they should
    assert isinstance(model.predictor.bn1, AL.BatchNormalization)
    assert {ReLU, ReLUGrad, Add, Float16BatchNormalizationImpl} <= rec.types
    assert not {chainer_relu.ReLU, chainer_relu.ReLUGrad2} & rec.types
    if mode.startswith('fixed'):
        # Chainer's backward summed the gradients of each block's input
        # through GradAccumulation (the ⟨α, δ⟩ backward sums itself)
        assert basic_math.Add not in rec.types
        assert basic_math.Add in rec_ref.types
    assert not {ReLU, ReLUGrad, Add, Float16BatchNormalizationImpl} \
        & rec_ref.types
    assert rec.subnormals > 1000 and rec.subnormals == rec_ref.subnormals
    # something was learned, in FP16
    w = '/predictor/res2/0/conv1/W'
    assert fast['param' + w].dtype == F16
    assert fast['master' + w].dtype == numpy.float32
    assert len(fast) > 60
    assert _differences(fast, ref) == []


def test_comparison_catches_a_rounding_error_in_one_addition(monkeypatch):
    """The first shortcut sum rounded toward zero instead of to nearest (its
    elements at most one ulp off) is seen."""
    calls = []

    def toward_zero(y):
        h = formats.narrow(y)
        if not calls:
            up = numpy.abs(formats.widen(h)) > numpy.abs(y)
            assert up.any()
            h.view(numpy.uint16)[up] -= 1      # one ulp toward zero
        calls.append(1)
        return h

    _, ref, _ = _run('native', 'fixed:16', steps=1)
    monkeypatch.setattr(sys.modules['ada_loss.functions.add'], 'narrow',
                        toward_zero)
    _, bad, _ = _run('emulated', 'fixed:16', steps=1)
    assert calls
    assert _differences(bad, ref)
