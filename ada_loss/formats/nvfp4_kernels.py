"""The compiled (Numba) NVFP4 cast of NumPy arrays: the arithmetic of
:func:`ada_loss.formats.nvfp4.quantize_nvfp4`'s NumPy path (which stays the
definition, the CuPy path and the tests' oracle), fused into two passes
over memory instead of about fifteen array-wide NumPy operations, each
with its temporaries (the ResNet-20 step under ``nvfp4`` spent most of its
time in them).

The blocks come as a C-contiguous float32 array ``(A, B, I)``: block
``(a, i)`` is the ``B`` values ``b[a, :, i]`` (``I = 1``: blocks along the
last axis; ``I > 1``: blocks along a middle axis, as NCHW tensors blocked
along C, with no transpose).

* :func:`block_amax` — each block's largest |value| and whether it holds
  a NaN or ±Inf, and the largest amax of the other blocks (the tensor's),
  by integer maxima of the float32 bits.
* :func:`cast_blocks` — each value ``x · encode`` clamped to ±6,
  rounded to E2M1 (to nearest even, or stochastically from the
  counter-based words, computed inline from the element's C-order index or
  read from an array), times the block's E4M3 scale and the global decode;
  a NaN/Inf block all NaN.

Between the two, the blocks' scales are computed by the NumPy path's own
code (:func:`ada_loss.formats.nvfp4.block_scales`) on the per-block arrays
(1/16 of the values). Every step of the kernels is the NumPy path's
float32 operation in the same order (no fastmath, so no reassociation or
FMA contraction), so the results are equal bit for bit — tested against
the NumPy path (``tests/formats/test_nvfp4_kernels.py``). E2M1 rounding to
nearest even is ``rint(|y| / q) · q`` with the spacing ``q`` (0.5 below 2,
1 below 4, 2 up to 6; the division is by a power of two, exact): on each
binade the even multiples of ``q`` are the codes with an even mantissa, so
the ties-to-even ``rint`` is the format's. Stochastic rounding is
:func:`ada_loss.formats.nvfp4.e2m1_stochastic`'s rule per value.

Compiled at first use and cached (``cache=True``), as
:mod:`ada_loss.communication.kernels`.
"""
import numba
import numpy

_JIT = dict(nogil=True, cache=True, error_model='numpy')
_GOLDEN = 0x9E3779B9


@numba.njit(**_JIT)
def block_amax(bits, amax_bits, bad):
    """Each block's largest |value|, on the float32 bits (``bits``: the
    blocks viewed as uint32): with the sign cleared, the order of the
    integers is the order of the magnitudes, ±Inf is 0x7F800000 and a
    NaN above it, and integer maxima vectorize where float ones (with
    NaN) do not. ``amax_bits[a, i]`` (uint32, the float32 bits): block
    (a, i)'s amax, 0 where it holds a NaN or ±Inf (then ``bad[a, i]``).
    Returns the bits of the largest amax of the finite blocks (0: none,
    or all zeros)."""
    n_a, n_b, n_i = bits.shape
    if n_i == 1:
        for a in range(n_a):
            m = numpy.uint32(0)
            for k in range(n_b):
                m = max(m, bits[a, k, 0] & numpy.uint32(0x7FFFFFFF))
            amax_bits[a, 0] = m
    else:
        for a in range(n_a):
            for i in range(n_i):
                amax_bits[a, i] = numpy.uint32(0)
            for k in range(n_b):
                for i in range(n_i):
                    amax_bits[a, i] = max(amax_bits[a, i], bits[a, k, i]
                                          & numpy.uint32(0x7FFFFFFF))
    top = numpy.uint32(0)
    for a in range(n_a):
        for i in range(n_i):
            m = amax_bits[a, i]
            bad[a, i] = m >= numpy.uint32(0x7F800000)
            if bad[a, i]:
                amax_bits[a, i] = numpy.uint32(0)
            else:
                top = max(top, m)
    return top


@numba.njit(**_JIT)
def _word(idx, key):
    """The counter-based word of flat index ``idx`` under ``key``:
    MurmurHash3's ``fmix32(idx · φ + key)`` (as
    :func:`ada_loss.formats.counter_rng.random_words`), in uint32
    arithmetic: each product truncated to 32 bits, as uint32 wraps."""
    u32 = numpy.uint32
    h = u32(u32(idx) * u32(_GOLDEN))
    h = u32(h + u32(key))
    h ^= h >> u32(16)
    h = u32(h * u32(0x85EBCA6B))
    h ^= h >> u32(13)
    h = u32(h * u32(0xC2B2AE35))
    h ^= h >> u32(16)
    return h


@numba.njit(**_JIT)
def _spacing(x, enc):
    """``y = x · enc`` clamped to ±6, and ``|y|`` over the E2M1 spacing
    at it (0.5 below 2, 1 below 4, 2 up to 6; a power of two, so the
    quotient is exact) with that spacing."""
    six = numpy.float32(6.0)
    y = min(max(x * enc, -six), six)
    v = abs(y)
    q = numpy.float32(0.5)
    if v >= numpy.float32(2.0):
        q = numpy.float32(1.0)
    if v >= numpy.float32(4.0):
        q = numpy.float32(2.0)
    return y, v / q, q


@numba.njit(**_JIT)
def _nearest(x, enc, s, dec):
    """One value cast with rounding to nearest even: on each binade the
    even multiples of the spacing are the codes with an even mantissa, so
    ``rint``'s ties-to-even is E2M1's."""
    y, t, q = _spacing(x, enc)
    r = numpy.float32(numpy.copysign(numpy.float32(numpy.rint(t)) * q, y))
    return (r * s) * dec


@numba.njit(**_JIT)
def _stochastic(x, enc, s, dec, word):
    """One value cast with stochastic rounding (uint32 ``word``): up in
    magnitude iff ``(word >> 10) + floor(frac · 2^22) ≥ 2^22`` (as
    :func:`ada_loss.formats.nvfp4.e2m1_stochastic`)."""
    y, t, q = _spacing(x, enc)
    kf = numpy.float32(numpy.floor(t))
    frac22 = numpy.uint32((t - kf) * numpy.float32(4194304.0))
    up = numpy.float32(0.0)
    if (word >> numpy.uint32(10)) + frac22 >= numpy.uint32(4194304):
        up = numpy.float32(1.0)
    r = numpy.float32(numpy.copysign((kf + up) * q, y))
    return (r * s) * dec


@numba.njit(**_JIT)
def cast_blocks(b, scales, encs, bad, dec, out, mode, key, words):
    """The NVFP4 values of blocks ``b`` (float32) into ``out`` (same
    shape), from the blocks' E4M3 decode scales and FP32 encode scales
    (``scales``, ``encs``: float32, shaped as ``bad`` from
    :func:`block_amax`) and the global decode scale ``dec`` (float32).

    ``mode``: 0 round to nearest even; 1 stochastically with the word of
    element ``e`` = ``fmix32(e · φ + key)``, ``e`` its flat index in ``b``
    (the tensor's C-order index when ``b`` is a reshape of it); 2
    stochastically with ``words`` (uint32, ``b``'s shape).
    """
    n_a, n_b, n_i = b.shape
    nan = numpy.float32(numpy.nan)
    for a in range(n_a):
        # one loop per mode, each without branches on it (so the
        # element-wise loop can vectorize)
        if n_i == 1:
            e, s = encs[a, 0], scales[a, 0]
            base = a * n_b
            if mode == 0:
                for k in range(n_b):
                    out[a, k, 0] = _nearest(b[a, k, 0], e, s, dec)
            elif mode == 1:
                for k in range(n_b):
                    out[a, k, 0] = _stochastic(b[a, k, 0], e, s, dec,
                                               _word(base + k, key))
            else:
                for k in range(n_b):
                    out[a, k, 0] = _stochastic(b[a, k, 0], e, s, dec,
                                               words[a, k, 0])
        else:
            for k in range(n_b):
                base = (a * n_b + k) * n_i
                if mode == 0:
                    for i in range(n_i):
                        out[a, k, i] = _nearest(b[a, k, i], encs[a, i],
                                                scales[a, i], dec)
                elif mode == 1:
                    for i in range(n_i):
                        out[a, k, i] = _stochastic(
                            b[a, k, i], encs[a, i], scales[a, i], dec,
                            _word(base + i, key))
                else:
                    for i in range(n_i):
                        out[a, k, i] = _stochastic(
                            b[a, k, i], encs[a, i], scales[a, i], dec,
                            words[a, k, i])
        for i in range(n_i):
            if bad[a, i]:
                for k in range(n_b):
                    out[a, k, i] = nan
