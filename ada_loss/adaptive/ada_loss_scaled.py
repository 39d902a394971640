"""Adaptive loss scaling for an unmodified Chainer model (paper §3)."""
import collections
import math
import warnings

import chainer
import numpy

from ada_loss.adaptive.backward import (
    NonFinite, ScaledBackprop, gemm_key, gemm_nodes)
from ada_loss.formats import get_format
from ada_loss.functions.matmul import OperandGradient
from ada_loss.functions.scales import (
    device_kernels, host_float, is_device_scalar)
from ada_loss.links import as_gemm_link
from ada_loss.loss_scale.fit import top_binade_scale
from ada_loss.loss_scale.checks import (
    in_open_unit, no_cap_is_none, optional_at_least_one, positive_int)
from ada_loss.loss_scale.gemm import (
    authors_caps, authors_raw_scale, authors_round_pow2, bound_gain,
    check_bound, check_scale, gemm_loss_scale, loss_gradient_scale, max_abs,
    round_down_pow2)

#: how β is computed: ``'paper'`` (the paper's text, Algorithm 4 and
#: §3.2.3; the default) or ``'authors'`` (the authors' final code,
#: :func:`ada_loss.loss_scale.gemm.authors_loss_scale`; docs/authors.md)
STYLES = ('paper', 'authors')


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
        init_scale (float, 'format', 'amax' or 'auto'): α_{N+1}, the scale
            of the loss gradient (§3.1). A number: that constant (the
            paper's is 1: ``init_scale=1.0``). ``'format'`` (the default
            since issue 47's pre-registered test, docs/depth_study.md;
            *not in the paper*): ``'amax'`` where the format cannot hold
            1/B as a normal number (its smallest normal 2^emin above 1/B,
            B the loss gradient's rows: a mean-reduced softmax
            cross-entropy has entries of magnitude ≤ 1/B — at B = 128 in
            E4M3 the whole loss gradient is subnormal at α = 1), else
            α_{N+1} = 1 untouched, the paper's constant; formats of FP16's
            range or more (FP16, BF16, E5M2) always keep it, whatever the
            rows (bit-identical to ``init_scale=1.0``; decided from the
            loss gradient's shape, :func:`format_rule`).
            ``'auto'`` (*not in the paper*): start at 1, then set it from
            the loss gradient's own statistics by Eq. 1
            (:func:`~ada_loss.loss_scale.gemm.loss_gradient_scale`),
            measured on the pass before each β update so that the new
            α_{N+1} and the new β's (which depend on it) start together.
            ``'amax'`` (*not in the paper*): the same, but α_{N+1} puts the
            loss gradient's largest entry into the format's top binade
            (:func:`~ada_loss.loss_scale.fit.top_binade_scale`): a softmax
            gradient is one large entry per row and many tiny ones, which
            Eq. 1's Gaussian does not model. The rules run on the host and
            on a device (``device.loss_gradient_alpha``, no read; captured
            by the CUDA-graph step).
        t_uf (float): T_uf, the allowed underflow rate (§3.2.1).
        update_interval (int): recompute β every this many backward passes
            and reuse the last β in between (§4.3).
        fmt (str): gradient format whose range is targeted ('float16'; with
            float32 arrays this still targets FP16's range, which makes the
            method testable bit for bit).
        bound (str): the overflow bound of each β (see
            :mod:`ada_loss.loss_scale.gemm`): ``'output'`` (default of
            ``style='paper'``, *not in the paper*: bounds the GEMM's output
            gradient, so β·gx cannot overflow), ``'product'`` (the paper's
            §3.2.3, bounds one product), ``'fan_in'`` (the authors' code's:
            the product bound divided by their fan W.shape[0]·kh·kw; the
            only bound of ``style='authors'``), ``'gauss'``.
        style (str): ``'paper'`` (default): β as the paper's text
            (Algorithm 4: the σ of one product w·g, u = the format's
            smallest subnormal, 2^-24 in FP16). ``'authors'``: β exactly as
            the authors' final code (kumasento/gradient-scaling,
            ``get_loss_scale_by_approx_range``): σ·√(0.5·fan), u_min
            6.0e-8, their fan bound (always on), their caps applied before
            their power-of-two rounding, β recomputed every
            ``update_interval`` passes from the statistics and re-capped
            with the current α on every pass (docs/authors.md). CPU only.
        max_layer_scale (float): *not in the paper*: cap on each β (the
            authors' ``scale_upper_bound``; their CIFAR runs: 128).
        max_accum_scale (float): *not in the paper*: cap on each α·β (the
            authors' ``accum_upper_bound``; their CIFAR runs: 4096).
        guard (bool): *not in the paper* (default True): the overflow guard
            and the backoff after a skipped step. Where a gradient is
            rounded to the narrow format (entering each GEMM, the input
            gradient a GEMM produces) one whose largest magnitude would
            overflow is brought into range by a power of two and its α
            lowered to match (:mod:`ada_loss.adaptive.backward`); a step
            whose gradients are still non-finite (skipped by the updater)
            lowers the β of the GEMMs that produced the first non-finite
            gradient by 2^-k, k growing with consecutive skips (1, 3, 6,
            ...), relaxed by one binade per ``backoff_window`` clean steps.
            ``guard=False`` is the paper's Algorithm 3–4 exactly. On device
            arrays the guard's fits are decided on the device (no host
            read); what it noted is read after a skipped step.
        backoff_window (int): clean steps after which each layer's backoff
            is relaxed by one power of two (default 100).
        nonlinear_scale (bool): *not in the paper* (default True): where
            the backward of a softmax (attention's: y ⊙ (g − Σ y·g)) or a
            GELU leaves more than ``t_uf`` of its input gradient's nonzero
            entries to flush to zero in ``fmt`` where the next GEMM stores
            it (after the mask and 1/√d), that gradient is sent on at α·σ,
            σ the power of two that puts its largest entry into the
            format's top binade
            (:func:`~ada_loss.loss_scale.fit.top_binade_scale`, the rule of
            ``init_scale='amax'``): these nodes multiply the gradient by
            factors ≪ 1 (probabilities; GELU's derivative for x ≪ 0), which
            §3.2.2's assumption (an element-wise op does not change
            underflow) does not cover (docs/modes.md). A no-op where
            nothing flushes beyond T_uf and in graphs with neither node
            (the CNNs: their loss is softmax cross-entropy, another node).
            σ is decided on the host: on device arrays one read per node.
        split_scales (bool): *not in the paper* (default True): at a split
            along the last axis (a GPT's Q/K/V split of ``c_attn``'s
            output) whose output gradients arrive at different scales, each
            slice keeps its own scale until the GEMM that consumes the
            concatenation has rounded it, then is brought to Algorithm 5's
            common α in FP32 (docs/modes.md: a concatenation adds nothing,
            so Algorithm 5's reason to rescale before the rounding is
            absent). False: Algorithm 5 before the concatenation.
        verbose (bool): print which layers were converted.
    """

    def __init__(self, model, init_scale='format', t_uf=1e-3,
                 update_interval=1,
                 fmt='float16', bound=None,
                 max_layer_scale=None, max_accum_scale=None, guard=True,
                 backoff_window=100, style='paper', nonlinear_scale=True,
                 split_scales=True, verbose=True):
        if style not in STYLES:
            raise ValueError('unknown style {!r}; expected one of: {}'
                             .format(style, ', '.join(STYLES)))
        if bound is None:
            bound = 'fan_in' if style == 'authors' else 'output'
        if style == 'authors' and bound != 'fan_in':
            raise ValueError(
                "style='authors' has one overflow bound, the authors' "
                "(bound=fan_in), always on; got bound={!r}".format(bound))
        #: how α_{N+1} is set from the loss gradient: None (a constant,
        #: the paper's), 'auto' (Eq. 1), 'amax' (its peak in the top
        #: binade) or 'format' ('amax' where 1/B is not normal, else None)
        self.init_rule = init_scale if isinstance(init_scale, str) else None
        self.auto_init = self.init_rule is not None
        if self.init_rule not in INIT_RULES:
            raise ValueError("init_scale must be a positive number, 'auto', "
                             "'amax' or 'format', got {!r}".format(init_scale))
        if not self.auto_init:
            check_scale(init_scale, 'init_scale')
        in_open_unit('t_uf', t_uf)
        positive_int('update_interval', update_interval)
        for name, cap in (('max_layer_scale', max_layer_scale),
                          ('max_accum_scale', max_accum_scale)):
            optional_at_least_one(name, cap)
        if not isinstance(guard, bool):
            raise ValueError('guard must be true or false, got {!r}'
                             .format(guard))
        positive_int('backoff_window', backoff_window)
        for name, v in (('nonlinear_scale', nonlinear_scale),
                        ('split_scales', split_scales)):
            if not isinstance(v, bool):
                raise ValueError('{} must be true or false, got {!r}'
                                 .format(name, v))
        self.nonlinear_scale = nonlinear_scale
        self.split_scales = split_scales
        self.model = model
        self.init_scale = 1.0 if self.auto_init else float(init_scale)
        self.t_uf = float(t_uf)
        self.update_interval = int(update_interval)
        self.fmt = get_format(fmt)
        self.bound = check_bound(bound)
        self.style = style
        # (an infinite cap is no cap: stored as None)
        self.max_layer_scale = no_cap_is_none(max_layer_scale)
        self.max_accum_scale = no_cap_is_none(max_accum_scale)
        self.guard = guard
        self.backoff_window = int(backoff_window)
        # a layer's backoff stops at the format's range in binades (u_min to
        # u_max): lowering a scale further maps every value that fit before
        # to zero (and a long run of bad steps would otherwise take ever
        # longer to relax)
        self._max_backoff = int(math.ceil(math.log2(
            self.fmt.u_max / self.fmt.u_min)))
        self.iteration = 0
        self._betas = {}
        # the backoff (guard): {layer: k} (β times 2^-k), consecutive
        # skipped steps, clean steps since the last relaxation
        self._backoff = {}
        self._skip_run = 0
        self._clean_steps = 0
        self._last_pass = None
        # resumed from a snapshot without α_{N+1} (:meth:`serialize`)
        self._constant_snapshot = False
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
            elif 'W' in link._params and not getattr(
                    link, '_children', None) and \
                    not isinstance(link, _NOT_GEMMS):
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
        """β of one GEMM: the method's (:meth:`_layer_scale`), lowered by
        the layer's backoff, capped by ``max_accum_scale``."""
        key = gemm_key(func)
        beta = self._layer_scale(func, key, W, g, alpha)
        k = self._backoff.get(key, 0)
        if k:
            beta = _backed_off(beta, k, alpha)
        if self.style == 'authors':
            return beta     # capped before their rounding (_layer_scale)
        return self._cap_accum(alpha, beta)

    def _layer_scale(self, func, key, W, g, alpha):
        """Algorithm 4, recomputed every ``update_interval`` passes."""
        recompute = ((self.iteration - 1) % self.update_interval == 0
                     or key not in self._betas)
        group_axis = getattr(func, 'stat_axis', None)
        if self.style == 'authors':
            if isinstance(func, OperandGradient):
                raise NotImplementedError(
                    "style='authors' has no rule for a GEMM of two "
                    'activations ({}): their code scales layer GEMMs only; '
                    "use style='paper'".format(key))
            return self._authors_scale(key, W, g, alpha, recompute)
        if recompute:
            if is_device_scalar(alpha) and group_axis is not None:
                raise NotImplementedError(
                    'per-head statistics of attention GEMMs ({}) run on '
                    'the CPU only'.format(key))
            if is_device_scalar(alpha):
                beta = self._gemm_scale_on_device(func, W, g)
            else:
                gain = bound_gain(func, W, self.bound)
                beta = gemm_loss_scale(W, g, self.t_uf, self.fmt,
                                       bound=self.bound, gain=gain,
                                       max_scale=self.max_layer_scale,
                                       group_axis=group_axis)
            self._betas[key] = beta
        return self._betas[key]

    def _authors_scale(self, key, W, g, alpha, recompute):
        """``style='authors'``: as their ``AdaLoss.get_loss_scale``, the
        uncapped β is what is kept between updates (their ``loss_scales``
        list); the caps (with this pass's α) and their power-of-two
        rounding are applied on every pass."""
        if is_device_scalar(alpha) or not isinstance(g, numpy.ndarray):
            raise NotImplementedError(
                "style='authors' runs on the CPU only: its device path has "
                'not been written and run on a GPU yet')
        if recompute:
            raw = authors_raw_scale(W, g, self.t_uf, self.fmt)
            # a non-finite gradient (their code raises): β 1, as style=paper
            self._betas[key] = 1.0 if raw is None else float(raw)
        return authors_round_pow2(
            authors_caps(self._betas[key], alpha, self.max_layer_scale,
                         self.max_accum_scale, self.fmt), self.fmt)

    def _gemm_scale_on_device(self, func, W, g):
        """β as a 0-d device array (CuPy kernels, no synchronization); the
        weight statistics come from the pass's one batched launch
        (:meth:`_batch_weight_statistics`) when it covered this GEMM."""
        w_stats = self._device_w_stats.pop(id(func), None)
        return device_kernels().gemm_loss_scale(
            W, g, self.t_uf, self.fmt, bound=self.bound,
            axes=func.grad_input_axes, max_scale=self.max_layer_scale,
            w_stats=w_stats)

    #: {id(GEMM node): its weight statistics on the device} of this pass
    _device_w_stats = {}
    #: whether β comes from Algorithm 4's weight statistics (a subclass
    #: whose rule does not read them sets False: nothing is batched)
    uses_weight_statistics = True

    def _batch_weight_statistics(self, loss):
        """The weight statistics of every GEMM of the pass that takes an
        input gradient, in one launch (per storage dtype) before the
        backward starts, instead of one launch per layer as the backward
        meets it (issue 35 item 1: on a GPU a launch costs more than a small
        layer's statistics). A β update step only: between updates the
        cached β's are used and no statistics are computed."""
        nodes = gemm_nodes(loss)
        if not nodes:
            return {}
        rows = device_kernels().weight_statistics_many(
            [(f.gemm_weight(), f.grad_input_axes) for f in nodes])
        return {id(f): r for f, r in zip(nodes, rows)}

    def _nonlinear_scale(self, g, alpha):
        """σ for a softmax's or GELU's input gradient ``g`` carried at
        ``alpha`` where the next GEMM stores it (``nonlinear_scale``): 1
        unless more than T_uf of its nonzero entries round to zero in the
        format, else the power of two ≥ 1 that puts its largest entry into
        the top binade, capped by ``max_accum_scale`` and by 2^64 on
        α·σ."""
        if not isinstance(g, numpy.ndarray):
            g = chainer.backend.CpuDevice().send(g)     # one read
        # (float16 arrays widened exactly: the format rounds float32)
        a = numpy.abs(g).astype(numpy.float32, copy=False)
        nonzero = int(numpy.count_nonzero(a))
        if not nonzero:
            return 1.0
        flushed = int(numpy.count_nonzero(
            (a != 0) & (self.fmt.quantize(a) == 0)))
        if flushed <= self.t_uf * nonzero:
            return 1.0
        peak = float(a.max())
        if not math.isfinite(peak):
            return 1.0
        alpha_host = host_float(alpha)
        sigma = min(top_binade_scale(peak, self.fmt),
                    round_down_pow2(MAX_LOSS_SCALE / alpha_host))
        sigma = self._cap_accum(alpha_host, sigma)
        return max(sigma, 1.0)

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
            entry = _LossGradientMoments() \
                if isinstance(loss.array, numpy.ndarray) \
                else _DeviceLossGradient()
        guard = self.guard
        init_scale = self.init_scale
        k = self._backoff.get(LOSS, 0)
        if k:
            init_scale = _backed_off(init_scale, k, 1.0)
        self._device_w_stats = {}
        if (not isinstance(loss.array, numpy.ndarray)
                and self.style == 'paper' and self.uses_weight_statistics
                and (self.iteration - 1) % self.update_interval == 0):
            self._device_w_stats = self._batch_weight_statistics(loss)
        bp = ScaledBackprop(
            self._gemm_scale, self.fmt.u_max, self._observe,
            self._weight_scale, entry, guard=guard,
            nonlinear_scale=self._nonlinear_scale if self.nonlinear_scale
            else None, split_scales=self.split_scales)
        bp.run(loss, init_scale)
        self._device_w_stats = {}
        self._last_pass = bp
        self._records = bp.gemm_records
        rule = self.init_rule
        if rule == 'format' and entry is not None:
            rule = format_rule(self.fmt, entry.rows())
            if rule is None:
                entry = None        # 1/B is normal here: α_{N+1} stays 1
            elif self._constant_snapshot:
                raise ValueError(
                    'this run resumed from a snapshot with a constant '
                    'alpha_(N+1) (the default before init_scale=format), '
                    'and init_scale=format would now scale its loss '
                    "gradient by the amax rule ({} cannot hold 1/{} as a "
                    'normal number): resume it with adaptive:init_scale=1'
                    .format(self.fmt, entry.rows()))
        if isinstance(entry, _DeviceLossGradient):
            # decided on the device (no read): the old α_{N+1} stays where
            # the loss is not finite or no GEMM received its gradient
            self.init_scale = device_kernels().loss_gradient_alpha(
                entry.parts, loss.array, self.init_scale, rule,
                self.fmt, self.t_uf, MAX_LOSS_SCALE, self.max_accum_scale)
        elif entry is not None and entry.count and bp.loss_finite:
            if rule == 'amax':
                alpha = top_binade_scale(entry.peak, self.fmt)
            else:
                alpha = loss_gradient_scale(entry.second(), entry.peak,
                                            self.t_uf, self.fmt)
            # a very confident batch has a loss gradient near FP32's
            # smallest numbers: its Eq. 1 or top-binade scale can exceed
            # FP32's range, where every scaled gradient overflows
            self.init_scale = self._cap_accum(1.0, min(alpha,
                                                       MAX_LOSS_SCALE))
        new = set(bp.foreign_gemms) - self._foreign_reported
        if new:
            self._foreign_reported |= new
            warnings.warn(
                'AdaLossScaled: GEMMs computed by raw Chainer functions pass '
                'the loss scale through unchanged (beta = 1); use '
                'ada_loss.functions or links to scale them: '
                + '; '.join(sorted(new)))

    # -- the backoff (guard) ----------------------------------------------
    def last_nonfinite(self):
        """:data:`ada_loss.adaptive.backward.NonFinite` of the last pass
        (the first GEMM, in backward order, whose entering gradient was
        non-finite or overflowed its stored format), or None. Float16
        gradients are not scanned during the pass (nothing to guard there):
        for them the first GEMM *use* in backward order whose weight or bias
        gradient contribution is non-finite is looked up here (per use, so
        that a layer whose weights are shared is not named for another
        layer's overflow), which the updater does only for a skipped
        step."""
        bp = self._last_pass
        if bp is None:
            return None
        if bp.nonfinite is None:
            for use in bp.uses:
                for g in use.params:
                    if g.dtype != numpy.float16:
                        continue
                    if isinstance(g, numpy.ndarray):
                        peak, alpha = max_abs(g), use.alpha
                    else:    # one read per gradient, after a skipped step
                        device = device_kernels()
                        peak, alpha = device.to_floats(
                            [device.max_abs(g), use.alpha])
                    if not math.isfinite(peak):
                        bp.nonfinite = NonFinite(use.layer, alpha, peak,
                                                 use.origins)
                        return bp.nonfinite
        return bp.nonfinite

    def guarded(self):
        """{(layer, 'in' or 'out'): k} where the guard lowered a gradient's
        scale by 2^-k in the last pass."""
        return {} if self._last_pass is None else dict(
            self._last_pass.guarded)

    def backoff(self):
        """{layer: k}: the β of these layers is lowered by 2^-k (the
        backoff after skipped steps; ``'(loss)'`` is α_{N+1})."""
        return dict(self._backoff)

    def step_done(self, skipped):
        """Told after every step whether it was skipped (non-finite
        gradients). With the guard, a skipped step lowers the β of the GEMMs
        that produced the first non-finite gradient (every GEMM and
        α_{N+1} when it came from the loss itself or was not seen) by 2^-n
        more, n the number of consecutive skipped steps, so that no two
        steps in a row are scaled alike and a run cannot skip forever; each
        ``backoff_window`` clean steps relax every layer's backoff by one
        power of two."""
        bp = self._last_pass
        if not self.guard:
            return
        if skipped and bp is not None and not bp.loss_finite:
            # a bad batch (the loss itself is Inf/NaN: NaN inputs, a forward
            # overflow): no scale caused it and none can fix it, so the
            # scales are left as they are (backing every layer off for it
            # would only underflow the next clean batches)
            return
        if not skipped:
            self._skip_run = 0
            self._clean_steps += 1
            if self._clean_steps >= self.backoff_window:
                self._clean_steps = 0
                self._backoff = {k: v - 1 for k, v in self._backoff.items()
                                 if v > 1}
            return
        self._skip_run += 1
        self._clean_steps = 0
        nonfinite = self.last_nonfinite()
        layers = nonfinite.origins if nonfinite is not None else ()
        if not layers:
            layers = list(self._last_pass.layers) + [LOSS]
        for layer in layers:
            self._backoff[layer] = min(self._backoff.get(layer, 0)
                                       + self._skip_run, self._max_backoff)

    def loss_scales(self):
        """{layer path: α used for that layer's weight update} (last pass).

        Keys are link paths without the leading slash (``'res2/0/conv1'``),
        values are Python floats (powers of two).
        """
        return self._read_records(0)

    def nonlinear_scales(self):
        """[(node label, σ)] of each softmax and GELU of the last pass (its
        input gradient went on at α·σ: ``nonlinear_scale``; σ = 1 where
        nothing flushed beyond T_uf), in backward order (the last block
        first); [] without ``nonlinear_scale``."""
        if self._last_pass is None:
            return []
        return [(label, host_float(s))
                for label, _, s in self._last_pass.nonlinear_records]

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
        """Saves/loads the iteration count, the β cache, the backoff state
        and, with ``init_scale='auto'``, α_{N+1} (for resume)."""
        self.iteration = int(serializer('iteration', self.iteration))
        if self.auto_init:
            try:
                self.init_scale = float(serializer(
                    'init_scale', host_float(self.init_scale)))
            except KeyError:
                if self.init_rule != 'format':
                    raise
                # a snapshot of a run whose α_{N+1} was a constant: one of
                # `adaptive` from before init_scale='format' became the
                # default. Where the rule keeps α_{N+1} = 1 the run goes on
                # as it ran; where it would switch to 'amax' the first
                # backward refuses (a silent switch mid-run)
                self._constant_snapshot = True
        if self.guard:
            self._serialize_backoff(serializer)
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


    def _serialize_backoff(self, serializer):
        if isinstance(serializer, chainer.serializer.Deserializer):
            try:
                keys = str(serializer('backoff_keys', ''))
            except KeyError:       # a snapshot from before the guard
                return
            keys = [k for k in keys.split('\n') if k]
            values = serializer('backoff_values', None)
            self._backoff = {k: int(v) for k, v in zip(keys, values)}
            self._skip_run = int(serializer('skip_run', 0))
            self._clean_steps = int(serializer('clean_steps', 0))
        else:
            serializer('skip_run', self._skip_run)
            serializer('clean_steps', self._clean_steps)
            # layers named by their paths (the keys of converted links)
            keys = sorted(k for k in self._backoff if isinstance(k, str))
            serializer('backoff_keys', '\n'.join(keys))
            serializer('backoff_values', numpy.array(
                [self._backoff[k] for k in keys], dtype=numpy.int64))


#: links with a weight ``W`` that run no GEMM: an embedding is a gather
#: (its backward a scatter-add of the gradient as carried, at its α)
_NOT_GEMMS = (chainer.links.EmbedID,)

#: the values of ``init_scale`` that set α_{N+1} from the loss gradient
INIT_RULES = (None, 'auto', 'amax', 'format')


#: FP16's smallest normal number: formats whose smallest normal is at most
#: this are left at α_{N+1} = 1 by ``init_scale='format'``
FP16_SMALLEST_NORMAL = 2.0 ** -14


def format_rule(fmt, rows):
    """The rule ``init_scale='format'`` follows for a loss gradient of
    ``rows`` rows stored in ``fmt``: ``'amax'`` where 1/rows — the largest
    entry a mean-reduced softmax cross-entropy's gradient can have — is
    below the format's smallest normal number, else None (α_{N+1} = 1).
    Decided from shapes only (no read of a device array): it assumes a
    loss averaged over the rows, and takes the amax rule for a summed or
    otherwise normalized loss of as many rows too.

    Formats with at least FP16's range (smallest normal ≤ 2^-14: FP16,
    BF16, E5M2) always keep α_{N+1} = 1, the scope the pre-registration
    named (docs/depth_study.md, "Pre-registered"): they hold 1/B as a
    normal number for every batch a classifier trains with (B ≤ 2^14),
    and a dense head's rows (N·H·W: SSD512's first head has 2^15 at batch
    8) overstate the B its loss is divided by (SSD's: the positive
    matches), so there the rows are no evidence of an underflowing loss
    gradient; nothing was tested in them."""
    if rows and 2.0 ** fmt.emin > max(1.0 / rows, FP16_SMALLEST_NORMAL):
        return 'amax'
    return None


def _rows(g):
    """Rows of a loss gradient: its entries per class (the second axis):
    N for (N, C) logits, N·H·W for (N, C, H, W) ones."""
    shape = g.shape
    if len(shape) < 2 or shape[1] == 0:
        return int(numpy.prod(shape))
    return int(numpy.prod(shape)) // int(shape[1])

#: the largest α_{N+1} that ``init_scale='auto'|'amax'`` sets (2^64): far
#: above any scale a gradient needs, and far enough below FP32's largest
#: value (2^128) that a scaled gradient of magnitude ≤ 2^64 stays finite
MAX_LOSS_SCALE = 2.0 ** 64

#: the backoff's key for α_{N+1}, the loss gradient's scale
LOSS = '(loss)'

#: The backoff never takes a gradient's scale α below this (2^-24): with
#: it, a leaf's α stays a normal FP32 number (Chainer divides the FP32
#: gradient by it: an α that underflows FP32 gives 0/0 = NaN weights), and a
#: scale that low already maps every gradient of magnitude < 2^24·u_min to
#: zero, so lowering it further can only destroy gradients.
MIN_BACKOFF_SCALE = 2.0 ** -24


def _backed_off(beta, k, alpha):
    """β lowered by the backoff 2^-k, but not so far that α·β falls below
    :data:`MIN_BACKOFF_SCALE` (a β that Algorithm 4 itself chose lower
    is kept)."""
    if is_device_scalar(alpha) or is_device_scalar(beta):
        return device_kernels().backed_off(beta, k, alpha, MIN_BACKOFF_SCALE)
    lowered = beta * 2.0 ** -k
    if alpha * lowered >= MIN_BACKOFF_SCALE:
        return lowered
    return min(beta, 2.0 ** math.ceil(math.log2(MIN_BACKOFF_SCALE / alpha)))


class _LossGradientMoments(object):
    """E[g²] and max|g| of the unscaled loss gradient, over every GEMM that
    receives it (``ScaledBackprop``'s ``loss_gradient`` callback), in
    float64."""

    def __init__(self):
        self.total = 0.0
        self.count = 0
        self.peak = 0.0
        self._rows = 0

    def rows(self):
        """The most rows of a loss gradient a GEMM received."""
        return self._rows

    def __call__(self, func, g, alpha):
        self._rows = max(self._rows, _rows(g))
        g = numpy.asarray(g, numpy.float64) / alpha
        self.total += float(numpy.sum(g * g))
        self.count += g.size
        if g.size:
            self.peak = max(self.peak, float(numpy.abs(g).max()))

    def second(self):
        return self.total / self.count


class _DeviceLossGradient(object):
    """The loss gradient's arrays as the GEMMs receive them on a device,
    with their scales: :func:`ada_loss.loss_scale.device
    .loss_gradient_alpha` combines them as :class:`_LossGradientMoments`
    does, without reading them."""

    def __init__(self):
        self.parts = []

    def rows(self):
        """As :meth:`_LossGradientMoments.rows` (shapes: no read)."""
        return max((_rows(g) for g, _ in self.parts), default=0)

    def __call__(self, func, g, alpha):
        self.parts.append((g, alpha))

