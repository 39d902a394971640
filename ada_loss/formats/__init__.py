"""Number formats: their ranges and rounding (NumPy only, no Chainer/SciPy).

* :func:`get_format` / :class:`FloatFormat`: float32, float16, bfloat16, OCP
  FP8 (E4M3, E5M2), FP6/FP4, and any IEEE-style ``e<E>m<M>``, each with
  ``u_min``, ``u_max`` and ``quantize``.
* :func:`widen`: exact float16 → float32, fast on NumPy
  (:func:`widen_summable`: the same values, reduced by NumPy exactly as it
  reduces the float16 array).
* :func:`narrow`: float32 → float16, bit for bit NumPy's cast, fast.
"""
from ada_loss.formats.float_format import (  # NOQA
    OVERFLOW_POLICIES, FloatFormat, get_format)
from ada_loss.formats.narrow import narrow  # NOQA
from ada_loss.formats.widen import widen, widen_summable  # NOQA
