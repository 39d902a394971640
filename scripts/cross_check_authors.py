"""Cross-check ``adaptive:style=authors`` against the authors' own code.

    python scripts/cross_check_authors.py --reference PATH [--seed 0]

PATH is a checkout of the authors' implementation (kumasento/gradient-scaling,
Chainer 7; e.g. ``git clone`` it, or ``git archive HEAD | tar -x -C PATH``).
Nothing of theirs is in this repository: their package is imported from PATH
in a child process (it is also called ``ada_loss``, so it cannot share an
interpreter with ours), which receives the cases as an ``.npz`` file and
sends back, per layer, the α its gradient arrived with, the β it computed
and its weight gradients.

Each case is a small network (``mlp``: three Linear layers with ReLU;
``conv``: two Convolution2D layers with ReLU and a Linear classifier;
``res``: a convolution whose output feeds a second one and the shortcut
of a residual sum, where Algorithm 5 merges the two scales), one
loss-gradient scale (``tiny`` 3e-8, ``small`` 1e-4, ``huge`` 1e3 times
N(0, 1); or ``seq``: three backward passes with a tiny, a small and a huge
one, β recomputed every 2 passes on both sides) and one setting of their caps (``none``: their ``use_bound=False``
/ our caps off; ``default``: their defaults β ≤ 16, α·β ≤ 1024; ``cifar``:
their CIFAR runs' 128 / 4096). Both sides get the same float16 weights,
inputs and loss gradient (ours runs with ``chainer.config.fp16_gemm =
'native'``, NumPy's float16 arithmetic, as Chainer's own GEMMs in theirs).
Printed per case and layer: α and β of both, whether they are identical,
and each side's weight-gradient error against a float64 backward of the same
network (relative L2 error, and the share of nonzero entries flushed to 0).

What the comparison does is unit-tested without their code
(``tests/test_cross_check_authors.py``); the shims their code needs
to run on this stack are here (:func:`_authors_worker`), not in the package.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import numpy

NETS = ('mlp', 'conv', 'res')
#: loss-gradient scales (times N(0, 1), stored in float16)
GRAD_SCALES = collections.OrderedDict(
    [('tiny', 3e-8), ('small', 1e-4), ('huge', 1e3)])
#: several backward passes (no update in between) with β recomputed every
#: INTERVAL passes: one loss gradient of each scale in turn
SEQUENCES = collections.OrderedDict([('seq', ('tiny', 'small', 'huge'))])
INTERVAL = 2
#: (max_layer_scale, max_accum_scale) = their (scale_upper_bound,
#: accum_upper_bound); None: their use_bound=False
CAPS = collections.OrderedDict(
    [('none', None), ('default', (16.0, 1024.0)), ('cifar', (128.0, 4096.0))])

#: layer name -> (kind, W shape, has bias, conv stride / pad)
LAYERS = {
    'mlp': [('l1', 'linear', (64, 32), True, None),
            ('l2', 'linear', (64, 64), True, None),
            ('l3', 'linear', (10, 64), True, None)],
    'conv': [('c1', 'conv', (8, 3, 3, 3), False, (1, 1)),
             ('c2', 'conv', (16, 8, 3, 3), False, (2, 1)),
             ('fc', 'linear', (10, 256), True, None)],
    # a residual block: relu(c0(x)) feeds c1 and the shortcut, which meet
    # in a sum (Algorithm 5: their AdaLossBranch.rescaling, ours backward.py)
    'res': [('c0', 'conv', (8, 3, 3, 3), False, (1, 1)),
            ('c1', 'conv', (8, 8, 3, 3), False, (1, 1)),
            ('fc', 'linear', (10, 512), True, None)],
}
INPUT_SHAPE = {'mlp': (16, 32), 'conv': (4, 3, 8, 8), 'res': (4, 3, 8, 8)}


# -- the cases (both sides) --------------------------------------------------
def make_case(net, grad_scale, seed=0):
    """Float16 weights (He-normal), input and loss gradient of one case:
    a dict of arrays ``x``, ``gy``, ``<layer>/W``, ``<layer>/b``."""
    rng = numpy.random.RandomState(seed)
    arrays = {'x': rng.randn(*INPUT_SHAPE[net]).astype(numpy.float16)}
    for name, _, shape, bias, _ in LAYERS[net]:
        fan = int(numpy.prod(shape[1:]))
        arrays[name + '/W'] = (rng.randn(*shape) * numpy.sqrt(2.0 / fan)
                               ).astype(numpy.float16)
        if bias:
            arrays[name + '/b'] = (rng.randn(shape[0]) * 0.1
                                   ).astype(numpy.float16)
    n = INPUT_SHAPE[net][0]
    for i, scale in enumerate(SEQUENCES.get(grad_scale, (grad_scale,))):
        arrays['gy' if i == 0 else 'gy@{}'.format(i)] = (
            rng.randn(n, 10) * GRAD_SCALES[scale]).astype(numpy.float16)
    return arrays


def loss_gradients(arrays):
    """The loss gradient of each backward pass of a case, in order."""
    n = 1 + sum(k.startswith('gy@') for k in arrays)
    return [arrays['gy']] + [arrays['gy@{}'.format(i)] for i in range(1, n)]


def update_interval(arrays):
    """β is recomputed every this many passes (INTERVAL for a sequence)."""
    return INTERVAL if len(loss_gradients(arrays)) > 1 else 1


def layer_label(name, i):
    """A layer of pass i (``l1``, then ``l1@1``, ``l1@2``, ...)."""
    return name if i == 0 else '{}@{}'.format(name, i)


def forward(net, arrays, linear, conv, relu, flatten, dtype, branch=None):
    """The network of ``net`` with the given layer functions: ``linear(name,
    h)``, ``conv(name, h, stride, pad)``, ``relu(h)``, ``flatten(h)`` and,
    for ``res``, ``branch(h)`` -> (h, h) (their AdaLossBranch; ours: the
    variable used twice)."""
    h = arrays['x']
    layers = LAYERS[net]
    if net == 'res':
        (c0, _, _, _, a0), (c1, _, _, _, a1), (fc, *_) = layers
        h = relu(conv(c0, h, *a0))
        h1, h2 = branch(h) if branch is not None else (h, h)
        h = relu(conv(c1, h1, *a1) + h2)
        return linear(fc, flatten(h))
    for i, (name, kind, _, _, conv_args) in enumerate(layers):
        if kind == 'conv':
            h = conv(name, h, *conv_args)
        else:
            if h.ndim > 2:
                h = flatten(h)
            h = linear(name, h)
        if i + 1 < len(layers):
            h = relu(h)
    return h


def float64_grads(net, arrays):
    """{layer label: dL/dW} of plain Chainer backprop in float64 (the
    reference), for each pass's loss gradient."""
    out = {}
    for i, gy in enumerate(loss_gradients(arrays)):
        grads = _float64_grads(net, dict(arrays, gy=gy))
        out.update({layer_label(k, i): v for k, v in grads.items()})
    return out


def _float64_grads(net, arrays):
    import chainer
    import chainer.functions as F
    params = {k: chainer.Parameter(v.astype(numpy.float64))
              for k, v in arrays.items() if '/' in k}
    x = arrays['x'].astype(numpy.float64)

    def linear(name, h):
        return F.linear(h, params[name + '/W'], params.get(name + '/b'))

    def conv(name, h, stride, pad):
        return F.convolution_2d(h, params[name + '/W'], params.get(
            name + '/b'), stride=stride, pad=pad)

    y = forward(net, dict(arrays, x=x), linear, conv, F.relu,
                lambda h: F.reshape(h, (h.shape[0], -1)), numpy.float64)
    y.grad = arrays['gy'].astype(numpy.float64)
    y.backward()
    return {name: params[name + '/W'].grad for name, *_ in LAYERS[net]}


def run_ours(net, arrays, caps, style='authors'):
    """Ours (``AdaLossScaled(style=style)``, float16, native FP16
    GEMMs): ({layer: (α, β)}, {layer: unscaled dL/dW in float64,
    '(input)': (the input's gradient as carried, its scale)})."""
    import chainer
    import chainer.functions as F
    import chainer.links as L
    from ada_loss.adaptive import AdaLossScaled

    class Net(chainer.Chain):
        def __init__(self):
            super(Net, self).__init__()
            with self.init_scope():
                for name, kind, shape, bias, conv_args in LAYERS[net]:
                    if kind == 'conv':
                        link = L.Convolution2D(
                            shape[1], shape[0], shape[2], stride=conv_args[0],
                            pad=conv_args[1], nobias=not bias)
                    else:
                        link = L.Linear(shape[1], shape[0], nobias=not bias)
                    setattr(self, name, link)

        def forward(self, x):
            return forward(
                net, dict(arrays, x=x),
                lambda name, h: getattr(self, name)(h),
                lambda name, h, s, p: getattr(self, name)(h),
                F.relu, lambda h: F.reshape(h, (h.shape[0], -1)),
                numpy.float16)

    with chainer.using_config('dtype', numpy.float16), \
            chainer.using_config('fp16_gemm', 'native'):
        model = Net()
        for name, *_ in LAYERS[net]:
            link = getattr(model, name)
            link.W.array[...] = arrays[name + '/W']
            if link.b is not None:
                link.b.array[...] = arrays[name + '/b']
        layer_cap, accum_cap = caps if caps is not None else (None, None)
        ada = AdaLossScaled(model, style=style, init_scale=1.0,
                            max_layer_scale=layer_cap,
                            max_accum_scale=accum_cap,
                            update_interval=update_interval(arrays),
                            verbose=False)
        scales, grads = {}, {}
        for i, gy in enumerate(loss_gradients(arrays)):
            model.cleargrads()
            x = chainer.Variable(arrays['x'])
            y = model(x)
            ada.backward(F.sum(y * gy))
            alphas, betas = ada.loss_scales(), ada.layer_scales()
            for name, *_ in LAYERS[net]:
                label = layer_label(name, i)
                scales[label] = (alphas[name], betas[name])
                W = getattr(model, name).W
                scale = getattr(W, '_loss_scale', None) or 1.0
                grads[label] = W.grad.astype(numpy.float64) / scale
    # the input gradient of the last pass
    grads['(input)'] = (x.grad, getattr(x, '_loss_scale', None) or 1.0)
    return scales, grads


# -- their CIFAR ResNet-20 beside ours -------------------------------------------
RESNET = 'resnet20'
RESNET_INPUT = (2, 3, 32, 32)      # their pool5 is an 8x8 average: 32x32 images


def their_to_our_path(path):
    """A link or parameter path of their ResNetCIFAR under their
    AdaLossScaled (``/link/res3/b1/conv2/conv/W``) as the path of the same
    one in ``CifarResNet(shortcut='authors')`` (``res3/2/conv2/W``)."""
    p = path.replace('/link/', '/', 1).lstrip('/')
    p = re.sub(r'^(res\d)/a(/|$)', r'\1/0\2', p)
    p = re.sub(r'^(res\d)/b(\d+)(/|$)',
               lambda m: '{}/{}{}'.format(m.group(1), int(m.group(2)) + 1,
                                          m.group(3)), p)
    p = re.sub(r'(^|/)conv(\d)/conv(/|$)', r'\1conv\2\3', p)
    p = re.sub(r'(^|/)conv(\d)/bn(/|$)', r'\1bn\2\3', p)
    p = re.sub(r'(^|/)residual/conv(/|$)', r'\1shortcut_conv\2', p)
    p = re.sub(r'(^|/)residual/bn(/|$)', r'\1shortcut_bn\2', p)
    return re.sub(r'^fc6(/|$)', r'fc\1', p)


def _our_resnet(dtype):
    import chainer
    from ada_loss.models import CifarResNet
    with chainer.using_config('dtype', dtype):
        return CifarResNet(20, num_classes=10, shortcut='authors')


def make_resnet_case(grad_scale, seed=0):
    """Parameters (by our path), input and loss gradient of a ResNet-20 case:
    our ``CifarResNet(20, shortcut='authors')`` initialized in mixed16 (their
    initialization), BN γ and β drawn around 1 and 0 so that they matter."""
    import chainer
    numpy.random.seed(seed)
    model = _our_resnet(chainer.mixed16)
    rng = numpy.random.RandomState(seed)
    arrays = {}
    for path, param in model.namedparams():
        a = param.array.copy()
        if path.endswith('/gamma'):
            a = (1 + 0.1 * rng.randn(*a.shape)).astype(a.dtype)
        elif path.endswith('/beta'):
            a = (0.1 * rng.randn(*a.shape)).astype(a.dtype)
        arrays[path.lstrip('/')] = a
    arrays['x'] = rng.randn(*RESNET_INPUT).astype(numpy.float16)
    arrays['gy'] = (rng.randn(RESNET_INPUT[0], 10) * GRAD_SCALES[grad_scale]
                    ).astype(numpy.float16)
    return arrays


def _load_params(model, arrays, path_of=lambda p: p):
    for path, param in model.namedparams():
        param.array[...] = arrays[path_of(path).lstrip('/')].astype(
            param.array.dtype)


def resnet_gemm_paths(arrays):
    """Our paths of the GEMM layers of a ResNet case (backward order is
    not needed: rows follow this order)."""
    return [k[:-2] for k in sorted(arrays) if k.endswith('/W')]


def run_ours_resnet(arrays, caps, style='authors'):
    """As :func:`run_ours` for the ResNet-20 case (BN in training mode)."""
    import chainer
    import chainer.functions as F
    from ada_loss.adaptive import AdaLossScaled
    model = _our_resnet(chainer.mixed16)
    _load_params(model, arrays)
    layer_cap, accum_cap = caps if caps is not None else (None, None)
    with chainer.using_config('dtype', chainer.mixed16), \
            chainer.using_config('fp16_gemm', 'native'):
        ada = AdaLossScaled(model, style=style, init_scale=1.0,
                            max_layer_scale=layer_cap,
                            max_accum_scale=accum_cap, verbose=False)
        model.cleargrads()
        x = chainer.Variable(arrays['x'])
        y = model(x)
        ada.backward(F.sum(y * arrays['gy']))
    alphas, betas = ada.loss_scales(), ada.layer_scales()
    scales = {k: (alphas[k], betas[k]) for k in alphas}
    links = dict(model.namedlinks())
    grads = {}
    for key in alphas:
        W = links['/' + key].W
        grads[key] = W.grad.astype(numpy.float64) / (
            getattr(W, '_loss_scale', None) or 1.0)
    grads['(input)'] = (x.grad, getattr(x, '_loss_scale', None) or 1.0)
    return scales, grads


def float64_resnet_grads(arrays):
    """{layer: dL/dW} of the ResNet case by plain float64 backprop."""
    import chainer
    model = _our_resnet(numpy.float64)
    _load_params(model, arrays)
    with chainer.using_config('dtype', numpy.float64):
        model.cleargrads()
        y = model(arrays['x'].astype(numpy.float64))
        y.grad = arrays['gy'].astype(numpy.float64)
        y.backward()
    links = dict(model.namedlinks())
    return {k: links['/' + k].W.grad for k in resnet_gemm_paths(arrays)}


def _their_resnet(arrays, cfg, records):
    """Their ResNetCIFAR(20) under their AdaLossScaled with the transforms
    of their CIFAR script (examples/adaptive_loss_scaling/cifar/utils.py),
    our parameters, one backward from ``gy`` at the logits (their
    AdaLossScaled scales it by init_scale 1). Returns ({our layer path:
    (α, β)}, {our layer path: dL/dW}, input gradient, its scale)."""
    import chainer
    from chainerlp.ada_loss import transforms as chainerlp_transforms
    from chainerlp.links.models.resnet import ResNetCIFAR
    from ada_loss.chainer_impl import transforms
    from ada_loss.chainer_impl.ada_loss_scaled import AdaLossScaled
    from ada_loss.chainer_impl.links.ada_loss_convolution_2d import (
        AdaLossConvolution2D)
    from ada_loss.chainer_impl.links.ada_loss_linear import AdaLossLinear
    with chainer.using_config('dtype', chainer.mixed16):
        net = AdaLossScaled(
            ResNetCIFAR(20, n_class=10), init_scale=1.0, cfg=dict(cfg),
            transforms=[
                transforms.AdaLossTransformLinear(),
                transforms.AdaLossTransformConvolution2D(),
                transforms.AdaLossTransformBatchNormalization(),
                chainerlp_transforms.AdaLossTransformConv2DBNActiv(),
                chainerlp_transforms.AdaLossTransformBasicBlock(),
                chainerlp_transforms.AdaLossTransformBNActivConv2D(),
                chainerlp_transforms.AdaLossTransformBottleneckv2()])
        _load_params(net, arrays, their_to_our_path)
        gemms = {id(link.ada_loss): their_to_our_path(path)
                 for path, link in net.namedlinks()
                 if isinstance(link, (AdaLossConvolution2D, AdaLossLinear))}
        net.cleargrads()
        x = chainer.Variable(arrays['x'])
        y = net(x)
        y.grad = arrays['gy']
        y.backward()
    links = {their_to_our_path(p): l for p, l in net.namedlinks()}
    scales = {gemms[k]: v for k, v in records.items() if k in gemms}
    grads = {k: links[k].W.grad for k in scales}
    return scales, grads, x.grad, float(
        x.grad_var.__dict__.get('loss_scale', numpy.nan))


# -- the comparison (unit-tested without their code) -------------------------
def grad_errors(g, ref):
    """(relative L2 error of g against ref, share of ref's nonzero entries
    that are 0 in g); g and ref in float64. Non-finite g: (inf, nan)."""
    g = numpy.asarray(g, numpy.float64)
    ref = numpy.asarray(ref, numpy.float64)
    if not numpy.isfinite(g).all():
        return float('inf'), float('nan')
    norm = numpy.sqrt(numpy.sum(ref * ref))
    err = numpy.sqrt(numpy.sum((g - ref) ** 2))
    rel = float(err / norm) if norm > 0 else float(err)
    nonzero = ref != 0
    flushed = float(numpy.mean(g[nonzero] == 0)) if nonzero.any() else 0.0
    return rel, flushed


def same_bits(a, b):
    """Whether two arrays have the same dtype, shape and bits."""
    if a is None or b is None:
        return False
    a, b = numpy.asarray(a), numpy.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.tobytes() == b.tobytes()


Row = collections.namedtuple('Row', (
    'case', 'layer', 'alpha_theirs', 'beta_theirs', 'alpha_ours',
    'beta_ours', 'identical', 'err_theirs', 'flushed_theirs', 'err_ours',
    'flushed_ours'))


def compare(case, layers, theirs, ours, grads_theirs, grads_ours, ref):
    """One :class:`Row` per layer. ``theirs``/``ours``: {layer: (α, β)}
    (a layer missing on one side is a mismatch); grads: {layer: dL/dW}."""
    rows = []
    for name in layers:
        a_t, b_t = theirs.get(name, (None, None))
        a_o, b_o = ours.get(name, (None, None))
        same = a_t is not None and a_o is not None and \
            float(a_t) == float(a_o) and float(b_t) == float(b_o)
        e_t = grad_errors(grads_theirs[name], ref[name]) \
            if name in grads_theirs else (float('nan'), float('nan'))
        e_o = grad_errors(grads_ours[name], ref[name]) \
            if name in grads_ours else (float('nan'), float('nan'))
        rows.append(Row(case, name, a_t, b_t, a_o, b_o, same,
                        e_t[0], e_t[1], e_o[0], e_o[1]))
    return rows


def _num(v):
    if v is None:
        return '-'
    return '{:g}'.format(float(v))


def format_table(rows):
    """A Markdown table of the rows and a last line counting matches."""
    lines = ['| case | layer | α theirs | β theirs | α ours | β ours | '
             'identical | gW rel. err. theirs | flushed theirs | '
             'gW rel. err. ours | flushed ours |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append(
            '| {} | {} | {} | {} | {} | {} | {} | {:.2e} | {:.1%} | {:.2e} | '
            '{:.1%} |'.format(
                r.case, r.layer, _num(r.alpha_theirs), _num(r.beta_theirs),
                _num(r.alpha_ours), _num(r.beta_ours),
                'yes' if r.identical else '**no**', r.err_theirs,
                r.flushed_theirs, r.err_ours, r.flushed_ours))
    same = sum(r.identical for r in rows)
    lines.append('')
    lines.append('{} of {} layers: α and β identical'.format(same, len(rows)))
    return '\n'.join(lines)


# -- their side (child process) ----------------------------------------------
def _authors_worker(reference, path_in, path_out):
    """Runs in a child process with their package first on sys.path: the
    cases of ``path_in`` through their AdaLossLinear / AdaLossConvolution2D
    links, ReLU and flatten wrapped in their IdentityLossScalingWrapper (as
    their AdaLossScaled wraps a model's functions), the loss gradient
    scaled by their ``loss_scaling`` (init scale 1), float16 as their
    ``chainer.mixed16`` runs store activations and parameters."""
    sys.path.insert(0, os.path.abspath(reference))
    import chainer
    import chainer.functions as F
    import ada_loss as theirs_pkg
    if not os.path.abspath(theirs_pkg.__file__).startswith(
            os.path.abspath(reference)):
        raise RuntimeError('imported {} instead of the reference'.format(
            theirs_pkg.__file__))
    from ada_loss.chainer_impl.ada_loss_chainer import AdaLossChainer
    from ada_loss.chainer_impl.functions.ada_loss_branch import AdaLossBranch
    from ada_loss.chainer_impl.functions.loss_scaling import loss_scaling
    from ada_loss.chainer_impl.links.ada_loss_convolution_2d import (
        AdaLossConvolution2D)
    from ada_loss.chainer_impl.links.ada_loss_linear import AdaLossLinear
    from ada_loss.chainer_impl.links.identity_loss_scaling import (
        IdentityLossScalingWrapper)

    # record (α arriving, β) of each of their AdaLoss instances
    records = {}
    original = AdaLossChainer.get_loss_scale

    def recording(self, g, W=None, prev_scale=None, lognormal=False):
        beta = original(self, g, W=W, prev_scale=prev_scale,
                        lognormal=lognormal)
        records[id(self)] = (float(prev_scale), float(beta))
        return beta
    AdaLossChainer.get_loss_scale = recording

    data = numpy.load(path_in)
    out = {}
    for case in [str(c) for c in data['cases']]:
        net, _, caps, _ = case.split('/')
        arrays = {k.split(':', 1)[1]: data[k] for k in data.files
                  if k.startswith(case + ':')}
        cfg = {'loss_scale_method': 'approx_range', 'n_uf_threshold': 1e-3,
               'dtype': 'float16',
               'update_per_n_iteration': update_interval(arrays)}
        if CAPS[caps] is None:
            cfg['use_bound'] = False
        else:
            cfg['scale_upper_bound'], cfg['accum_upper_bound'] = CAPS[caps]
        if net == RESNET:
            records.clear()
            try:
                scales, grads, gx, gx_scale = _their_resnet(arrays, cfg,
                                                            records)
            except Exception as e:      # their code stops on some inputs
                out[case + ':error'] = numpy.array('{}: {}'.format(
                    type(e).__name__, e))
                continue
            for layer, v in scales.items():
                out['{}:{}/scales'.format(case, layer)] = numpy.array(v)
                out['{}:{}/gW'.format(case, layer)] = grads[layer]
            out[case + ':gx'] = gx
            out[case + ':gx_scale'] = numpy.array(gx_scale)
            out[case + ':error'] = numpy.array('')
            continue
        links = {}
        with chainer.using_config('dtype', numpy.float16):
            for name, kind, shape, bias, conv_args in LAYERS[net]:
                if kind == 'conv':
                    link = AdaLossConvolution2D(
                        shape[1], shape[0], shape[2], stride=conv_args[0],
                        pad=conv_args[1], nobias=not bias,
                        ada_loss_cfg=dict(cfg))
                else:
                    link = AdaLossLinear(shape[1], shape[0], nobias=not bias,
                                         ada_loss_cfg=dict(cfg))
                link.W.array[...] = arrays[name + '/W']
                if link.b is not None:
                    link.b.array[...] = arrays[name + '/b']
                link.cleargrads()   # a new Parameter's grad is NaN
                links[name] = link
            relu = IdentityLossScalingWrapper(F.relu)
            flatten = IdentityLossScalingWrapper(
                lambda h: F.reshape(h, (h.shape[0], -1)))

            def branch(h):
                return AdaLossBranch(ada_loss_cfg=dict(cfg)).apply((h,))
            error = ''
            for i, gy in enumerate(loss_gradients(arrays)):
                for link in links.values():
                    link.cleargrads()
                x = chainer.Variable(arrays['x'])
                y = forward(net, dict(arrays, x=x), lambda n, h: links[n](h),
                            lambda n, h, s, p: links[n](h), relu, flatten,
                            numpy.float16, branch)
                y = loss_scaling(y, 1.0)
                y.grad = gy
                try:
                    y.backward()
                except Exception as e:      # their code stops on some inputs
                    error = '{}: {}'.format(type(e).__name__, e)
                    break
                for name, link in links.items():
                    prefix = '{}:{}/'.format(case, layer_label(name, i))
                    if id(link.ada_loss) in records:
                        out[prefix + 'scales'] = numpy.array(
                            records.pop(id(link.ada_loss)))
                    if link.W.grad is not None:
                        out[prefix + 'gW'] = link.W.grad
        if x.grad is not None:      # the input gradient, at their α
            out[case + ':gx'] = x.grad
            out[case + ':gx_scale'] = numpy.array(
                float(x.grad_var.__dict__.get('loss_scale', numpy.nan)))
        out[case + ':error'] = numpy.array(error)
    numpy.savez(path_out, **out)


def run_theirs(reference, cases, python=sys.executable):
    """{case: ({layer: (α, β)}, {layer: dL/dW}, error text)} from their code
    in a child process (see :func:`_authors_worker`)."""
    with tempfile.TemporaryDirectory() as tmp:
        path_in = os.path.join(tmp, 'cases.npz')
        path_out = os.path.join(tmp, 'theirs.npz')
        payload = {'cases': numpy.array(list(cases))}
        for case, arrays in cases.items():
            for k, v in arrays.items():
                payload['{}:{}'.format(case, k)] = v
        numpy.savez(path_in, **payload)
        env = dict(os.environ)
        env.pop('PYTHONPATH', None)     # ours must not shadow theirs
        subprocess.run([python, os.path.abspath(__file__), '--worker',
                        '--reference', reference, path_in, path_out],
                       check=True, env=env, cwd=tmp,
                       stdout=subprocess.DEVNULL)   # their prints
        data = numpy.load(path_out)
        result = {}
        for case in cases:
            scales, grads = {}, {}
            for k in data.files:
                if not k.startswith(case + ':') or k.endswith(
                        (':error', ':gx', ':gx_scale')):
                    continue
                layer, what = k.split(':', 1)[1].rsplit('/', 1)
                if what == 'scales':
                    scales[layer] = tuple(float(v) for v in data[k])
                else:
                    grads[layer] = data[k].astype(numpy.float64)
            if case + ':gx' in data.files:
                grads['(input)'] = (data[case + ':gx'],
                                    float(data[case + ':gx_scale']))
            result[case] = (scales, grads, str(data[case + ':error']))
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--reference', required=True,
                   help="a checkout of kumasento/gradient-scaling")
    p.add_argument('--seeds', type=int, nargs='+', default=[0],
                   help='seeds of the weights, inputs and loss gradients')
    p.add_argument('--style', default='authors', choices=('authors',
                                                          'paper'),
                   help="our adaptive style to compare (paper: to see what "
                   "differs from the paper's text)")
    p.add_argument('--resnet', action='store_true',
                   help="also their CIFAR ResNet-20 (their transforms, "
                   "their ResNetCIFAR) beside CifarResNet(20, "
                   "shortcut='authors'), one backward per loss-gradient "
                   "scale and caps (slower: native FP16 convolutions)")
    p.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('files', nargs='*', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _authors_worker(args.reference, *args.files)
        return 0
    if not os.path.isfile(os.path.join(args.reference, 'ada_loss',
                                       'chainer_impl', 'ada_loss_chainer.py')):
        p.error('{} is not a checkout of kumasento/gradient-scaling (no '
                'ada_loss/chainer_impl/ada_loss_chainer.py)'.format(
                    args.reference))
    cases = collections.OrderedDict()
    for seed in args.seeds:
        for net in NETS:
            for scale in list(GRAD_SCALES) + list(SEQUENCES):
                for caps in CAPS:
                    cases['{}/{}/{}/{}'.format(net, scale, caps, seed)] = \
                        make_case(net, scale, seed)
        if args.resnet:
            for scale in GRAD_SCALES:
                for caps in CAPS:
                    cases['{}/{}/{}/{}'.format(RESNET, scale, caps, seed)] = \
                        make_resnet_case(scale, seed)
    theirs = run_theirs(args.reference, cases)
    rows = []
    notes = []
    not_compared = []
    inputs_same = 0
    for case, arrays in cases.items():
        net, _, caps, _ = case.split('/')
        if net == RESNET:
            ours, grads_ours = run_ours_resnet(arrays, CAPS[caps], args.style)
        else:
            ours, grads_ours = run_ours(net, arrays, CAPS[caps], args.style)
        t_scales, t_grads, error = theirs[case]
        if error:
            # nothing of theirs to compare (an assertion in their code)
            notes.append('{}: their code raised {} (not compared)'.format(
                case, error))
            not_compared.append(case)
            continue
        gx_t, scale_t = t_grads.pop('(input)', (None, None))
        gx_o, scale_o = grads_ours.pop('(input)')
        if scale_t == scale_o and same_bits(gx_t, gx_o):
            inputs_same += 1
        else:
            notes.append('{}: the input gradient differs (scale {} theirs, '
                         '{} ours)'.format(case, scale_t, scale_o))
        if net == RESNET:
            labels = [k for k in ours if k in t_scales] + \
                [k for k in ours if k not in t_scales] + \
                [k for k in t_scales if k not in ours]
            ref = float64_resnet_grads(arrays)
        else:
            labels = [layer_label(n, i)
                      for i in range(len(loss_gradients(arrays)))
                      for n, *_ in LAYERS[net]]
            ref = float64_grads(net, arrays)
        rows += compare(case, labels, t_scales, ours, t_grads, grads_ours,
                        ref)
    print(format_table(rows))
    print('{} of {} cases: the network input gradient bit-identical, at '
          'the same scale'.format(inputs_same,
                                  len(cases) - len(not_compared)))
    if not_compared:
        print('{} cases not compared: their code stopped'.format(
            len(not_compared)))
    for note in notes:
        print(note)
    return 0 if all(r.identical for r in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
