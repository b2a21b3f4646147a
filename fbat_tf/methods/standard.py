"""Standard (non-adversarial) training: the clean cross-entropy.

method = methods.create("standard")
grads, logs = method.gradients(model, x, y, seed)   # logs["adv_accuracy"] is clean accuracy
"""

from __future__ import annotations

import keras
import tensorflow as tf

from fbat_tf.methods import rules
from fbat_tf.methods.base import Method


class Standard(rules.Standard, Method):
    title = "standard training"
    adversarial = False

    def __init__(self, eps: float = 0.0, norm: str = "linf"):
        super().__init__(eps, norm)

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        return x
