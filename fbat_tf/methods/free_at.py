"""Free-AT (Shafahi et al., 2019): each batch is replayed m times; one backward pass gives both
the weight gradient and the ascent direction of δ, which carries over replays and batches.

    method = methods.create("free", eps=8 / 255, replays=8)
    method.build(batch_shape)          # δ state; the trainer calls this and steps m times a batch

train.py makes the number of gradient steps match the other methods': E epochs of S batches
become ceil(E·S/m) batches, each replayed m times (the last pass over the data stops early).
δ is checkpointed with the weights, so a resumed run carries it on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fbat_tf.catalog import counts
from fbat_tf.lazy import later
from fbat_tf.methods.base import Method, scaled, unscaled
from fbat_tf.methods.declarations import Entry, Option, defaults

if TYPE_CHECKING:
    import keras

tf = later("tensorflow")
losses = later("fbat_tf.attacks.losses")
constraints = later("fbat_tf.constraints")


OPTIONS = (Option("replays", int, 8, "Free-AT replays m.", "free_replays", lower_bound=1),)
_DEFAULT = defaults(OPTIONS)


class FreeAT(Method):
    name = "free"
    single_device = True

    @staticmethod
    def check_options(*, replays: int) -> None:
        if replays < 1:
            raise ValueError(f"free needs replays >= 1, got {replays!r}")

    title = "Free-AT"

    def __init__(
        self,
        eps: float,
        replays: int = _DEFAULT["replays"],
        alpha: float | None = None,
    ):
        super().__init__(eps)
        self.check_options(replays=replays)
        self.replays = int(replays)
        # The reference steps δ by ε with the sign of its gradient.
        self.alpha = self.eps if alpha is None else float(alpha)
        self.delta: tf.Variable | None = None

    def build(
        self, batch_shape: tuple[int, ...], dtype: Any = "float32", examples: int | None = None
    ) -> None:
        if self.delta is None:
            self.delta = tf.Variable(
                tf.zeros(batch_shape, dtype), trainable=False, name="free_at_delta"
            )

    def variables(self) -> dict[str, tf.Variable]:
        return {} if self.delta is None else {"delta": self.delta}

    def perturb(self, model: keras.Model, x, y, seed, loss_scale=None) -> tf.Tensor:
        return x + self._current_delta(x)

    def _current_delta(self, x: tf.Tensor) -> tf.Tensor:
        if self.delta is None:
            raise RuntimeError("FreeAT.build(batch_shape) must be called before training")
        # δ from the previous replay or batch, kept inside C for this batch's x.
        return constraints.project(tf.cast(self.delta, x.dtype), x, self.eps)

    def gradients(self, model: keras.Model, x, y, seed, loss_scale=None):
        delta = self._current_delta(x)
        with tf.GradientTape() as tape:
            tape.watch(delta)
            logits = model(x + delta, training=True)
            loss = tf.reduce_mean(losses.cross_entropy(logits, y))
            objective = scaled(loss, loss_scale)
        grads = tape.gradient(objective, model.trainable_variables + [delta])
        delta_grad = unscaled(grads.pop(), loss_scale)
        new_delta = constraints.project(delta + self.alpha * tf.sign(delta_grad), x, self.eps)
        self.delta.assign(tf.cast(new_delta, self.delta.dtype))
        return grads, {"loss": loss, "adv_accuracy": tf.reduce_mean(losses.correct(logits, y))}

    def config(self) -> dict:
        return {**super().config(), "replays": self.replays, "alpha": self.alpha}


# One backward pass gives the weight and the δ gradient.
ENTRY = Entry(FreeAT, OPTIONS, passes=lambda c: counts(1, 1))
