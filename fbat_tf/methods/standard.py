"""Standard (non-adversarial) training: the clean cross-entropy.

method = methods.create("standard")
grads, logs = method.gradients(model, x, y, seed)   # logs["adv_accuracy"] is clean accuracy
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fbat_tf.methods.base import Method
from fbat_tf.methods.declarations import Entry

if TYPE_CHECKING:
    import keras
    import tensorflow as tf


class Standard(Method):
    name = "standard"
    title = "standard training"
    # No perturbation to train on: the norm is that of its validation and test.
    norms = ("linf", "l2")
    adversarial = False

    def __init__(self, eps: float = 0.0, norm: str = "linf"):
        super().__init__(eps, norm)

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        return x


ENTRY = Entry(Standard)
