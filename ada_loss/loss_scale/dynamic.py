"""Backoff dynamic loss scaling (Kuchaiev et al., 2018; seeds 002/003).

The state machine only: the scale is multiplied by ``backoff_factor`` after a
step whose gradients contain Inf/NaN (that step is skipped), and by
``growth_factor`` after ``growth_interval`` consecutive clean steps.

Defaults follow PyTorch's GradScaler / TensorFlow's dynamic loss-scale manager:
initial scale 2^16, growth ×2 every 2000 clean steps, backoff ×0.5.
"""
import math


class DynamicLossScale(object):
    """Backoff dynamic loss scale.

    Args:
        init_scale (float): initial scale (default 2^16).
        growth_factor (float): > 1 (default 2).
        backoff_factor (float): in (0, 1) (default 0.5).
        growth_interval (int): clean steps before growing (default 2000).
        min_scale, max_scale (float): clamp (default 2^-24 .. 2^24).
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000,
                 min_scale=2.0 ** -24, max_scale=2.0 ** 24):
        if not (init_scale > 0 and math.isfinite(init_scale)):
            raise ValueError('init_scale must be a positive finite number, '
                             'got {!r}'.format(init_scale))
        if not (growth_factor > 1 and math.isfinite(growth_factor)):
            # an infinite factor would make every later step overflow
            raise ValueError('growth_factor must be a finite number > 1, '
                             'got {!r}'.format(growth_factor))
        if not 0 < backoff_factor < 1:
            raise ValueError('backoff_factor must be in (0, 1), got {!r}'
                             .format(backoff_factor))
        if int(growth_interval) != growth_interval or growth_interval < 1:
            raise ValueError('growth_interval must be a positive integer, '
                             'got {!r}'.format(growth_interval))
        self.scale = float(init_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)
        self.clean_steps = 0

    def update(self, found_nonfinite):
        """Advances the state after one step; returns the new scale."""
        if found_nonfinite:
            self.scale = max(self.min_scale, self.scale * self.backoff_factor)
            self.clean_steps = 0
        else:
            self.clean_steps += 1
            if self.clean_steps >= self.growth_interval:
                self.scale = min(self.max_scale,
                                 self.scale * self.growth_factor)
                self.clean_steps = 0
        return self.scale

    def state_dict(self):
        return {'scale': self.scale, 'clean_steps': self.clean_steps}

    def load_state_dict(self, state):
        self.scale = float(state['scale'])
        self.clean_steps = int(state['clean_steps'])
