"""The dynamic loss scales advanced on arrays
(:mod:`ada_loss.loss_scale.dynamic_arrays`) equal the host classes bit for
bit, step for step, over random overflow sequences -- the clamps, growth
beyond float32's range (not applied) and a chainer-style multiplier that is
not a power of two included."""
import numpy as np
import pytest

from ada_loss.loss_scale.dynamic import make_dynamic_loss_scale
from ada_loss.loss_scale.dynamic_arrays import ArrayDynamicScale

CASES = [
    ('pytorch', dict(init_scale=2.0 ** 120, growth_interval=3)),
    ('pytorch', dict(init_scale=3.0, growth_factor=3.0, backoff_factor=0.3,
                     growth_interval=2, min_scale=0.7, max_scale=1e5)),
    ('chainer', dict(interval=3, init_scale=5.0)),
    ('chainer', dict(interval=7, init_scale=1.0, max_scale=300.0)),
    ('tf', dict(init_scale=2.0 ** 125, incr_every_n_steps=2,
                decr_every_n_nan_or_inf=3, incr_ratio=3.0, decr_ratio=0.8)),
    ('tf', dict(init_scale=10.0, incr_every_n_steps=1,
                decr_every_n_nan_or_inf=1, min_scale=2.0, max_scale=1e3)),
]


@pytest.mark.parametrize('style,options', CASES)
def test_array_state_follows_the_host_state(style, options):
    rng = np.random.RandomState(len(options))
    host = make_dynamic_loss_scale(style, **options)
    mirror = make_dynamic_loss_scale(style, **options)
    arrays = ArrayDynamicScale(mirror, np)
    states = set()
    for step in range(300):
        overflow = bool(rng.rand() < (0.6 if step % 50 < 10 else 0.05))
        host.update(overflow)
        arrays.update(np.array(not overflow))
        arrays.store()                       # arrays -> mirror's host state
        assert {k: np.float64(v).tobytes() for k, v in
                mirror.state_dict().items()} == \
            {k: np.float64(v).tobytes() for k, v in
             host.state_dict().items()}, step
        states.add(host.scale)
    assert len(states) > 5


def test_load_writes_in_place():
    """A captured graph keeps reading the same buffers: ``load`` (after a
    resume) must not rebind them."""
    host = make_dynamic_loss_scale('tf', init_scale=8.0)
    arrays = ArrayDynamicScale(host, np)
    scale, counts = arrays.scale, arrays.counts
    host.load_state_dict({'scale': 2.0, 'good_steps': 3, 'bad_steps': 1})
    arrays.load()
    assert arrays.scale is scale and arrays.counts is counts
    assert float(scale) == 2.0 and counts.tolist() == [3, 1]
