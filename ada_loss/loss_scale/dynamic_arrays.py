"""The dynamic loss scales of :mod:`ada_loss.loss_scale.dynamic` advanced
on 0-d arrays, with no host read: the state lives in arrays of one array
module (NumPy or CuPy) and each step's update is decided from a 0-d bool
``finite`` flag by ``where``, so that the whole training step can be
captured and replayed (a CUDA graph; :mod:`ada_loss.training.graph_step`).

The same floating-point operations as the host classes, in the same order
(the products in float64, rounded to float32 where the host rounds with
``_f32``; the clamps as ``min``/``max``): the state after any sequence of
steps equals the host state bit for bit (``tests/loss_scale/
test_dynamic_arrays.py``). Every branch is computed and the taken one
selected, so a grown scale beyond float32's range is computed (Inf) and
discarded, as the host discards it.
"""
import numpy


def _f32(xp, x):
    """float64 ``x`` rounded to float32 and back (the host's ``_f32``)."""
    with numpy.errstate(over='ignore'):
        return x.astype(numpy.float32).astype(numpy.float64)


class ArrayDynamicScale(object):
    """The state of one host style (``DynamicLossScale``,
    ``ChainerLossScale`` or ``TFLossScale``) as 0-d arrays of ``xp``.

    Args:
        host: the host state object (its options are read; its state is
            copied by :meth:`load`).
        xp: ``numpy`` or ``cupy``.
    """

    def __init__(self, host, xp):
        self.host = host
        self.xp = xp
        self.scale = xp.zeros((), numpy.float64)
        self.counts = xp.zeros(2, numpy.int64)   # style-specific counters
        self.load()

    # -- host <-> arrays (between steps only) ----------------------------
    def load(self):
        """Copies the host state into the arrays (in place: a captured
        graph keeps reading the same buffers)."""
        h, xp = self.host, self.xp
        self.scale[...] = h.scale
        if h.style == 'pytorch':
            counts = (h.clean_steps, 0)
        elif h.style == 'chainer':
            counts = (int(h.overflowed_ever), 0)
        else:
            counts = (h.good_steps, h.bad_steps)
        self.counts[...] = xp.asarray(numpy.array(counts, numpy.int64))

    def store(self):
        """Copies the arrays into the host state (one read)."""
        values = numpy.concatenate([
            numpy.asarray(_host(self.scale), numpy.float64).reshape(1),
            numpy.asarray(_host(self.counts), numpy.float64)])
        scale, c0, c1 = float(values[0]), int(values[1]), int(values[2])
        h = self.host
        if h.style == 'pytorch':
            state = {'scale': scale, 'clean_steps': c0}
        elif h.style == 'chainer':
            state = {'scale': scale, 'overflowed_ever': bool(c0)}
        else:
            state = {'scale': scale, 'good_steps': c0, 'bad_steps': c1}
        h.load_state_dict(state)

    # -- one step --------------------------------------------------------
    def update(self, finite):
        """Advances the state after one step, in place; ``finite`` a 0-d
        bool array (True: the step was applied)."""
        getattr(self, '_' + self.host.style)(finite)

    def _clamp(self, s):
        h, xp = self.host, self.xp
        if h.max_scale is not None:
            s = xp.minimum(s, h.max_scale)
        if h.min_scale is not None:
            s = xp.maximum(s, h.min_scale)
        return s

    def _pytorch(self, finite):
        h, xp = self.host, self.xp
        s, clean = self.scale, self.counts[0]
        backed = self._clamp(_f32(xp, s * h.backoff_factor))
        counted = clean + 1
        grow = finite & (counted == h.growth_interval)
        grown = _f32(xp, s * h.growth_factor)
        grown_ok = grow & xp.isfinite(grown)
        with numpy.errstate(invalid='ignore'):
            grown = self._clamp(grown)
        new = xp.where(finite, xp.where(grown_ok, grown, s), backed)
        self.counts[0] = xp.where(finite & ~grow, counted, 0)
        self.scale[...] = new

    def _chainer(self, finite):
        h, xp = self.host, self.xp
        ever = self.counts[0] != 0
        multiplier = xp.where(finite, xp.where(ever, h.multiplier, 2.0), 0.5)
        self.scale[...] = self._clamp(self.scale * multiplier)
        self.counts[0] = (ever | ~finite).astype(numpy.int64)

    def _tf(self, finite):
        h, xp = self.host, self.xp
        s, good, bad = self.scale, self.counts[0], self.counts[1]
        incr = finite & (good + 1 >= h.incr_every_n_steps)
        decr = ~finite & (bad + 1 >= h.decr_every_n_nan_or_inf)
        grown = _f32(xp, s * float(numpy.float32(h.incr_ratio)))
        with numpy.errstate(invalid='ignore'):
            grown = xp.where(xp.isfinite(grown), self._clamp(grown), s)
        shrunk = self._clamp(_f32(xp, s * float(numpy.float32(h.decr_ratio))))
        new = xp.where(incr, grown, xp.where(decr, shrunk, s))
        reset = incr | decr
        new_good = xp.where(reset | ~finite, 0, good + 1)
        new_bad = xp.where(reset, 0, xp.where(finite, bad, bad + 1))
        self.counts[...] = xp.stack([new_good, new_bad])
        self.scale[...] = new


def _host(a):
    get = getattr(a, 'get', None)
    return get() if get is not None else a
