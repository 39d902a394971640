"""``train.cuda_graph`` on the CPU, and which steps the capture refuses
(:mod:`ada_loss.training.cuda_graph`; the replays themselves are GPU tests,
``test_cuda_graph_gpu.py``)."""
import chainer
import pytest

from ada_loss.training.cuda_graph import install, refusal, resolve

import test_graph_step as G


def test_auto_and_off_are_off_on_the_cpu():
    assert resolve('auto', None) is False
    assert resolve('off', None) is False
    assert resolve('auto', chainer.get_device('@numpy')) is False


def test_on_without_a_gpu_is_one_clear_error():
    with pytest.raises(ValueError, match='cuda_graph: on needs a CUDA '
                                         'device'):
        resolve('on', chainer.get_device('@numpy'))


def test_unknown_setting():
    with pytest.raises(ValueError, match='one of auto, on, off'):
        resolve('yes', None)


def test_install_leaves_the_eager_step_on_the_cpu():
    updater = G._updater('adaptive', False)
    assert install(updater, 'auto', None) is None
    assert updater.step_runner is None


@pytest.mark.parametrize('mode,refused', [
    ('amax', 'host floats'), ('adaptive', None), ('dynamic', None),
    ('fixed:16', None)])
def test_refusal(mode, refused):
    why = refusal(G._updater(mode, False))
    if refused is None:
        assert why is None
    else:
        assert refused in why


def test_yaml_booleans_are_on_and_off():
    assert resolve(False, None) is False
    assert resolve(None, None) is False
    with pytest.raises(ValueError, match='on needs a CUDA device'):
        resolve(True, None)


@pytest.mark.parametrize('precision', ['mxfp8', 'fp8:recipe=current'])
def test_scaled_recipes_are_refused(precision):
    """Their per-tensor/block scales (and amax histories) are host state
    the capture cannot follow yet: eager steps, said."""
    from ada_loss.training import apply_precision
    updater = G._updater('fixed:16', False)
    apply_precision(updater.get_optimizer('main').target.predictor,
                    precision)
    assert 'scaled recipe' in refusal(updater)


def test_observing_wrappers_are_refused():
    """The harness's probe wraps the mode and reads gradients on the host
    every few steps: eager steps, said."""
    from ada_loss.analysis.gemm_probe import ProbingLossScaling
    updater = G._updater('adaptive', False)
    updater.loss_scaling = ProbingLossScaling(updater.loss_scaling,
                                              'adaptive', every=5)
    assert 'ProbingLossScaling' in refusal(updater)
