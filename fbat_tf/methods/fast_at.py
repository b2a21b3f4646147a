"""Fast-AT (Wong et al., 2020): FGSM from a uniform random start, α = 1.25ε.

method = methods.create("fastat", eps=8 / 255)             # α = 1.25ε
method = methods.create("fastat", eps=16 / 255, step=1.0)  # α = ε
method = methods.create("fastat", eps=0.5, norm="l2")      # L2: one step along ∇/‖∇‖₂

The step is a multiple of ε: the paper's 1.25 holds at 8/255, and its authors advise a smaller
one where training overfits catastrophically at larger ε. Under the L2 norm the random start is
uniform in the L2 ball and the step, α along the gradient normalized per example, is projected
exactly onto the L2 ball ∩ box (constraints.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fbat_tf.catalog import counts
from fbat_tf.lazy import later
from fbat_tf.methods.base import Method, fgsm_step
from fbat_tf.methods.declarations import Entry, Option, defaults

if TYPE_CHECKING:
    import keras

tf = later("tensorflow")
constraints = later("fbat_tf.constraints")

OPTIONS = (
    Option(
        "step",
        float,
        1.25,
        "Fast-AT FGSM step alpha as a multiple of eps (the paper's 1.25).",
        lower_bound=0.0,
    ),
)
_DEFAULT = defaults(OPTIONS)


class FastAT(Method):
    name = "fastat"
    title = "Fast-AT"
    norms = ("linf", "l2")

    @staticmethod
    def check_options(*, step: float) -> None:
        if not step > 0:
            raise ValueError(f"fastat step (a multiple of eps) must be > 0, got {step!r}")

    def __init__(self, eps: float, step: float = _DEFAULT["step"], norm: str = "linf"):
        super().__init__(eps, norm)
        self.check_options(step=step)
        self.step = float(step)
        self.alpha = self.step * self.eps

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        delta = constraints.random_init(x, self.eps, seed, self.norm)
        delta = fgsm_step(model, x, delta, y, self.eps, self.alpha, loss_scale, self.norm)
        return x + delta

    def config(self) -> dict:
        return {**super().config(), "step": self.step, "alpha": self.alpha}


ENTRY = Entry(FastAT, OPTIONS, passes=lambda c: counts(2, 2))
