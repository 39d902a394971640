"""Adaptive loss scaling on Chainer graphs (paper §3, Algorithms 3–5)."""
from ada_loss.adaptive.ada_loss_scaled import AdaLossScaled  # NOQA
from ada_loss.adaptive.backward import (  # NOQA
    ScaleAwareBackwardError, ScaledBackprop)
from ada_loss.adaptive.amax_loss_scaled import AmaxLossScaled  # NOQA
