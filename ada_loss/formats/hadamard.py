"""The 16-point random Hadamard transform (RHT) of NVFP4's weight-gradient
GEMM (arXiv 2509.25149 §4; Transformer Engine's reference quantizer,
``reference_nvfp4.py``: ``_build_hadamard_matrix``, ``_apply_rht``).

Each run of 16 consecutive values along ``axis`` is multiplied by
``T = D · H₁₆ / 4``: H₁₆ the Sylvester Hadamard matrix (entries ±1), D the
diagonal of TE's fixed sign vector (``get_wgrad_sign_vector``). T is
orthogonal (T Tᵀ = I), so transforming both operands of a GEMM along its
reduction leaves the product unchanged in exact arithmetic:
(A T)ᵀ-style pairs give ``Σ_k a_k b_k``. It spreads a block's outliers over
its 16 values before the 16-blocks are cast, so the E4M3 block scale
fits them better.

Computed as TE's reference does: ``x.reshape(-1, 16) @ T`` in FP32 (a
matrix product, FP32 accumulation; the entries ±1/4 are exact). NumPy or
CuPy.
"""
import numpy

from ada_loss.formats.quantize import array_module

_F32 = numpy.float32
SIZE = 16
#: TE's hard-coded signs (``get_wgrad_sign_vector``)
TE_SIGNS = (1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1)


def hadamard_matrix(size=SIZE, signs=TE_SIGNS):
    """``D · H / sqrt(size)`` as float32 (D = diag(signs); None: no
    signs)."""
    if size & (size - 1) or size < 1:
        raise ValueError('a Hadamard size is a power of two, got {}'.format(
            size))
    h = numpy.ones((1, 1))
    while h.shape[0] < size:
        h = numpy.block([[h, h], [h, -h]])
    if signs is not None:
        h = numpy.asarray(signs, numpy.float64)[:, None] * h
    return (h / numpy.sqrt(size)).astype(_F32)


def random_hadamard(x, axis=-1, inverse=False):
    """x with every run of 16 values along ``axis`` times T (``inverse``:
    times Tᵀ, which undoes it up to FP32 rounding). x.shape[axis] must be a
    multiple of 16 (pad with zeros first: zeros transform to zeros)."""
    xp = array_module(x)
    if x.shape[axis] % SIZE:
        raise ValueError('the transformed axis has {} values, not a '
                         'multiple of {}'.format(x.shape[axis], SIZE))
    t = hadamard_matrix()
    if inverse:
        t = numpy.ascontiguousarray(t.T)
    moved = xp.moveaxis(x.astype(_F32, copy=False), axis, -1)
    shape = moved.shape
    y = xp.ascontiguousarray(moved).reshape(-1, SIZE) @ xp.asarray(t)
    return xp.ascontiguousarray(xp.moveaxis(y.reshape(shape), -1, axis))


def pad_to_multiple(x, axis, multiple=SIZE):
    """x zero-padded along ``axis`` to a multiple of ``multiple``."""
    xp = array_module(x)
    n = x.shape[axis]
    extra = -n % multiple
    if not extra:
        return x
    shape = list(x.shape)
    shape[axis] = extra
    return xp.concatenate([x, xp.zeros(shape, x.dtype)], axis=axis)
