"""Replayed CUDA graphs (:mod:`ada_loss.training.cuda_graph`) equal the
eager step on the same GPU bit for bit: 60 steps per mode (3 eager warm-up
steps, then replays), killed and resumed at step 30 (a fresh updater,
graphs captured again), with the injected overflows of
``test_graph_step.py`` (batches 7, 8, 41), dynamic scale changes, adaptive
at update interval 3 (two graphs) and its backoff (a graph per backoff
state). ``amax`` falls back to eager steps, said once."""
import chainer
import chainer.functions as F
import chainer.links as L
import pytest

from gpu_helpers import requires_gpu
import test_graph_step as G

pytestmark = requires_gpu

DEVICE = '@cupy:0'


class SmallCNN(chainer.Chain):
    """conv -> BN -> ReLU -> (injection) -> linear: convolution (cuBLAS
    GEMMs through im2col) and batch norm's in-place running statistics
    under capture."""

    def __init__(self):
        super(SmallCNN, self).__init__()
        with self.init_scope():
            self.conv = L.Convolution2D(1, 4, 3, pad=1)
            self.bn = L.BatchNormalization(4)
            self.fc = L.Linear(4 * 2 * 3, 3)

    def forward(self, x):
        img = F.reshape(x, (x.shape[0], 1, 2, 3))
        h = F.relu(self.bn(self.conv(img)))
        h = G.Blowup().apply((F.reshape(h, (x.shape[0], -1)), x))[0]
        return self.fc(h)


def _runner(logs):
    from ada_loss.training.cuda_graph import CudaGraphStep

    def make(updater):
        return CudaGraphStep(updater, warmup=3, log=logs.append)
    return make


@pytest.mark.parametrize('net', [G.MLP, SmallCNN])
@pytest.mark.parametrize('mode', G.MODES)
def test_replay_equals_eager_bit_for_bit(mode, net):
    logs = []
    runner, skipped, scales, backed_off = G.run_pair(
        mode, _runner(logs), device=chainer.get_device(DEVICE), net=net)
    G.check_coverage(mode, skipped, scales, backed_off)
    step = runner.step_runner
    if mode.startswith('amax'):
        assert step.reason and step.replays == 0, logs
    else:
        assert step.reason is None, logs
        # after the resume at 30: 3 warm-up steps, the rest replayed
        assert step.replays >= G.STEPS - G.KILL - 3 - len(G.BAD), logs


def test_partial_last_batch_gets_a_graph_of_its_own():
    """An epoch of 7.5 batches without repeat: the last batch (4 rows) is
    captured separately; the states still equal eager's."""
    import numpy as np
    logs = []
    data = G._data()[:60]
    eager = G._updater('dynamic', False, device=chainer.get_device(DEVICE),
                       data=data)
    graph = G._updater('dynamic', _runner(logs),
                       device=chainer.get_device(DEVICE), data=data)
    for u in (eager, graph):
        u._iterators['main'] = chainer.iterators.SerialIterator(
            data, G.BATCH, shuffle=False, repeat=False)
    for _ in range(8):
        eager.update()
        graph.update()
        assert G._bits(G._state(eager)) == G._bits(G._state(graph))
    assert graph.step_runner.captures == 2, logs
    assert np.isfinite(graph.loss_scaling.scale)


def test_replay_makes_one_synchronization_per_step():
    """The step itself reads nothing: the only synchronization of a
    replayed step is :meth:`settle`'s read of the flag."""
    from gpu_helpers import count_synchronizations
    logs = []
    updater = G._updater('adaptive', _runner(logs),
                         device=chainer.get_device(DEVICE))
    for _ in range(5):
        updater.update()
    assert updater.step_runner.replays >= 1, logs
    n = count_synchronizations(updater.update)
    assert n <= 2, n
