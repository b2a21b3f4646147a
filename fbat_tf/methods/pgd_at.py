"""PGD-K adversarial training (Madry et al., 2018) with a random start and signed steps.

method = methods.create("pgd", eps=8 / 255, steps=10)   # α = 2/255 for K > 2, ε/2 otherwise
method = methods.create("pgd", eps=8 / 255, step=0.25)  # α = ε/4 (a multiple of ε)
method = methods.create("pgd", eps=0.5, norm="l2")      # L2: steps along ∇/‖∇‖₂, α = ε/2

Under the L2 norm the random start is uniform in the ball, each step moves α along the gradient
normalized per example and is projected exactly onto the L2 ball ∩ box (constraints.py). The
default α for K > 2 is then 2.5ε/K (the rule of Madry et al.'s `robustness` library; L∞'s
2/255 is a pixel step, meaningless for an L2 ball); for K ≤ 2 it is ε/2 under both norms.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from fbat_tf import constraints, methods
from fbat_tf.methods import rules
from fbat_tf.methods.base import Method, fgsm_step


class PGDAT(rules.PGDAT, Method):
    def __init__(
        self,
        eps: float,
        steps: int = methods.defaults("pgd")["steps"],
        step: float | None = methods.defaults("pgd")["step"],
        norm: str = "linf",
    ):
        super().__init__(eps, norm)
        self.check_options(steps=steps, step=step)
        self.steps = int(steps)
        self.title = f"PGD-{self.steps}-AT"
        if step is None and self.steps <= 2:
            self.alpha = self.eps / 2
        elif step is None:
            self.alpha = 2.0 / 255 if self.norm == "linf" else 2.5 * self.eps / self.steps
        else:
            self.alpha = float(step) * self.eps
        self.step = step

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        def ascend(step: tf.Tensor, delta: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            delta = fgsm_step(model, x, delta, y, self.eps, self.alpha, loss_scale, self.norm)
            return step + 1, tf.ensure_shape(delta, x.shape)

        # A graph loop: the step's graph holds one attack step whatever K is.
        start = constraints.random_init(x, self.eps, seed, self.norm)
        _, delta = tf.while_loop(lambda step, _: step < self.steps, ascend, (tf.constant(0), start))
        return x + delta

    def config(self) -> dict:
        return {**super().config(), "steps": self.steps, "step": self.step, "alpha": self.alpha}
