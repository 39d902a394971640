"""SSD detectors (ChainerCV) for float32 and mixed16 training (paper §4.3).

:func:`build_ssd` returns ChainerCV's ``SSD512``/``SSD300`` (VGG-16 backbone,
Liu et al. 2016) made ready for MPT:

* built under ``dtype_config(precision)``: in mixed16 every convolution
  weight and bias and the ``Normalize`` scale are FP16 (the optimizer keeps FP32 master
  copies, see :func:`ada_loss.training.setup_optimizer`); the VGG-16
  convolutions are lazily initialized by ChainerCV, at the first forward,
  which runs under the same dtype;
* every GEMM link becomes its :mod:`ada_loss.links` counterpart (FP16 GEMMs
  emulated with FP32 accumulation on CPU; layer-wise loss scales for the
  adaptive mode); each link's ``scale_key`` is its path;
* ``Normalize`` (conv4_3's L2 normalization) is computed in FP32
  (:mod:`ada_loss.detection.normalize`);
* ``forward`` casts the images to the compute dtype (FP16 in mixed16) and the
  multibox outputs ``mb_locs``/``mb_confs`` back to FP32, so the multibox loss
  and ChainerCV's box decoding (``predict``, the evaluator) run in FP32. The
  FP16 outputs of the seven heads are concatenated in FP16 (same dtype), the
  default-box coder works in NumPy float64/float32 whatever the dtype.

:class:`TinySSD` is *not in the paper*: a 64x64 SSD with the same building
blocks, for tests and smoke runs.
"""
import os

import chainer
import chainer.functions as F
import chainer.links as L
import numpy
from chainer import initializers
from chainercv.links.model.ssd import Multibox, Normalize, SSD
from chainercv.links.model.ssd import SSD300, SSD512

from ada_loss.detection.normalize import make_normalize_fp32
from ada_loss.links import as_gemm_link
from ada_loss.precision import compute_dtype, dtype_config
from ada_loss.training.precision_setup import apply_precision
from ada_loss.training.safe_npz import load_npz
from ada_loss.training.safe_npz import open_npz

#: ChainerCV's SSD mean (RGB, ImageNet) subtracted from input images.
SSD_MEAN = numpy.array((123, 117, 104), numpy.float32).reshape((-1, 1, 1))


class MixedPrecisionSSD(object):
    """Mixin over a ChainerCV ``SSD``: a forward in the model's
    ``precision`` (:mod:`ada_loss.precision`; FP32 outputs)."""

    precision = 'float32'

    def forward(self, x):
        with dtype_config(self.precision):
            xdtype = compute_dtype(self.precision)
            if x.dtype != xdtype:
                x = F.cast(x, xdtype)
            mb_locs, mb_confs = super(MixedPrecisionSSD, self).forward(x)
        if mb_locs.dtype != numpy.float32:
            mb_locs = F.cast(mb_locs, numpy.float32)
            mb_confs = F.cast(mb_confs, numpy.float32)
        return mb_locs, mb_confs


class MixedPrecisionSSD512(MixedPrecisionSSD, SSD512):
    """ChainerCV ``SSD512`` with :class:`MixedPrecisionSSD`'s forward."""


class MixedPrecisionSSD300(MixedPrecisionSSD, SSD300):
    """ChainerCV ``SSD300`` with :class:`MixedPrecisionSSD`'s forward."""


class TinyExtractor(chainer.Chain):
    """64x64 VGG-style extractor: convolutions, conv4_3-like ``Normalize``
    branch, a dilated convolution and a strided extra layer (3 feature maps).
    """

    insize = 64
    grids = (8, 4, 2)

    def __init__(self):
        super(TinyExtractor, self).__init__()
        with self.init_scope():
            self.conv1 = L.Convolution2D(3, 8, 3, pad=1)
            self.conv2 = L.Convolution2D(8, 16, 3, pad=1)
            self.conv3 = L.Convolution2D(16, 16, 3, pad=1)
            self.norm3 = Normalize(16, initial=initializers.Constant(20))
            self.conv4 = L.DilatedConvolution2D(16, 32, 3, pad=2, dilate=2)
            self.conv5 = L.Convolution2D(32, 32, 3, stride=2, pad=1)

    def forward(self, x):
        h = F.max_pooling_2d(F.relu(self.conv1(x)), 2)
        h = F.max_pooling_2d(F.relu(self.conv2(h)), 2)
        h = F.max_pooling_2d(F.relu(self.conv3(h)), 2)
        ys = [self.norm3(h)]
        h = F.max_pooling_2d(F.relu(self.conv4(h)), 2)
        ys.append(h)
        ys.append(F.relu(self.conv5(h)))
        return ys


class TinySSD(MixedPrecisionSSD, SSD):
    """A small SSD (64x64 input, 3 feature maps); not in the paper."""

    def __init__(self, n_fg_class=20):
        super(TinySSD, self).__init__(
            extractor=TinyExtractor(),
            multibox=Multibox(n_class=n_fg_class + 1,
                              aspect_ratios=((2,), (2, 3), (2,))),
            steps=(8, 16, 32), sizes=(6, 13, 24, 35), mean=SSD_MEAN)


def initialize_params(model):
    """Initializes ChainerCV's lazily initialized parameters now, with one
    forward pass on a zero image (in the model's precision), so that snapshots,
    resumes and ChainerMN broadcasts see every parameter."""
    if all(p.array is not None for p in model.params()):
        return model
    x = model.xp.zeros((1, 3, model.insize, model.insize), numpy.float32)
    with chainer.using_config('train', False), chainer.no_backprop_mode():
        model(x)
    return model


_MODELS = {'ssd512': MixedPrecisionSSD512, 'ssd300': MixedPrecisionSSD300,
           'ssd_tiny': TinySSD}
SSD_MODELS = tuple(_MODELS)


def build_ssd(name='ssd512', n_fg_class=20, precision='float32',
              pretrained_model=None, initialize=False, seed=0):
    """An SSD ready for training in ``precision`` (see module docstring).

    Args:
        name: 'ssd512' (the paper's), 'ssd300' or 'ssd_tiny'.
        n_fg_class (int): foreground classes (20 for VOC).
        precision: a precision of :mod:`ada_loss.precision` (its name or a
            :class:`~ada_loss.precision.Precision`): 'float32', 'mixed16',
            or an emulated one (the GEMM links round to its formats).
        pretrained_model: ``None`` or the path of a local ``.npz`` (e.g.
            ChainerCV's VGG-16 ImageNet weights for SSD). ChainerCV's named
            weights ('imagenet', 'voc0712') would be downloaded: refused.
            Loaded by :func:`ada_loss.training.safe_npz.load_npz` with
            ``strict=False``, once every parameter is initialized (one
            forward pass: a lazily initialized one, as VGG-16's first
            convolution, would otherwise take any shape the file holds)
            and the precision applied (so a file saved from a model of the
            same precision loads its per-layer state too, e.g. NVFP4's
            stochastic-rounding counters, where it was refused as keys the
            plain model lacks): no pickles (an object array is an
            ``UnsafeNpzError`` naming the file), the model's values the file
            lacks keep their initialization, a key the model lacks or an
            array of another shape or dtype kind is an
            ``NpzMismatchError`` naming the file and the key.
        initialize (bool): initialize every parameter now
            (:func:`initialize_params`; one forward pass).
        seed (int): the run's seed, which seeds NVFP4's stochastic
            rounding (:func:`~ada_loss.training.apply_precision`).
    """
    if name not in _MODELS:
        raise ValueError('unknown SSD model {!r}; allowed: {}'.format(
            name, ', '.join(SSD_MODELS)))
    if pretrained_model is not None:
        if not (isinstance(pretrained_model, str)
                and os.path.isfile(pretrained_model)):
            raise ValueError(
                'pretrained_model must be None or the path of a local .npz '
                'file (nothing is downloaded); got {!r}'.format(
                    pretrained_model))
        with open_npz(pretrained_model):
            pass    # a file with pickles refused before the model is built
    with dtype_config(precision):
        model = (TinySSD(n_fg_class) if name == 'ssd_tiny'
                 else _MODELS[name](n_fg_class=n_fg_class))
    model.precision = precision
    apply_precision(model, precision, seed)
    for path, link in model.namedlinks():
        if as_gemm_link(link):
            link.scale_key = path.lstrip('/')
    make_normalize_fp32(model)
    if pretrained_model:
        # every parameter its shape first: a lazily initialized one
        # (in_channels None, as VGG-16's first convolution) would take
        # whatever shape the file holds, unchecked, and of any size
        initialize_params(model)
        # not ChainerCV's own loader (Chainer's load_npz, which unpickles
        # object arrays): the safe one, partial weights allowed (a
        # backbone), every array checked against the model
        load_npz(pretrained_model, model, strict=False)
    return initialize_params(model) if initialize else model
