"""Fast-AT with GradAlign (Andriushchenko & Flammarion, 2020): FGSM from δ0 = 0 with α = 1.25ε,
plus a penalty on the misalignment of input gradients at x and at a random x + η:

    loss = (1/B) Σ_i CE_i(x + δ) + ga_coef · (1 − mean_i cos(∇x CE_i(x), ∇x CE_i(x + η)))

The second gradient is differentiated through (double backprop); the first is a constant.

    method = methods.create("fastat_ga", eps=8 / 255)     # ga_coef 0.2 at 8/255, 2.0 at 16/255
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fbat_tf.catalog import counts
from fbat_tf.lazy import later
from fbat_tf.methods.base import Method, fgsm_step, input_gradient, per_example_scale, scaled
from fbat_tf.methods.declarations import Entry, Option, defaults

if TYPE_CHECKING:
    import keras

tf = later("tensorflow")
losses = later("fbat_tf.attacks.losses")
constraints = later("fbat_tf.constraints")


def default_ga_coef(eps: float) -> float:
    """0.2 at ε ≤ 8/255 and 2.0 at ε ≥ 16/255 (the GradAlign authors' values), geometric between."""
    low, high = 8.0 / 255, 16.0 / 255
    if eps <= low:
        return 0.2
    if eps >= high:
        return 2.0
    return 0.2 * math.pow(10.0, (eps - low) / (high - low))


OPTIONS = (
    Option(
        "ga_coef",
        float,
        None,
        "GradAlign coefficient (default 0.2 at eps <= 8, 2.0 at eps >= 16).",
        "ga_coef",
        lower_bound=0.0,
    ),
)
_DEFAULT = defaults(OPTIONS)


class FastATGradAlign(Method):
    name = "fastat_ga"

    @staticmethod
    def check_options(*, ga_coef: float | None) -> None:
        if ga_coef is not None and float(ga_coef) < 0:
            raise ValueError(f"ga_coef must be >= 0, got {ga_coef!r}")

    title = "Fast-AT with GradAlign"
    second_order = True
    log_names = ("loss", "adv_accuracy", "ga_cosine", "ga_coef")

    def __init__(
        self,
        eps: float,
        ga_coef: float | None = _DEFAULT["ga_coef"],
        alpha: float | None = None,
    ):
        super().__init__(eps)
        self.check_options(ga_coef=ga_coef)
        self.ga_coef = default_ga_coef(self.eps) if ga_coef is None else float(ga_coef)
        self.alpha = 1.25 * self.eps if alpha is None else float(alpha)

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        delta = fgsm_step(model, x, tf.zeros_like(x), y, self.eps, self.alpha, loss_scale)
        return x + delta

    def gradients(self, model: keras.Model, x, y, seed, loss_scale=None):
        x_adv = tf.stop_gradient(self.perturb(model, x, y, seed, loss_scale))
        grad_clean = tf.stop_gradient(input_gradient(model, x, tf.zeros_like(x), y, loss_scale))
        eta = constraints.random_init(x, self.eps, seed)
        with tf.GradientTape() as tape:
            # ∇x CE(x + η), recorded so that its θ-dependence is differentiated (double backprop).
            with tf.GradientTape(watch_accessed_variables=False) as inner:
                inner.watch(eta)
                noisy_loss = tf.reduce_sum(losses.cross_entropy(model(x + eta, training=True), y))
                # The cosine ignores the scale; scaling only keeps 16-bit gradients from underflow.
                noisy_loss = scaled(noisy_loss, per_example_scale(loss_scale, x))
            grad_noisy = inner.gradient(noisy_loss, eta)
            alignment = tf.reduce_mean(losses.cosine_per_example(grad_clean, grad_noisy))
            logits = model(x_adv, training=True)
            ce = tf.reduce_mean(losses.cross_entropy(logits, y))
            ga_term = self.ga_coef * (1.0 - tf.cast(alignment, ce.dtype))
            loss = ce + ga_term
            objective = scaled(loss, loss_scale)
        grads = tape.gradient(objective, model.trainable_variables)
        logs = {
            "loss": loss,
            "adv_accuracy": tf.reduce_mean(losses.correct(logits, y)),
            "ga_cosine": alignment,
            "ga_coef": tf.constant(self.ga_coef, tf.float32),
        }
        return grads, logs

    def config(self) -> dict:
        return {**super().config(), "ga_coef": self.ga_coef, "alpha": self.alpha}


# FGSM's, the clean and the noisy (recorded over θ) input gradients and the weight
# pass, which also runs back through the noisy gradient and its forward.
ENTRY = Entry(FastATGradAlign, OPTIONS, passes=lambda c: counts(4, 5, 1))
