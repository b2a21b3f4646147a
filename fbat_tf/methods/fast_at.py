"""Fast-AT (Wong et al., 2020): FGSM from a uniform random start, α = 1.25ε.

method = methods.create("fastat", eps=8 / 255)
"""

from __future__ import annotations

import keras
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.methods.base import Method, fgsm_step


class FastAT(Method):
    name = "fastat"
    title = "Fast-AT"

    def __init__(self, eps: float, alpha: float | None = None):
        super().__init__(eps)
        self.alpha = 1.25 * self.eps if alpha is None else float(alpha)

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        delta = constraints.random_init(x, self.eps, seed)
        delta = fgsm_step(model, x, delta, y, self.eps, self.alpha, loss_scale)
        return x + delta

    def config(self) -> dict:
        return {**super().config(), "alpha": self.alpha}
