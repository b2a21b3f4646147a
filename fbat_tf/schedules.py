"""Learning-rate schedules stepped every optimizer iteration, and SGD whose momentum cycles.

lr = Cyclic(lr_max=0.2, total_steps=20 * steps_per_epoch)   # 0 -> 0.2 at the middle -> 0
optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=0.9)
optimizer = CyclicMomentumSGD(lr, momentum=0.9, momentum_at_peak=0.8)   # 0.9 -> 0.8 -> 0.9
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="fbat_tf")
class Cyclic(keras.optimizers.schedules.LearningRateSchedule):
    """Triangular schedule: linear 0 -> lr_max over the first `peak_fraction` of the steps, then
    linear back to 0 at `total_steps` (and 0 after)."""

    def __init__(self, lr_max: float, total_steps: int, peak_fraction: float = 0.5):
        if total_steps < 1 or not 0 < peak_fraction < 1 or lr_max < 0:
            raise ValueError(
                f"need total_steps >= 1, 0 < peak_fraction < 1, lr_max >= 0; got "
                f"{total_steps!r}, {peak_fraction!r}, {lr_max!r}"
            )
        self.lr_max = float(lr_max)
        self.total_steps = int(total_steps)
        self.peak_fraction = float(peak_fraction)

    def __call__(self, step):
        t = tf.cast(step, tf.float32) / float(self.total_steps)
        p = self.peak_fraction
        up = t / p
        down = (1.0 - t) / (1.0 - p)
        return self.lr_max * tf.clip_by_value(tf.minimum(up, down), 0.0, 1.0)

    def get_config(self):
        return {
            "lr_max": self.lr_max,
            "total_steps": self.total_steps,
            "peak_fraction": self.peak_fraction,
        }


@keras.saving.register_keras_serializable(package="fbat_tf")
class CyclicMomentumSGD(keras.optimizers.SGD):
    """SGD whose momentum moves inversely to a cyclic learning rate, as PyTorch's CyclicLR does
    by default (cycle_momentum with base 0.8 and max 0.9, which the paper's released trainer
    uses): at step t, μ(t) = μ − (μ − μ_peak)·lr(t)/lr_max, so μ at lr 0 and μ_peak at the
    peak. The update is Keras' (v ← μ(t)·v − lr(t)·g; θ ← θ + v); PyTorch's keeps lr out of
    the buffer (θ ← θ − lr(t)·b, b ← μ(t)·b + g), which is the same up to the ratio
    lr(t)/lr(t−1) on the past velocity: below 1% after the first 100 steps of the ramp."""

    def __init__(
        self, learning_rate: Cyclic, momentum: float = 0.9, momentum_at_peak: float = 0.8, **kwargs
    ):
        if not isinstance(learning_rate, Cyclic):
            raise ValueError(
                "a cycling momentum follows the cyclic learning rate (--lr_schedule="
                f"cyclic), got {learning_rate!r}"
            )
        if not 0 <= momentum_at_peak <= 1 or not 0 < momentum <= 1:
            raise ValueError(
                f"need 0 < momentum <= 1 and 0 <= momentum_at_peak <= 1, got {momentum!r}, "
                f"{momentum_at_peak!r}"
            )
        if kwargs.get("nesterov"):
            raise ValueError("CyclicMomentumSGD takes no Nesterov momentum")
        super().__init__(learning_rate=learning_rate, momentum=momentum, **kwargs)
        self.momentum_at_peak = float(momentum_at_peak)
        self.lr_max = learning_rate.lr_max

    def momentum_at(self, learning_rate):
        """μ for this learning rate: linear in it, μ at 0 and μ_peak at lr_max."""
        fraction = learning_rate / self.lr_max if self.lr_max else 0.0 * learning_rate
        return self.momentum - (self.momentum - self.momentum_at_peak) * fraction

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = keras.ops.cast(learning_rate, variable.dtype)
        gradient = keras.ops.cast(gradient, variable.dtype)
        # The velocity SGD.build made for this variable, found as SGD.update_step finds it (a
        # private Keras helper: tests/test_schedules.py fails if it changes).
        velocity = self.momentums[self._get_variable_index(variable)]
        momentum = keras.ops.cast(self.momentum_at(learning_rate), variable.dtype)
        self.assign(velocity, velocity * momentum - gradient * learning_rate)
        self.assign_add(variable, velocity)

    def get_config(self):
        return {**super().get_config(), "momentum_at_peak": self.momentum_at_peak}


def piecewise(
    lr_max: float,
    total_steps: int,
    boundaries: tuple[float, ...] = (0.5, 0.75),
    decay: float = 0.1,
) -> keras.optimizers.schedules.PiecewiseConstantDecay:
    """lr_max, multiplied by `decay` from each of the given fractions of the total steps on
    (default: ×0.1 at 50% and at 75%, the usual multi-step schedule of PGD-AT), as Keras'
    PiecewiseConstantDecay (whose value at a boundary step is still the earlier one)."""
    if total_steps < 1 or lr_max < 0:
        raise ValueError(f"need total_steps >= 1 and lr_max >= 0, got {total_steps!r}")
    steps = [math.ceil(b * total_steps) - 1 for b in boundaries]
    values = [float(lr_max) * float(decay) ** i for i in range(len(steps) + 1)]
    return keras.optimizers.schedules.PiecewiseConstantDecay(steps, values)


def create(
    name: str, lr_max: float, total_steps: int
) -> keras.optimizers.schedules.LearningRateSchedule:
    if name == "cyclic":
        return Cyclic(lr_max, total_steps)
    if name == "piecewise":
        return piecewise(lr_max, total_steps)
    raise ValueError(f"unknown lr schedule {name!r}; choose 'cyclic' or 'piecewise'")
