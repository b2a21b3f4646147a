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

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fbat_tf.catalog import counts
from fbat_tf.lazy import later
from fbat_tf.methods.base import Method, fgsm_step
from fbat_tf.methods.declarations import Entry, Option, defaults

if TYPE_CHECKING:
    import keras

tf = later("tensorflow")
constraints = later("fbat_tf.constraints")


OPTIONS = (
    Option("steps", int, 2, "PGD-AT attack steps K.", "attack_steps", lower_bound=1),
    Option(
        "step",
        float,
        None,
        "PGD-AT step alpha as a multiple of eps (default 0.5 for K <= 2; 2/255 "
        "itself for larger K).",
        lower_bound=0.0,
    ),
)
_DEFAULT = defaults(OPTIONS)


class PGDAT(Method):
    name = "pgd"
    norms = ("linf", "l2")

    @staticmethod
    def check_options(*, steps: int, step: float | None) -> None:
        if steps < 1:
            raise ValueError(f"pgd needs steps >= 1, got {steps!r}")
        if step is not None and not step > 0:
            raise ValueError(f"pgd step (a multiple of eps) must be > 0, got {step!r}")

    def __init__(
        self,
        eps: float,
        steps: int = _DEFAULT["steps"],
        step: float | None = _DEFAULT["step"],
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


def _pgd_passes(config: Mapping[str, Any]) -> dict[str, int]:
    steps = int(config.get("steps", _DEFAULT["steps"]))
    return counts(steps + 1, steps + 1)


ENTRY = Entry(PGDAT, OPTIONS, passes=_pgd_passes, cost_options={"steps": 2})
