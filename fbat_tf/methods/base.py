"""What every training method shares: the interface and the input/weight gradients.

A method turns one batch into the gradient of its training objective:

    grads, logs = method.gradients(model, x, y, seed)      # grads ~ model.trainable_variables

`seed` is an int32 tensor of shape [2]; all randomness of the step comes from it. Under a
loss-scaled optimizer the trainer passes `loss_scale=s`: the returned weight gradients are then
those of s·loss (the optimizer unscales them), while input gradients are divided by their scale
again before they move δ, so the attack is the same as without scaling. The optimizer tunes s
on the weight pass, whose loss is a batch mean; the attack losses are per-example sums, B times
larger, so they are scaled by s/B (`per_example_scale`) to keep their float16 cotangents as far
from overflow as the weight pass's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fbat_tf.lazy import later
from fbat_tf.methods import rules

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from fbat_tf.methods.declarations import Entry

    Gradients = list[tf.Tensor]
    Logs = dict[str, tf.Tensor]

tf = later("tensorflow")
losses = later("fbat_tf.attacks.losses")
constraints = later("fbat_tf.constraints")


def scaled(loss: tf.Tensor, loss_scale: tf.Tensor | None) -> tf.Tensor:
    """s·loss, or the loss itself without a loss scale."""
    if loss_scale is None:
        return loss
    return loss * tf.cast(loss_scale, loss.dtype)


def unscaled(grad: tf.Tensor, loss_scale: tf.Tensor | None) -> tf.Tensor:
    if loss_scale is None:
        return grad
    return grad / tf.cast(loss_scale, grad.dtype)


def per_example_scale(loss_scale: tf.Tensor | None, x: tf.Tensor) -> tf.Tensor | None:
    """The loss scale for a sum over the batch of x: s/B for the weight pass's s."""
    if loss_scale is None:
        return None
    return tf.cast(loss_scale, tf.float32) / tf.cast(tf.shape(x)[0], tf.float32)


def input_gradient(
    model: keras.Model,
    x: tf.Tensor,
    delta: tf.Tensor,
    y: tf.Tensor,
    loss_scale: tf.Tensor | None = None,
) -> tf.Tensor:
    """∇δ Σ_i CE_i(θ, x + δ), the training-time attack direction (batch-norm in train mode).

    The tape watches δ only, so no weight gradient is recorded or computed.
    """
    loss_scale = per_example_scale(loss_scale, x)
    _, grad = losses.input_gradient(
        lambda delta: losses.cross_entropy(model(x + delta, training=True), y), delta, loss_scale
    )
    return grad


def train_on(
    model: keras.Model, x_train: tf.Tensor, y: tf.Tensor, loss_scale: tf.Tensor | None
) -> tuple[Gradients, Logs]:
    """∇θ (1/B) Σ_i CE_i(θ, x_train): the upper-level step shared by the one-level methods."""
    with tf.GradientTape() as tape:
        logits = model(x_train, training=True)
        loss = tf.reduce_mean(losses.cross_entropy(logits, y))
        objective = scaled(loss, loss_scale)
    grads = tape.gradient(objective, model.trainable_variables)
    return grads, {"loss": loss, "adv_accuracy": tf.reduce_mean(losses.correct(logits, y))}


class Method(rules.Rules):
    """Base class: a method with a perturbation budget ε (pixel units). Its name, the threat
    models it has a form for and whether it runs on one device only are its rules' (rules.py),
    which also say what its constructor refuses."""

    #: optimizer steps the trainer takes per batch (Free-AT replays a batch m times).
    replays: int = 1
    #: whether the gradient differentiates an input gradient again (Fast-BAT, GradAlign).
    second_order: bool = False
    #: keys of the logs dict that `gradients` returns (the trainer averages them per epoch).
    log_names: tuple[str, ...] = ("loss", "adv_accuracy")
    #: how reports and model cards name the method ("Fast-AT", "first-order Fast-BAT").
    title: str = ""
    #: whether it trains on perturbed inputs: its `adv_accuracy` is then on them, and the
    #: progress line and TensorBoard call it so; standard training's is clean accuracy.
    adversarial: bool = True
    #: whether it keeps state per training example (FGSM-PGI's prior): `gradients` then takes
    #: the batch's example indices (`indices=`, positions in the training split), the trainer
    #: reads them from its training stream, and `commit` writes the step's rows.
    per_example_state: bool = False
    #: its declaration (options, passes, cost), set where its module declares it (Entry).
    entry: Entry

    def __init__(self, eps: float, norm: str = "linf"):
        self.norm = self.check_norm(norm)
        self.check_eps(eps, norm)
        self.eps = float(eps)

    def build(
        self, batch_shape: tuple[int, ...], dtype: Any = "float32", examples: int | None = None
    ) -> None:
        """Create per-run state (Free-AT's δ, ELLE-A's λ, FGSM-PGI's prior); called once before
        training. `examples`: the training split's size, for state per example (default: the
        batch's, whose positions are then the examples)."""

    def variables(self) -> dict[str, tf.Variable]:
        """The state `build` created, by name, for checkpoints."""
        return {}

    def step_state(self) -> list[tf.Variable]:
        """The state a step writes before it is known to be applied, which the trainer checks
        for finiteness and puts back with a skipped step: all of `variables()`, but for state
        per example, which only `commit` writes (its step's rows wait in batch-sized
        variables, which are these)."""
        return list(self.variables().values())

    def commit(self) -> None:
        """Write the rows of per-example state the last `gradients` computed (FGSM-PGI's prior);
        the trainer calls it once the step is applied, outside XLA."""

    def after_gradients(self, logs: Logs) -> None:
        """Update per-run state from a step's logs (ELLE-A's λ). The trainer calls it in the
        replica context right after `gradients`, outside XLA and before the step's finiteness
        check, so a skipped step puts this state back with the rest."""

    def perturb(
        self,
        model: keras.Model,
        x: tf.Tensor,
        y: tf.Tensor,
        seed: tf.Tensor,
        loss_scale: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """The training-time adversarial example x + δ, δ ∈ C (a constant)."""
        raise NotImplementedError

    def gradients(
        self,
        model: keras.Model,
        x: tf.Tensor,
        y: tf.Tensor,
        seed: tf.Tensor,
        loss_scale: tf.Tensor | None = None,
    ) -> tuple[Gradients, Logs]:
        x_adv = tf.stop_gradient(self.perturb(model, x, y, seed, loss_scale))
        return train_on(model, x_adv, y, loss_scale)

    @property
    def cost_variant(self) -> str:
        """The method with the options that change what a step costs, as bench/step_time.py
        names its variants ("fastbat ig=none"): a sweep report prices a run by it. The options
        are those its registry entry names, read from the method's attributes of those names."""
        options = self.entry.cost_options
        return self.entry.cost_variant({name: getattr(self, name) for name in options})

    @property
    def passes(self) -> dict[str, int]:
        """Passes through the model of one optimizer step, by kind, as its entry declares."""
        return self.entry.passes(self.config())

    def config(self) -> dict[str, Any]:
        """Hyper-parameters, for logs and model cards."""
        return {
            "name": self.name,
            "title": self.title or self.name,
            "cost_variant": self.cost_variant,
            "eps": self.eps,
            "norm": self.norm,
        }


def fgsm_step(
    model: keras.Model,
    x: tf.Tensor,
    delta: tf.Tensor,
    y: tf.Tensor,
    eps: float,
    step_size: float,
    loss_scale: tf.Tensor | None = None,
    norm: str = "linf",
) -> tf.Tensor:
    """δ ← P_C(δ + α·sign(∇δ Σ CE)): one signed ascent step, shared by FGSM and PGD; under
    the L2 norm the step is along the gradient normalized per example, and P_C the exact
    projection onto the L2 ball ∩ box (constraints.py)."""
    grad = input_gradient(model, x, delta, y, loss_scale)
    moved = delta + step_size * constraints.normalized(grad, norm)
    return constraints.project(moved, x, eps, norm)
