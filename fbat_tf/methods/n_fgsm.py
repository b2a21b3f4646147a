"""N-FGSM (de Jorge et al., "Make Some Noise: Reliable and Efficient Single-Step Adversarial
Training", NeurIPS 2022): one signed step of α = ε from a noisy point, and no projection back
onto the ε-ball.

    η ~ U[−kε, kε]^d, clipped so that x + η ∈ [0, 1]          (k = noise, 2 by default)
    δ = η + α·sign(∇η Σ_i CE_i(x + η)),  x + δ clipped to [0, 1]

The training point lies up to (k + 1)·ε from x: the noise, larger than the ε-ball, is what keeps
single-step training from catastrophic overfitting at Fast-AT's cost. `clip=c` clips δ to
[−cε, cε] after the box, as the released trainer's `--clip` does (off by default, as there).

    method = methods.create("nfgsm", eps=8 / 255)             # k = 2, α = ε, no clip
    method = methods.create("nfgsm", eps=12 / 255, noise=3, step=8 / 12)   # k = 3, α = 8/255
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fbat_tf.catalog import counts
from fbat_tf.lazy import later
from fbat_tf.methods.base import Method, input_gradient
from fbat_tf.methods.declarations import Entry, Option, defaults

if TYPE_CHECKING:
    import keras

tf = later("tensorflow")
constraints = later("fbat_tf.constraints")


OPTIONS = (
    Option(
        "noise",
        float,
        2.0,
        "N-FGSM noise: eta ~ U[-k*eps, k*eps] for this k.",
        lower_bound=0.0,
    ),
    Option(
        "step",
        float,
        1.0,
        "N-FGSM signed step alpha as a multiple of eps (the paper's 1).",
        lower_bound=0.0,
    ),
    Option(
        "clip",
        float,
        None,
        "N-FGSM: clip the perturbation to [-c*eps, c*eps] for this c (default: no "
        "clip, as the paper trains).",
        lower_bound=0.0,
    ),
)
_DEFAULT = defaults(OPTIONS)


class NFGSM(Method):
    name = "nfgsm"

    @staticmethod
    def check_options(*, noise: float, step: float, clip: float | None) -> None:
        if not noise >= 0:
            raise ValueError(f"nfgsm noise (a multiple of eps) must be >= 0, got {noise!r}")
        if clip is not None and not clip > 0:
            raise ValueError(f"nfgsm clip (a multiple of eps) must be > 0, got {clip!r}")
        if not step > 0:
            raise ValueError(f"nfgsm step (a multiple of eps) must be > 0, got {step!r}")

    title = "N-FGSM"

    def __init__(
        self,
        eps: float,
        noise: float = _DEFAULT["noise"],
        step: float = _DEFAULT["step"],
        clip: float | None = _DEFAULT["clip"],
    ):
        super().__init__(eps)
        self.check_options(noise=noise, step=step, clip=clip)
        self.noise = float(noise)
        self.step = float(step)
        self.alpha = self.step * self.eps
        self.clip = None if clip is None else float(clip)

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        # The project's one projection: onto the box alone (a ball of radius 1 holds it), or
        # onto the ball of radius c·ε with `clip` (the box clip, then the ball's, as the
        # released trainer applies them, is the one clip to their intersection).
        box = 1.0
        eta = constraints.project(constraints.uniform_noise(x, self.noise * self.eps, seed), x, box)
        grad = input_gradient(model, x, eta, y, loss_scale)
        bound = box if self.clip is None else self.clip * self.eps
        return x + constraints.project(eta + self.alpha * tf.sign(grad), x, bound)

    def config(self) -> dict:
        return {
            **super().config(),
            "noise": self.noise,
            "step": self.step,
            "alpha": self.alpha,
            "clip": self.clip,
        }


ENTRY = Entry(NFGSM, OPTIONS, passes=lambda c: counts(2, 2))
