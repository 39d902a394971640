"""What is communicated in which precision: :class:`CommPolicy`.

The options of the APS paper (Han et al., *Auto-Precision Scaling for
Distributed Deep Learning*):

* ``fmt``: the low-precision gradient format, any name of
  :func:`ada_loss.formats.get_format` (``e5m2``, ``e4m3``, ``e3m0``, ...; the
  paper writes (exp, man): (5, 2), (4, 3), (3, 0)); ``float32`` = no
  compression.
* ``aps``: Algorithm 1's per-layer power-of-two shift (``False``: the
  "without APS" rows of Tables 3–6, a plain cast of the gradient as it is).
* ``order`` / ``group_size``: ring (§4.1) or hierarchical all-reduce with
  groups of k (§4.2), see :mod:`ada_loss.communication.summation`.
* ``kahan``: Kahan summation in the low precision (§5.1.1).
* ``fp32_layers``: parameters kept in FP32 (Table 7: the last classification
  layer), as ``fnmatch`` patterns on Chainer parameter names
  (``/predictor/fc/*``).
* ``fp32_epochs``: the hybrid schedule of Tables 6–7 and Fig. 10: every layer
  in FP32 for the first E epochs, then ``fmt``.
"""
import fnmatch

from ada_loss.communication.summation import ORDERS, check_order
from ada_loss.formats import get_format


class CommPolicy(object):
    """The precision of gradient communication (module docstring).

    Raises:
        ValueError: unknown format or order, a bad group size, a negative
            ``fp32_epochs`` (all checked at construction; the worker count
            by :meth:`check`).
    """

    def __init__(self, fmt='e5m2', aps=True, order='ring', group_size=None,
                 kahan=False, fp32_layers=(), fp32_epochs=0):
        self.format = get_format(fmt)          # ValueError naming the formats
        if order not in ORDERS:
            raise ValueError('unknown reduction order {!r}; expected one of '
                             '{}'.format(order, ', '.join(ORDERS)))
        if order == 'ring' and group_size is not None:
            check_order(order, group_size, 1)  # raises the ring message
        self.aps = bool(aps)
        self.order = order
        self.group_size = None if group_size is None else int(group_size)
        self.kahan = bool(kahan)
        if isinstance(fp32_layers, str):
            fp32_layers = [fp32_layers]
        self.fp32_layers = tuple(fp32_layers)
        if fp32_epochs < 0:
            raise ValueError('fp32_epochs must be >= 0, got {!r}'.format(
                fp32_epochs))
        self.fp32_epochs = fp32_epochs
        if order == 'hierarchical':
            if self.group_size is None or self.group_size < 1:
                raise ValueError("order='hierarchical' needs group_size, a "
                                 "positive integer; got {!r}".format(group_size))

    def check(self, n_workers):
        """Raises ValueError if ``n_workers`` cannot use this policy (not
        divisible by the group size)."""
        check_order(self.order, self.group_size, n_workers)

    @property
    def fmt(self):
        return self.format.name

    def is_fp32_layer(self, name):
        return any(fnmatch.fnmatchcase(name, pat) for pat in self.fp32_layers)

    def low_precision_mask(self, names, epoch=0.0):
        """Per parameter name: True where it goes in ``fmt``."""
        if self.format.is_float32 and not self.aps:
            return [False] * len(names)
        if epoch < self.fp32_epochs:
            return [False] * len(names)
        return [not self.is_fp32_layer(n) for n in names]

    def describe(self):
        parts = [self.fmt, 'APS' if self.aps else 'no APS']
        parts.append(self.order if self.group_size is None else
                     'hierarchical k={}'.format(self.group_size))
        if self.kahan:
            parts.append('Kahan')
        if self.fp32_layers:
            parts.append('FP32: ' + ','.join(self.fp32_layers))
        if self.fp32_epochs:
            parts.append('FP32 for {} epochs'.format(self.fp32_epochs))
        return ', '.join(parts)

    def __repr__(self):
        return 'CommPolicy({})'.format(self.describe())
