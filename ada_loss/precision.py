"""The precision of training: which format stores what (one setting).

=====================  =======================================================
``float32``            everything FP32, no mixed precision
``mixed16``            Chainer's own mixed16 (Micikevicius et al.): GEMM
                       weights, activations and activation gradients stored in
                       FP16 (NumPy float16), batch norm with FP32 statistics
                       and γ/β, FP32 master weights (``use_fp32_update``)
``bf16``               bfloat16 forward and backward (emulated)
``fp8``                hybrid FP8: E4M3 forward, E5M2 gradients (emulated)
``fp8_e4m3``           E4M3 for both (emulated)
``fp8_e5m2``           E5M2 for both (emulated)
``fwd=<f>,bwd=<g>``    any two names of :func:`ada_loss.formats.get_format`,
                       e.g. ``fwd=float16,bwd=fp8_e4m3`` (emulated)
=====================  =======================================================

*Emulated* precisions store everything in float32 (so the parameters are the
FP32 master weights, and batch norm, the optimizer and the loss are FP32) and
round values to the format where hardware would store them in it: each GEMM's
inputs x, W, b and its output in the forward (the forward format), and the
gradient entering each GEMM in the backward and every gradient it produces
(input, weight and bias gradients) to the backward format. The GEMM itself
accumulates in FP32. Loss scaling then targets the backward format's range.

This module parses a precision into a :class:`Precision` (a name, two
formats, a storage) and gives the Chainer dtype config it builds models in
(:func:`dtype_config`, hence its import of Chainer); it sits below both the
loss-scaling methods (:mod:`ada_loss.scaling` targets the gradient format)
and training (:mod:`ada_loss.training.precision_setup` applies a precision
to a model and its optimizer).
"""
import collections
import contextlib

import chainer
import numpy

from ada_loss.formats import get_format

PRECISIONS = ('float32', 'mixed16', 'bf16', 'fp8', 'fp8_e4m3', 'fp8_e5m2')

_NAMED = {
    'bf16': ('bfloat16', 'bfloat16'),
    'fp8': ('fp8_e4m3', 'fp8_e5m2'),
    'fp8_e4m3': ('fp8_e4m3', 'fp8_e4m3'),
    'fp8_e5m2': ('fp8_e5m2', 'fp8_e5m2'),
}

PRECISION_HELP = ('float32, mixed16, bf16, fp8 (E4M3 forward, E5M2 '
                  'gradients), fp8_e4m3, fp8_e5m2, or fwd=<format>,'
                  'bwd=<format> with format names as in '
                  'ada_loss.formats.get_format (e.g. fwd=float16,'
                  'bwd=fp8_e4m3)')


class Precision(collections.namedtuple('Precision',
                                       ('name', 'fwd', 'bwd', 'storage'))):
    """A parsed precision.

    Attributes:
        name (str): canonical name (``'fp8'``, ``'fwd=float16,bwd=e4m3'``).
        fwd, bwd (FloatFormat): formats of the forward GEMMs and of the
            gradients.
        storage (str): ``'float32'``, or ``'mixed16'`` for Chainer's mixed16
            (NumPy float16 arrays).
    """

    __slots__ = ()

    def __str__(self):
        return self.name

    @property
    def emulated(self):
        """True if values are rounded to formats in float32 storage."""
        return self.storage == 'float32' and not (
            self.fwd.is_float32 and self.bwd.is_float32)

    @property
    def gemm_formats(self):
        """(fwd, bwd) for the GEMM links (None for a float32 format), or None
        when nothing is emulated."""
        if not self.emulated:
            return None
        return tuple(None if f.is_float32 else f for f in (self.fwd, self.bwd))

    @property
    def grad_format(self):
        """The format scaled gradients are stored in (loss scaling targets
        its range)."""
        return self.bwd

    @property
    def chainer_dtype(self):
        return chainer.mixed16 if self.storage == 'mixed16' else numpy.float32

    @property
    def compute_dtype(self):
        """NumPy dtype of activations: float16 for mixed16, else float32."""
        return numpy.dtype(numpy.float16 if self.storage == 'mixed16'
                           else numpy.float32)


def parse_precision(text):
    """The :class:`Precision` named ``text`` (a Precision is returned as is).

    Raises:
        ValueError: naming what is accepted.
    """
    if isinstance(text, Precision):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError('precision must be a string: {}; got {!r}'.format(
            PRECISION_HELP, text))
    key = text.strip().lower().replace(' ', '')
    f32 = get_format('float32')
    if key == 'float32':
        return Precision('float32', f32, f32, 'float32')
    if key == 'mixed16':
        f16 = get_format('float16')
        return Precision('mixed16', f16, f16, 'mixed16')
    if key in _NAMED:
        fwd, bwd = _NAMED[key]
        return Precision(key, get_format(fwd), get_format(bwd), 'float32')
    parts = dict(p.partition('=')[::2] for p in key.split(','))
    if set(parts) == {'fwd', 'bwd'} and all(parts.values()):
        try:
            fwd, bwd = get_format(parts['fwd']), get_format(parts['bwd'])
        except ValueError as e:
            raise ValueError('bad precision {!r}: {}'.format(text, e))
        return Precision('fwd={},bwd={}'.format(fwd, bwd), fwd, bwd,
                         'float32')
    raise ValueError('unknown precision {!r}; expected {}'.format(
        text, PRECISION_HELP))


def check_precision(precision):
    """Validates a precision name; returns it (as given)."""
    parse_precision(precision)
    return precision


def chainer_dtype(precision):
    return parse_precision(precision).chainer_dtype


@contextlib.contextmanager
def dtype_config(precision):
    """Context in which models are built and run in ``precision``."""
    with chainer.using_config('dtype', chainer_dtype(precision)):
        yield


def compute_dtype(precision):
    """NumPy dtype of activations: float16 for mixed16, else float32."""
    return parse_precision(precision).compute_dtype
