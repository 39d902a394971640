"""A precision (:mod:`ada_loss.precision`) applied to a model
(:func:`apply_precision`) and its optimizer (:func:`setup_optimizer`)."""
from ada_loss.formats import get_format
from ada_loss.links import as_batch_normalization_link, as_gemm_link
from ada_loss.precision import parse_precision


def apply_precision(model, precision, seed=0):
    """Makes every GEMM link of ``model`` round to the precision's formats.

    For an emulated precision each ``chainer.links`` Linear, Convolution2D,
    DilatedConvolution2D and Deconvolution2D becomes its
    :mod:`ada_loss.links` counterpart in place (as :class:`AdaLossScaled`
    does) with ``gemm_formats`` set, and for a scaled precision
    ``gemm_scaling`` (a fresh state per layer); for float32 and mixed16
    both are cleared. A GEMM link with a ``keep_format`` (attention's
    :class:`ada_loss.links.MatMul` in a GPT built with
    ``attention_format``) keeps that format in both passes and no recipe
    cast whatever the precision (FP16 in mixed16 storage). In mixed16 every ``chainer.links.BatchNormalization`` also
    becomes :class:`ada_loss.links.BatchNormalization` (Chainer's results,
    faster on float16 NumPy arrays; see
    :mod:`ada_loss.functions.fp16_elementwise`). Returns the paths of the
    GEMM links.

    ``seed`` (an int ≥ 0; a training run passes its own seed) seeds the
    stochastic rounding of a recipe that has it (NVFP4): each GEMM layer
    draws from its own counter-based stream of (seed, layer index), so two
    seeds round differently and one seed repeats; the streams' step
    counters are in the model's snapshot (resume is exact).
    """
    parsed = parse_precision(precision)
    formats = parsed.gemm_formats
    recipe = parsed.recipe
    if recipe is not None:
        recipe = recipe.seeded(seed)
    if parsed.storage == 'mixed16':
        for link in model.links():
            as_batch_normalization_link(link)
    paths = []
    bf16 = () if recipe is None else recipe.bf16_layers
    for path, link in model.namedlinks():
        if formats is None and recipe is None and \
                not hasattr(link, 'gemm_formats'):
            continue
        if as_gemm_link(link):
            name = path.lstrip('/')
            keep = getattr(link, 'keep_format', None)
            if keep is not None:
                # a GEMM kept in a higher precision whatever the precision
                # (attention: ada_loss.links.MatMul(keep_format=...))
                fmt = get_format(keep)
                link.gemm_formats = None if fmt.is_float32 or \
                    parsed.storage == 'mixed16' else (fmt, fmt)
                link.gemm_scaling = None
            elif name in bf16:
                # a layer the recipe keeps in BF16 (NVFP4's first and last
                # layers): as the bf16 precision, no scaled cast
                link.gemm_formats = (get_format('bfloat16'),) * 2
                link.gemm_scaling = None
            else:
                link.gemm_formats = formats
                # each layer its own scaling state (delayed: amax
                # histories; NVFP4: its stochastic-rounding stream)
                link.gemm_scaling = None if recipe is None else \
                    recipe.state(stream=len(paths))
            paths.append(name)
    missing = [n for n in bf16 if n not in paths]
    if missing:
        raise ValueError('bf16 layers {} are not GEMM layers of the model; '
                         'its GEMM layers: {}'.format(
                             ', '.join(missing), ', '.join(paths)))
    return paths


def setup_optimizer(optimizer, model, precision):
    """``optimizer.setup(model)``, with FP32 master weights for mixed16
    (emulated precisions keep FP32 parameters: they are the masters)."""
    optimizer.setup(model)
    if parse_precision(precision).storage == 'mixed16':
        optimizer.use_fp32_update()
    return optimizer
