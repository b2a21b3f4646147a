"""Learning-rate schedules stepped every optimizer iteration.

lr = cyclic(lr_max=0.2, total_steps=20 * steps_per_epoch)   # 0 -> 0.2 at the middle -> 0
optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=0.9)
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
