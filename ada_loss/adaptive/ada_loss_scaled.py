"""Adaptive loss scaling for an unmodified Chainer model (paper §3)."""
import collections
import warnings

import chainer
import numpy

from ada_loss.adaptive.backward import ScaledBackprop
from ada_loss.formats import get_format
from ada_loss.functions.scales import device_kernels, is_device_scalar
from ada_loss.links import as_gemm_link
from ada_loss.loss_scale.gemm import (
    bound_gain, check_bound, check_scale, gemm_loss_scale, loss_gradient_scale,
    round_down_pow2)


class AdaLossScaled(object):
    """Makes a model's GEMM layers scale-aware and runs ⟨α, δ⟩ backward.

    Every ``chainer.links.Linear``, ``Convolution2D``,
    ``DilatedConvolution2D`` and ``Deconvolution2D`` anywhere in the model
    tree (Chain, ChainList, Sequential) becomes its :mod:`ada_loss.links`
    counterpart in place: same parameters, values and names, same float32
    forward results. Other layers and every function need no change.

    Use :meth:`backward` instead of ``loss.backward()``; then
    ``optimizer.update()`` unscales each parameter's gradient by its own α in
    FP32.

    Args:
        model (chainer.Link): the model (converted in place).
        init_scale (float or 'auto'): α_{N+1}, the scale of the loss
            gradient (§3.1). ``'auto'`` (*not in the paper*): start at 1,
            then set it from the loss gradient's own statistics by Eq. 1
            (:func:`~ada_loss.loss_scale.gemm.loss_gradient_scale`), measured
            on the pass before each β update so that the new α_{N+1} and the
            new β's (which depend on it) start together; CPU only for now.
        t_uf (float): T_uf, the allowed underflow rate (§3.2.1).
        update_interval (int): recompute β every this many backward passes
            and reuse the last β in between (§4.3).
        fmt (str): gradient format whose range is targeted ('float16'; with
            float32 arrays this still targets FP16's range, which makes the
            method testable bit for bit).
        bound (str): the overflow bound of each β (see
            :mod:`ada_loss.loss_scale.gemm`): ``'output'`` (default, *not in
            the paper*: bounds the GEMM's output gradient, so β·gx cannot
            overflow), ``'product'`` (the paper's §3.2.3, bounds one
            product), ``'fan_in'`` (the reference code's: the product bound
            divided by the fan-in).
        max_layer_scale (float): *not in the paper*: cap on each β.
        max_accum_scale (float): *not in the paper*: cap on each α.
        verbose (bool): print which layers were converted.
    """

    def __init__(self, model, init_scale=1.0, t_uf=1e-3, update_interval=1,
                 fmt='float16', bound='output',
                 max_layer_scale=None, max_accum_scale=None, verbose=True):
        self.auto_init = isinstance(init_scale, str) and init_scale == 'auto'
        if not self.auto_init:
            if isinstance(init_scale, str):
                raise ValueError("init_scale must be a positive number or "
                                 "'auto', got {!r}".format(init_scale))
            check_scale(init_scale, 'init_scale')
        if not 0 < t_uf < 1:
            raise ValueError('t_uf must be in (0, 1), got {!r}'.format(t_uf))
        if int(update_interval) != update_interval or update_interval < 1:
            raise ValueError('update_interval must be a positive integer, got '
                             '{!r}'.format(update_interval))
        for name, cap in (('max_layer_scale', max_layer_scale),
                          ('max_accum_scale', max_accum_scale)):
            if cap is not None and not cap >= 1:
                raise ValueError('{} must be None or >= 1, got {!r}'
                                 .format(name, cap))
        self.model = model
        self.init_scale = 1.0 if self.auto_init else float(init_scale)
        self.t_uf = float(t_uf)
        self.update_interval = int(update_interval)
        self.fmt = get_format(fmt)
        self.bound = check_bound(bound)
        self.max_layer_scale = max_layer_scale
        self.max_accum_scale = max_accum_scale
        self.iteration = 0
        self._betas = {}
        self._records = collections.OrderedDict()
        self._foreign_reported = set()
        self.converted, self.not_converted = self._convert(model)
        if verbose:
            print(self.summary())

    # -- conversion -------------------------------------------------------
    @staticmethod
    def _convert(model):
        converted, not_converted = [], []
        for path, link in model.namedlinks():
            path = path.lstrip('/')
            if as_gemm_link(link):
                link.scale_key = path
                converted.append(path)
            elif 'W' in link._params and not link._children:
                # A parametric leaf link of an unknown type: its parameter
                # gradients are still unscaled correctly, but its β is 1.
                not_converted.append('{} ({})'.format(
                    path, type(link).__name__))
        return converted, not_converted

    def summary(self):
        lines = ['AdaLossScaled: {} GEMM layers made scale-aware: {}'.format(
            len(self.converted), ', '.join(self.converted) or '-')]
        if self.not_converted:
            lines.append('  links with weights not converted (loss scale '
                         'passed through, beta = 1): '
                         + ', '.join(self.not_converted))
        return '\n'.join(lines)

    # -- Algorithm 4 + options -------------------------------------------
    def _gemm_scale(self, func, W, g, alpha):
        key = func.scale_key
        if key is None:
            # A GEMM called outside a converted link: cache β per weight.
            key = ('unnamed', id(func.inputs[1]))
        recompute = ((self.iteration - 1) % self.update_interval == 0
                     or key not in self._betas)
        if recompute:
            if is_device_scalar(alpha):
                beta = self._gemm_scale_on_device(func, W, g)
            else:
                gain = bound_gain(func, W, self.bound)
                beta = gemm_loss_scale(W, g, self.t_uf, self.fmt,
                                       bound=self.bound, gain=gain,
                                       max_scale=self.max_layer_scale)
            self._betas[key] = beta
        return self._cap_accum(alpha, self._betas[key])

    def _gemm_scale_on_device(self, func, W, g):
        """β as a 0-d device array (CuPy kernels, no synchronization)."""
        return device_kernels().gemm_loss_scale(
            W, g, self.t_uf, self.fmt, bound=self.bound,
            axes=func.grad_input_axes, max_scale=self.max_layer_scale)

    def _cap_accum(self, alpha, beta):
        if self.max_accum_scale is None:
            return beta
        if is_device_scalar(alpha) or is_device_scalar(beta):
            return device_kernels().cap_accum(
                beta, alpha, self.max_accum_scale)
        if alpha * beta > self.max_accum_scale:
            beta = round_down_pow2(self.max_accum_scale / alpha)
        return beta

    #: hooks of :class:`ScaledBackprop` (``observe``, ``weight_scale``);
    #: Algorithm 4 needs neither (the amax rule does)
    _observe = None
    _weight_scale = None

    # -- the backward pass ------------------------------------------------
    def backward(self, loss):
        """⟨α, δ⟩ backpropagation from ``loss`` (Algorithm 3).

        Leaves (parameters) get ``.grad`` scaled by their α and
        ``._loss_scale = α``: Chainer's ``UpdateRule`` divides by it in FP32.
        """
        self.iteration += 1
        entry = None
        # measured on the pass before a β update (every pass when the
        # interval is 1): cached β's were computed for the α they met
        if self.auto_init and self.iteration % self.update_interval == 0:
            if not isinstance(loss.array, numpy.ndarray):
                raise NotImplementedError(
                    "init_scale='auto' runs on the CPU only: its device path "
                    'has not been written and run on a GPU yet')
            entry = _LossGradientMoments()
        bp = ScaledBackprop(self._gemm_scale, self.fmt.u_max, self._observe,
                            self._weight_scale, entry)
        bp.run(loss, self.init_scale)
        self._records = bp.gemm_records
        if entry is not None and entry.count:
            alpha = loss_gradient_scale(entry.second(), entry.peak,
                                        self.t_uf, self.fmt)
            self.init_scale = self._cap_accum(1.0, alpha)
        new = set(bp.foreign_gemms) - self._foreign_reported
        if new:
            self._foreign_reported |= new
            warnings.warn(
                'AdaLossScaled: GEMMs computed by raw Chainer functions pass '
                'the loss scale through unchanged (beta = 1); use '
                'ada_loss.functions or links to scale them: '
                + '; '.join(sorted(new)))

    def loss_scales(self):
        """{layer path: α used for that layer's weight update} (last pass).

        Keys are link paths without the leading slash (``'res2/0/conv1'``),
        values are Python floats (powers of two).
        """
        return self._read_records(0)

    def layer_scales(self):
        """{layer path: β, the local loss scale of that GEMM} (last pass)."""
        return self._read_records(1)

    def _read_records(self, which):
        # On a device the records are 0-d arrays: read lazily, all of them
        # with one transfer.
        keys = list(self._records)
        values = [self._records[k][which] for k in keys]
        if any(is_device_scalar(v) for v in values):
            values = device_kernels().to_floats(values)
        return collections.OrderedDict(zip(keys, values))

    def serialize(self, serializer):
        """Saves/loads the iteration count, the β cache and, with
        ``init_scale='auto'``, α_{N+1} (for resume)."""
        self.iteration = int(serializer('iteration', self.iteration))
        if self.auto_init:
            self.init_scale = float(serializer('init_scale', self.init_scale))
        keys = sorted(self._betas, key=str)
        if isinstance(serializer, chainer.serializer.Deserializer):
            keys = [k for k in str(serializer('beta_keys', '')).split('\n')
                    if k]
            vals = serializer('beta_values', None)
            self._betas = {k: float(v) for k, v in zip(keys, vals)}
        else:
            serializer('beta_keys', '\n'.join(keys))
            values = [self._betas[k] for k in keys]
            if any(is_device_scalar(v) for v in values):
                values = device_kernels().to_floats(values)
            serializer('beta_values', numpy.array(values, dtype=numpy.float64))


class _LossGradientMoments(object):
    """E[g²] and max|g| of the unscaled loss gradient, over every GEMM that
    receives it (``ScaledBackprop``'s ``loss_gradient`` callback), in
    float64."""

    def __init__(self):
        self.total = 0.0
        self.count = 0
        self.peak = 0.0

    def __call__(self, func, g, alpha):
        g = numpy.asarray(g, numpy.float64) / alpha
        self.total += float(numpy.sum(g * g))
        self.count += g.size
        if g.size:
            self.peak = max(self.peak, float(numpy.abs(g).max()))

    def second(self):
        return self.total / self.count

