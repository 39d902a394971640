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
