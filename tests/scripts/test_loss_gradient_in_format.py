"""scripts/loss_gradient_in_format.py (issue 32 item 2, docs/gpu.md fifth
round): the loss gradient it measures is Chainer's own backward of the
batch-mean softmax cross-entropy, and its cast report agrees with an
independent E4M3 cast (ml_dtypes) on a gradient whose shares are known."""

import gzip

import chainer
import chainer.functions as F
import ml_dtypes
import numpy

from ada_loss.experiment import models
from ada_loss.formats import get_format
from npz_payloads import write_hostile
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


# -- --snapshot: a trainer snapshot's model, loaded without pickles ----------
def _fashion_mnist(root):
    rng = numpy.random.RandomState(0)
    for prefix, n in (('train', 16), ('t10k', 4)):
        for kind, array in (('images-idx3', rng.randint(0, 256, (n, 28, 28))),
                            ('labels-idx1', numpy.arange(n) % 10)):
            array = numpy.asarray(array, numpy.uint8)
            header = (0x0800 + array.ndim).to_bytes(4, 'big') + b''.join(
                d.to_bytes(4, 'big') for d in array.shape)
            with gzip.open(str(root / '{}-{}-ubyte.gz'.format(prefix, kind)),
                           'wb') as f:
                f.write(header + array.tobytes())
    return str(root)


_ARGS = ['--model', 'small_cnn', '--width', '4', '--batches', '4',
         '--steps', '1', '--formats', 'fp8_e4m3']
_PREFIX = 'updater/model:main/predictor/'


def _snapshot_arrays(seed):
    numpy.random.seed(seed)
    saver = chainer.serializers.DictionarySerializer()
    saver.save(models.build('small_cnn', 10, 1, width=4))
    return {_PREFIX + k: numpy.array(v) for k, v in saver.target.items()}


def test_snapshot_runs_no_code(tmp_path, capsys):
    """Issue 50 item 5: a snapshot whose array is a pickled object ran it
    (Chainer's load_npz); now one error line naming the file, nothing
    run."""
    root = _fashion_mnist(tmp_path)
    marker = tmp_path / 'ran'
    key = _PREFIX + sorted(k for k in _snapshot_arrays(0)
                           if k.endswith('/W'))[0][len(_PREFIX):]
    path = write_hostile(tmp_path / 'snapshot_latest', _snapshot_arrays(0),
                         key, marker)
    try:
        lg.main(['--root', root, '--snapshot', path] + _ARGS)
        status = 0
    except (SystemExit, ValueError) as e:
        status = e.code if isinstance(e, SystemExit) else 'raised'
    assert not marker.exists(), 'loading the snapshot ran the code'
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert path in err and key in err and 'pickled' in err


def test_snapshot_round_trip(tmp_path, capsys):
    """A legitimate snapshot loads: its weights (the initial ones times 4)
    are the ones measured, not the model's initialization."""
    root = _fashion_mnist(tmp_path)
    path = str(tmp_path / 'snapshot_latest')
    with open(path, 'wb') as f:     # (a path would get '.npz' appended)
        numpy.savez(f, **{k: v * 4 if k.endswith('/W') else v
                          for k, v in _snapshot_arrays(0).items()})
    capsys.readouterr()
    lg.main(['--root', root] + _ARGS)
    init = capsys.readouterr().out.split('\n', 1)[1]
    lg.main(['--root', root, '--snapshot', path] + _ARGS)
    out = capsys.readouterr().out
    assert path in out.split('\n', 1)[0]
    rows = [r for r in out.split('\n', 1)[1].splitlines() if 'fp8' in r]
    assert len(rows) == 2 and rows != [r for r in init.splitlines()
                                       if 'fp8' in r]
