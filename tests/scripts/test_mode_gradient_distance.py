"""scripts/mode_gradient_distance.py (issue 32 item 2, docs/depth_study.md):
every model it compares starts from the same weights; where power-of-two
scaling is exact (FP32) the modes' unscaled gradients are bit-identical,
so a distance it reports between modes is rounding, not a different
starting point; in mixed16 they differ by FP16 rounding only."""
import types

import numpy

from ada_loss.scaling.modes import make_loss_scaling
from repo_modules import load

mg = load('scripts/mode_gradient_distance.py')


def _args():
    return types.SimpleNamespace(model='resnet20', width=2, seed=3,
                                 snapshot=None)


def _batch():
    rng = numpy.random.RandomState(0)
    return (rng.randn(16, 1, 14, 14).astype(numpy.float32),
            rng.randint(0, 10, 16).astype(numpy.int32))


def _grads(a, state, precision, mode):
    model = mg.make_model(a, precision, state)
    scaling = make_loss_scaling(mode, precision)
    scaling.bind(model)
    return mg.unscaled_gradients(model, scaling, *_batch())


def test_models_start_from_the_same_weights():
    a = _args()
    state = mg.initial_state(a)
    m32 = mg.make_model(a, 'float32', state)
    m16 = mg.make_model(a, 'mixed16', state)
    p16 = dict(m16.namedparams())
    dtypes = set()
    for name, p in m32.namedparams():
        q = p16[name].array
        dtypes.add(q.dtype)
        # the FP32 model holds exactly the values the FP16 one stores
        assert p.array.dtype == numpy.float32
        numpy.testing.assert_array_equal(q.astype(numpy.float32), p.array)
    # GEMM weights in FP16 (batch normalization's parameters stay FP32)
    assert numpy.dtype(numpy.float16) in dtypes


def test_power_of_two_scales_are_exact_in_float32():
    a = _args()
    state = mg.initial_state(a)
    ref = _grads(a, state, 'float32', 'none')
    # adaptive:init_scale=1024 carries α ≠ 1 through every layer (the
    # default may keep α = β = 1 on so small a model)
    for mode in ('fixed:4', 'fixed:1024', 'adaptive',
                 'adaptive:init_scale=1024'):
        assert mg.distance(_grads(a, state, 'float32', mode), ref) == 0.0


def test_mixed16_modes_differ_by_fp16_rounding_only():
    a = _args()
    state = mg.initial_state(a)
    fp32 = _grads(a, state, 'float32', 'none')
    g4 = _grads(a, state, 'mixed16', 'fixed:4')
    g16 = _grads(a, state, 'mixed16', 'fixed:16')
    ada = _grads(a, state, 'mixed16', 'adaptive')
    between = [mg.distance(g4, g16), mg.distance(ada, g4)]
    to_fp32 = mg.distance(g4, fp32)
    assert all(0 < d < 1e-2 for d in between)
    assert to_fp32 > max(between)


def test_distance_is_infinite_with_a_nonfinite_entry():
    b = {'w': numpy.ones(3)}
    assert mg.distance({'w': numpy.array([1.0, numpy.nan, 1.0])}, b) \
        == float('inf')
    assert mg.distance({'w': numpy.array([1.0, 1.0, 2.0])}, b) \
        == numpy.sqrt(1 / 3)


def test_subnormal_counter_counts_fp16_entries_below_2_to_minus_14():
    k = mg.SubnormalCounter()
    g = numpy.array([0, 2.0 ** -15, 2.0 ** -14, 1.0, -2.0 ** -20],
                    numpy.float16)
    # float32 arrays are not FP16 storage: not counted
    k.backward_preprocess(None, None, (g, None,
                                       numpy.array([1e-9], numpy.float32)))
    assert (k.nonzero, k.subnormal) == (4, 2)
    k.backward_preprocess(None, None, (numpy.ones(4, numpy.float16),))
    assert (k.nonzero, k.subnormal, k.worst) == (8, 2, 0.5)


def test_mixed16_subnormal_share_falls_with_the_scale():
    a = _args()
    state = mg.initial_state(a)
    shares = []
    for mode in ('none', 'fixed:16', 'fixed:4096'):
        model = mg.make_model(a, 'mixed16', state)
        scaling = make_loss_scaling(mode, 'mixed16')
        scaling.bind(model)
        k = mg.SubnormalCounter()
        mg.unscaled_gradients(model, scaling, *_batch(), counter=k)
        assert k.nonzero > 0
        shares.append(k.subnormal / k.nonzero)
    assert shares[0] > shares[1] > shares[2]
