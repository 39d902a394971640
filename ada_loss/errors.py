"""Errors that more than one layer raises or catches.

:class:`NonFiniteGradientError` is raised by the training updaters
(:mod:`ada_loss.training.updater`, the APS simulator) and caught by the
experiment harness; the loss-scaling methods (:mod:`ada_loss.scaling`) decide
whether it is raised (``LossScaling.recovers``). It lives here, below all of
them, so that none has to import another for it.
"""


class NonFiniteGradientError(FloatingPointError):
    """Inf/NaN gradients in a mode that cannot recover by skipping."""
