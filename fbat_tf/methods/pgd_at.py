"""PGD-K adversarial training (Madry et al., 2018) with a random start and signed steps.

method = methods.create("pgd", eps=8 / 255, steps=10)   # α = 2/255 for K > 2, ε/2 otherwise
"""

from __future__ import annotations

import keras
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.methods.base import Method, fgsm_step


class PGDAT(Method):
    name = "pgd"

    def __init__(self, eps: float, steps: int = 2, alpha: float | None = None):
        super().__init__(eps)
        if steps < 1:
            raise ValueError(f"pgd needs steps >= 1, got {steps!r}")
        self.steps = int(steps)
        if alpha is None:
            alpha = self.eps / 2 if self.steps <= 2 else 2.0 / 255
        self.alpha = float(alpha)

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        delta = constraints.random_init(x, self.eps, seed)
        for _ in range(self.steps):
            delta = fgsm_step(model, x, delta, y, self.eps, self.alpha, loss_scale)
        return x + delta

    def config(self) -> dict:
        return {**super().config(), "steps": self.steps, "alpha": self.alpha}
