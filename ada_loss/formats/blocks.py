"""Blocks and tiles of a tensor for block-scaled casts (NVFP4, blockwise
FP8): the tensor rearranged so that its last axis holds one block's
values, and back.

* **1-D blocks** (``tile`` None): ``block_size`` consecutive values along
  ``axis`` (an int, or a tuple of axes flattened in that order: a GEMM's
  reduction may span several tensor axes, as in
  :func:`ada_loss.formats.mx.quantize_mx`).
* **2-D tiles** (``tile=(t0, t1)``): ``t0 × t1`` values over two axes
  ``axis=(a0, a1)`` (t0 along a0); the weights' 16×16 tiles of NVFP4 and
  128×128 blocks of Transformer Engine's ``Float8BlockScaling``. A tile is
  symmetric under the transpose of those two axes, so one cast serves a
  weight in both the forward and the dgrad GEMM.

A partial last block (or tile row/column) is padded with zeros, which
change no block's amax (TE's references pad the same way), and the padding
is dropped on the way back. NumPy or CuPy.
"""
import numpy

from ada_loss.formats import exact
from ada_loss.formats.mx import _as_axes
from ada_loss.formats.quantize import array_module

_F32 = numpy.float32


class BlockLayout(object):
    """The block layout of arrays of one shape (see the module docstring).

    :meth:`to_blocks` gives an array whose axis :attr:`value_axis` holds
    the values of one block: ``lead + (nblocks..., block_values)`` (axis
    -1), or, where the blocks are runs of consecutive values of x (one
    axis or adjacent axes, no partial block), a reshape of x that needs
    no copy; :meth:`from_blocks` inverts it."""

    def __init__(self, shape, axis=-1, block_size=16, tile=None):
        ndim = len(shape)
        self.shape = tuple(shape)
        if tile is None:
            if int(block_size) < 1:
                raise ValueError('block_size must be ≥ 1, got {!r}'.format(
                    block_size))
            self.axes = _as_axes(axis, ndim)
            self.sizes = (int(numpy.prod([shape[a] for a in self.axes])),)
            # a reduction shorter than a block is one block (padding it
            # would change nothing but the cost)
            self.block = (max(1, min(int(block_size), self.sizes[0])),)
        else:
            tile = tuple(int(t) for t in tile)
            if axis == -1:
                axis = (-2, -1)
            if len(tile) != 2 or min(tile) < 1 or numpy.ndim(axis) != 1 \
                    or len(axis) != 2:
                raise ValueError('a tile is two sizes over two axes, got '
                                 'tile={!r}, axis={!r}'.format(tile, axis))
            self.axes = _as_axes(axis, ndim)
            self.sizes = tuple(shape[a] for a in self.axes)
            self.block = tuple(max(1, min(t, n)) for t, n in zip(tile,
                                                                 self.sizes))
        self.rest = tuple(a for a in range(ndim) if a not in self.axes)
        self.lead = tuple(shape[a] for a in self.rest)
        self.nblocks = tuple(-(-n // b) for n, b in zip(self.sizes,
                                                         self.block))
        self.inverse = tuple(int(i) for i in
                             numpy.argsort(self.rest + self.axes))
        #: the axis of :meth:`to_blocks`' result that holds a block's values
        self.value_axis = -1
        self._view = None
        if tile is None and list(self.axes) == sorted(self.axes):
            # blocks that are runs of a reshape of x: no transpose. The
            # trailing run of adjacent axes (C of NCHW; H, W of the
            # reduction N·H·W) holds whole blocks when its size is a
            # multiple of the block, and then no block straddles the
            # leading reduction axes either (their order is kept).
            a = self.axes
            j = len(a) - 1
            while j > 0 and a[j - 1] == a[j] - 1:
                j -= 1
            s, e = a[j], a[-1] + 1
            p = int(numpy.prod(self.shape[s:e]))
            b = self.block[0]
            if p % b == 0:
                self._view = self.shape[:s] + (p // b, b) + self.shape[e:]
                self.value_axis = s + 1

    def amax(self, blocks, xp):
        """Each block's largest |value| (NaN if it holds a NaN), keepdims.
        Over a short last axis NumPy's max reduction is slow (~12 ns per
        value for 16-blocks); halving by element-wise maxima is ~2.5×
        faster and exact. On CuPy: from the bits (a GPU's float32 max
        reads a subnormal as 0, see :mod:`ada_loss.formats.exact`)."""
        if xp is not numpy:
            return exact.abs_max_bits(blocks, self.value_axis)
        a = xp.abs(blocks)
        n = a.shape[-1]
        if self.value_axis in (-1, a.ndim - 1) and n >= 2 and \
                n & (n - 1) == 0:
            while n > 1:
                n //= 2
                a = xp.maximum(a[..., :n], a[..., n:])
            return a
        return a.max(axis=self.value_axis, keepdims=True)

    def scales(self, s):
        """Per-block values computed with ``keepdims`` (e.g. scales),
        without the block-values axis."""
        return s.squeeze(self.value_axis)

    def to_blocks(self, x, xp):
        if self._view is not None:
            return x.reshape(self._view)
        moved = xp.transpose(x, self.rest + self.axes)
        flat = moved.reshape(self.lead + self.sizes)
        padded = tuple(n * b for n, b in zip(self.nblocks, self.block))
        if padded != self.sizes:
            full = xp.zeros(self.lead + padded, x.dtype)
            full[(Ellipsis,) + tuple(slice(0, n) for n in self.sizes)] = flat
            flat = full
        if len(self.block) == 1:
            return flat.reshape(self.lead + (self.nblocks[0], self.block[0]))
        (n0, n1), (t0, t1) = self.nblocks, self.block
        k = len(self.lead)
        t = flat.reshape(self.lead + (n0, t0, n1, t1))
        t = xp.transpose(t, tuple(range(k)) + (k, k + 2, k + 1, k + 3))
        return t.reshape(self.lead + (n0, n1, t0 * t1))

    def from_blocks(self, b, xp):
        if self._view is not None:
            return b.reshape(self.shape)
        k = len(self.lead)
        if len(self.block) == 1:
            flat = b.reshape(self.lead + (self.nblocks[0] * self.block[0],))
        else:
            (n0, n1), (t0, t1) = self.nblocks, self.block
            t = b.reshape(self.lead + (n0, n1, t0, t1))
            t = xp.transpose(t, tuple(range(k)) + (k, k + 2, k + 1, k + 3))
            flat = t.reshape(self.lead + (n0 * t0, n1 * t1))
        flat = flat[(Ellipsis,) + tuple(slice(0, n) for n in self.sizes)]
        moved = flat.reshape(self.lead + tuple(self.shape[a]
                                               for a in self.axes))
        return xp.ascontiguousarray(xp.transpose(moved, self.inverse))


def finite_blocks(x, axis, block_size, tile, name):
    """The start of a block-scaled cast: float32 (or float16, widened) ``x``
    in blocks, each block's amax with a NaN/Inf block's set to 0, and the
    mask of those blocks (None when there is none).

    Returns ``(xp, layout, blocks, amax, bad)``; ``name`` is the caller's,
    for the error on another dtype."""
    xp = array_module(x)
    if x.dtype == numpy.float16:
        x = x.astype(_F32)
    if x.dtype != _F32:
        raise TypeError('{} expects a float32 (or float16) array, got {}'
                        .format(name, x.dtype))
    layout = BlockLayout(x.shape, axis, block_size, tile)
    blocks = layout.to_blocks(x, xp)
    with numpy.errstate(invalid='ignore'):
        amax = layout.amax(blocks, xp)
    bad = ~xp.isfinite(amax)
    if bool(bad.any()):
        amax = xp.where(bad, _F32(0), amax)
    else:
        bad = None
    return xp, layout, blocks, amax, bad


def finish_blocks(q, bad, layout, xp):
    """The end of a block-scaled cast: the NaN/Inf blocks (``bad``) made
    NaN, the blocks back in the tensor's shape."""
    if bad is not None:
        q = xp.where(bad, _F32(numpy.nan), q)
    return layout.from_blocks(q, xp)
