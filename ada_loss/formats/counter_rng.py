"""A counter-based random stream for stochastic rounding: the random word
of element ``i`` of a cast is a hash of ``(seed, step, i)``, so the bits of
any cast are reproducible from a seed and a step counter alone (no
generator state to save; a resumed run only needs the step: Salmon et al.,
"Parallel random numbers: as easy as 1, 2, 3", SC'11, for the idea).

The hash is MurmurHash3's 32-bit finalizer (``fmix32``, a bijection of
uint32 with full avalanche) applied to ``i · φ + key`` (φ = 0x9E3779B9, the
golden-ratio increment of splitmix), where ``key`` mixes the seed and the
step by the same finalizer. It is a statistical generator for rounding
noise, not a cryptographic one. NumPy or CuPy (uint32 arithmetic wraps
modulo 2^32, which the hash relies on).
"""
import numpy

_U32 = numpy.uint32
_MASK = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def fmix32_int(h):
    """MurmurHash3's finalizer on a Python int (mod 2^32)."""
    h &= _MASK
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK
    h ^= h >> 16
    return h


def stream_key(seed, step):
    """The 32-bit key of one cast: ``seed`` and ``step`` (ints ≥ 0)."""
    return fmix32_int(fmix32_int(int(seed) ^ _GOLDEN) + int(step)
                      * _GOLDEN)


def random_words(shape, seed, step, xp=numpy):
    """uint32 random words of ``shape``: element ``i`` (C order) gets
    ``fmix32(i · φ + key(seed, step))``."""
    n = int(numpy.prod(shape))
    if n >= 1 << 32:
        raise ValueError('a cast of 2^32 or more values needs a wider '
                         'counter')
    h = xp.arange(n, dtype=_U32)
    h *= _U32(_GOLDEN)
    h += _U32(stream_key(seed, step))
    h ^= h >> _U32(16)
    h *= _U32(0x85EBCA6B)
    h ^= h >> _U32(13)
    h *= _U32(0xC2B2AE35)
    h ^= h >> _U32(16)
    return h.reshape(shape)
