"""Gradient statistics behind the paper's Figures 1 and 4 and the σ_max
comparison of §4.2: a recorder installed only on recorded iterations, the
records (CSV/JSON) and the plots."""
from ada_loss.analysis.grad_stats import (  # NOQA
    FP16_TINY, expected_loss_scale, kth_smallest_nonzero, underflow_rate,
    zero_fraction)
from ada_loss.analysis.recorder import (  # NOQA
    FIELDS, GradientRecorder, RecordingLossScaling, load_csv, summarize)
from ada_loss.analysis.plots import (  # NOQA
    plot_fig1, plot_fig4a, plot_fig4b, sigma_max_ratio, underflow_delta)
