"""scripts/loss_gradient_in_format.py (issue 32 item 2, docs/gpu.md fifth
round): the loss gradient it measures is Chainer's own backward of the
batch-mean softmax cross-entropy, and its cast report agrees with an
independent E4M3 cast (ml_dtypes) on a gradient whose shares are known."""

import chainer
import chainer.functions as F
import ml_dtypes
import numpy

from ada_loss.formats import get_format
from repo_modules import load

lg = load('scripts/loss_gradient_in_format.py')


class _Logits(chainer.Link):
    """A 'model' returning fixed logits (whatever its input)."""

    def __init__(self, logits):
        super(_Logits, self).__init__()
        self.logits = logits

    def forward(self, x):
        return chainer.Variable(self.logits)


def test_loss_gradient_is_chainers_backward():
    rng = numpy.random.RandomState(0)
    logits = rng.randn(32, 10).astype(numpy.float32) * 3
    t = rng.randint(0, 10, 32).astype(numpy.int32)
    g = lg.loss_gradient(_Logits(logits), None, t)
    y = chainer.Variable(logits)
    ref, = chainer.grad([F.softmax_cross_entropy(y, t)], [y])
    # p − 1 cancels in float32 where p is near 1: a few ulps of the
    # difference, as Chainer (which goes through log-softmax) rounds it
    numpy.testing.assert_allclose(g, ref.array, rtol=2e-5, atol=1e-8)


def test_uniform_softmax_at_batch_128_in_e4m3():
    """p = 0.1 everywhere, B = 128: wrong-class entries 0.1/128 ≈ 2^-10.3,
    below half of E4M3's smallest subnormal 2^-9, flush; the true-class
    entry 0.9/128 survives as a subnormal; everything is subnormal."""
    b = 128
    t = numpy.arange(b, dtype=numpy.int32) % 10
    g = numpy.full((b, 10), 0.1, numpy.float32)
    g[numpy.arange(b), t] -= 1
    g = (g / b).astype(numpy.float32)
    r = lg.cast_report(g, t, get_format('fp8_e4m3'), 1.0)
    ref = g.astype(ml_dtypes.float8_e4m3fn).astype(numpy.float64)
    assert r['flushed'] == 90.0 == 100.0 * numpy.mean(ref == 0)
    assert r['flushed_true'] == 0.0 and r['subnormal'] == 100.0
    err = numpy.linalg.norm(ref - g) / numpy.linalg.norm(g)
    assert abs(r['rel_error'] - 100.0 * err) < 1e-9
    # at 2^8 every entry is a normal E4M3 number: nothing flushed
    r = lg.cast_report(g, t, get_format('fp8_e4m3'), 256.0)
    assert r['flushed'] == 0.0 and r['subnormal'] == 0.0
    assert abs(r['off_mass_kept'] - 100.0) < 7.0
