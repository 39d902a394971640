"""The grid of runs of a table: models x datasets x modes x seeds.

One run (a :class:`Cell`) lives in ``<out>/<table>/<run name>/`` with run
name ``<model>-<dataset>-<mode>-s<seed>``; in the folder name the mode's
``:`` and ``,`` become ``_`` (``fixed:128`` -> ``fixed_128``).
"""
import collections

from ada_loss.scaling import parse_mode

Cell = collections.namedtuple('Cell', ('model', 'dataset', 'mode', 'seed'))

#: column order of the paper's Table 1
MODE_ORDER = ('fp32', 'none', 'fixed', 'dynamic', 'adaptive', 'amax')

FILTER_KEYS = ('model', 'dataset', 'mode', 'seed')


def mode_slug(mode):
    return str(parse_mode(mode)).replace(':', '_').replace(',', '_')


def run_name(cell):
    return '{}-{}-{}-s{}'.format(cell.model, cell.dataset,
                                 mode_slug(cell.mode), cell.seed)


def mode_sort_key(mode):
    spec = parse_mode(mode)
    return (MODE_ORDER.index(spec.name), spec.options.get('scale', 0.0),
            str(spec))


def expand_grid(cfg):
    """All cells of a validated config: seed-major (so that a partial grid
    already holds complete rows), then model, dataset, mode in the paper's
    column order."""
    from ada_loss.experiment.config import grid_modes
    g = cfg['grid']
    modes = sorted(grid_modes(cfg), key=mode_sort_key)
    return [Cell(m, d, mode, s) for s in g['seeds'] for m in g['models']
            for d in g['datasets'] for mode in modes]


def parse_only(text):
    """``'model=resnet20,mode=adaptive|fp32,seed=0'`` -> {key: set}.

    Values of one key are separated by ``|`` or ``+``; a mode's own options may
    contain commas (``mode=adaptive:t_uf=0.001,update_interval=10``).
    """
    filters = {}
    last = None
    for token in text.split(','):
        key, eq, value = token.partition('=')
        key = key.strip()
        if eq and key in FILTER_KEYS:
            last = key
            filters.setdefault(key, []).append(value.strip())
        elif last == 'mode' and token.strip():
            filters['mode'][-1] += ',' + token.strip()
        elif token.strip():
            raise ValueError('bad --only item {!r}: expected key=value with '
                             'key one of {}'.format(token, ', '.join(
                                 FILTER_KEYS)))
    out = {}
    for key, values in filters.items():
        items = set()
        for value in values:
            for v in value.replace('+', '|').split('|'):
                if key == 'mode':
                    v = str(parse_mode(v))
                elif key == 'seed':
                    try:
                        v = int(v)
                    except ValueError:
                        raise ValueError('--only seed must be an integer, '
                                         'got {!r}'.format(v))
                items.add(v)
        out[key] = items
    return out


def select(cells, only=()):
    """Cells matching any of the ``--only`` texts (all cells if none).

    Raises:
        ValueError: a filter matches no cell (naming the grid's values).
    """
    if not only:
        return list(cells)
    chosen = []
    for text in only:
        filters = parse_only(text)
        match = [c for c in cells
                 if all(getattr(c, k) in v for k, v in filters.items())]
        if not match:
            values = {k: sorted({str(getattr(c, k)) for c in cells})
                      for k in FILTER_KEYS}
            raise ValueError('--only {!r} matches no run of the grid; the '
                             'grid has {}'.format(text, '; '.join(
                                 '{}={}'.format(k, '|'.join(v))
                                 for k, v in values.items())))
        chosen.extend(c for c in match if c not in chosen)
    return [c for c in cells if c in chosen]
