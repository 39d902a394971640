"""Number formats: their ranges and rounding (NumPy only, no Chainer/SciPy).

* :func:`get_format` / :class:`FloatFormat`: float32, float16, bfloat16, OCP
  FP8 (E4M3, E5M2), FP6/FP4, and any IEEE-style ``e<E>m<M>``, each with
  ``u_min``, ``u_max`` and ``quantize``; :func:`canonical_format`: the one
  object (and name) of a format's numbers, for canonical texts.
* :func:`quantize_mx`: MX block scaling (OCP MX v1.0; TE's
  ``MXFP8BlockScaling`` scale rule), dequantized values.
* :func:`quantize_nvfp4`: NVFP4 (E2M1, E4M3 scales per 16 values or
  16×16 tile, FP32 tensor scale; TE's reference arithmetic), optionally
  with stochastic rounding from a counter-based stream
  (:func:`random_words`); :func:`random_hadamard`: its 16-point RHT.
* :func:`quantize_blockwise`: block-scaled FP8 (1×128 / 128×128, FP32
  scales; TE's ``Float8BlockScaling``).
* :func:`quantize_per_tensor`, :func:`current_scale`,
  :class:`DelayedScaling`: Transformer Engine's per-tensor FP8 scaling.
* :func:`make_recipe` / :class:`GemmRecipe`: a scaled GEMM recipe
  (per-tensor current or delayed, MX) and its per-layer state
  (:class:`GemmScaling`).
* :func:`widen`: exact float16 → float32, fast on NumPy
  (:func:`widen_summable`: the same values, reduced by NumPy exactly as it
  reduces the float16 array).
* :func:`narrow`: float32 → float16, bit for bit NumPy's cast, fast.
"""
from ada_loss.formats.float_format import (  # NOQA
    OVERFLOW_POLICIES, FloatFormat, canonical_format, get_format)
from ada_loss.formats.mx import (  # NOQA
    SCALE_ROUNDINGS, mx_scale_exponents, quantize_mx)
from ada_loss.formats.blockwise import quantize_blockwise  # NOQA
from ada_loss.formats.counter_rng import random_words  # NOQA
from ada_loss.formats.hadamard import (  # NOQA
    hadamard_matrix, random_hadamard)
from ada_loss.formats.narrow import narrow  # NOQA
from ada_loss.formats.nvfp4 import quantize_nvfp4  # NOQA
from ada_loss.formats.per_tensor import (  # NOQA
    DEFAULT_HISTORY, DEFAULT_MARGIN, DelayedScaling, current_scale,
    delayed_scale, quantize_per_tensor, quantize_with_scale)
from ada_loss.formats.recipe import (  # NOQA
    GemmRecipe, GemmScaling, make_recipe)
from ada_loss.formats.widen import widen, widen_summable  # NOQA
