"""Loss-scaling modes in the harness: their order in a table, the grid's
modes, a mode as part of a folder name. The modes themselves (parsing,
options, defaults, the method a mode makes) are :mod:`ada_loss.scaling`'s.
"""
from ada_loss.scaling import parse_mode

#: column order of the paper's Table 1
MODE_ORDER = ('fp32', 'none', 'fixed', 'dynamic', 'adaptive', 'amax')


def mode_sort_key(mode):
    """Sorts modes (strings or specs) in :data:`MODE_ORDER`, fixed scales
    ascending."""
    spec = parse_mode(mode)
    return (MODE_ORDER.index(spec.name), spec.options.get('scale', 0.0),
            str(spec))


def grid_modes(modes, fixed_scales):
    """``modes`` then ``fixed:S`` for each scale S not among them, as
    :class:`~ada_loss.scaling.LossScalingSpec`."""
    out = [parse_mode(m) for m in modes]
    for scale in fixed_scales:
        mode = parse_mode('fixed:{!r}'.format(scale))
        if mode not in out:
            out.append(mode)
    return out


def mode_slug(mode):
    """A mode as a folder-name part (``fixed:128`` -> ``fixed_128``)."""
    return str(parse_mode(mode)).replace(':', '_').replace(',', '_')


#: a mode's table column, by its name (fixed scales have columns of their
#: own: Fixed (best) / (worst), or one per S)
LABELS = {'fp32': 'FP32', 'none': 'None', 'dynamic': 'Dynamic',
          'adaptive': 'Adaptive', 'amax': 'Amax'}


def column_label(mode):
    """The column name of a mode: ``Adaptive (authors)`` for
    ``adaptive:style=authors``, ``Adaptive (paper)`` for ``adaptive``
    without its overflow guard (Algorithms 3-4 as written), else the
    name's label (:data:`LABELS`)."""
    spec = parse_mode(mode)
    if spec.name == 'adaptive' and spec.options.get('style') == 'authors':
        return 'Adaptive (authors)'        # docs/authors.md
    if spec.name == 'adaptive' and spec.options.get('guard') is False:
        return 'Adaptive (paper)'
    return LABELS.get(spec.name, spec.name)


def mode_columns(modes):
    """``[(label, mode text)]``: one column per distinct mode of ``modes``
    (none fixed), in :data:`MODE_ORDER`. A column holds the runs of one
    mode only: where two modes would share a label
    (``dynamic`` and ``dynamic:style=chainer``), each is labelled by its
    canonical text instead (issue 39: a cell never averages two modes)."""
    specs = sorted({parse_mode(m) for m in modes}, key=mode_sort_key)
    labels = [column_label(s) for s in specs]
    return [(label if labels.count(label) == 1 else str(s), str(s))
            for label, s in zip(labels, specs)]


def canonical_mode(text):
    """The canonical text of a mode as ``run.json`` records it (earlier
    runs may hold another spelling), or None if it does not parse."""
    try:
        return str(parse_mode(text))
    except ValueError:
        return None
