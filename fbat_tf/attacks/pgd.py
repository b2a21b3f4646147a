"""PGD-K-R (Madry et al., 2018): R random restarts of K signed steps on the summed CE.

    attack = PGD(eps=8 / 255, steps=50, restarts=10)     # step size ε/4
    x_adv, _ = attack(model, x, y, seed=0)
    fgsm = PGD(eps, steps=1, restarts=1, step_size=eps, random_start=False)  # FGSM from x

The model runs with training=False. Per example the result is the first restart that
misclassifies it, or else the first restart's point; an example counts as broken if any restart
breaks it. Restarts and steps are `tf.while_loop`s, so the traced graph holds one gradient step
whatever K and R are. A restart attacks only the examples no earlier restart has broken (their
random starts are drawn for the whole batch all the same), and the restarts stop once every
example is broken; under XLA (`jit_compile=True`), which needs static shapes, every restart
attacks the whole batch.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from fbat_tf import constraints, device
from fbat_tf.attacks.base import Attack, Loop
from fbat_tf.attacks.losses import correct, cross_entropy, input_gradient


class PGD(Attack):
    def __init__(
        self,
        eps: float,
        steps: int = 50,
        restarts: int = 10,
        step_size: float | None = None,
        jit_compile: bool | None = False,
        random_start: bool = True,
    ):
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if steps < 0 or restarts < 1:
            raise ValueError(f"need steps >= 0 and restarts >= 1, got {steps!r}, {restarts!r}")
        if not random_start and restarts > 1:
            raise ValueError(
                f"restarts={restarts!r} without a random start would repeat one attack; use 1"
            )
        self.eps = float(eps)
        self.steps = int(steps)
        self.restarts = int(restarts)
        self.step_size = self.eps / 4 if step_size is None else float(step_size)
        # Without a random start the attack starts from x (δ = 0).
        self.random_start = bool(random_start)
        if jit_compile is None:  # XLA where it pays for PGD: on a GPU
            jit_compile = device.resolve_jit_compile("auto")
        self._run = Loop(self._attack, jit_compile, batched=2)

    @property
    def survivors_only(self) -> bool:
        """XLA compiles static shapes only: there every restart attacks the whole batch."""
        return not self._run.jit_compile

    def perturb(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        return self._run(model, x, y, seed)

    def _attack(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor):
        # Graph loops over restarts and steps: the traced graph holds one gradient step
        # whatever K and R are, so tracing and compiling PGD-50-10 cost what PGD-5-1 does.
        per_example = [-1] + [1] * (len(x.shape) - 1)

        def attack_from(start: tf.Tensor, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            lower, upper = constraints.delta_bounds(x, self.eps)

            def ascend(step: tf.Tensor, delta: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                _, grad = input_gradient(
                    lambda delta: cross_entropy(model(x + delta, training=False), y), delta
                )
                delta = tf.clip_by_value(delta + self.step_size * tf.sign(grad), lower, upper)
                # A frozen graph's gradient may lose the batch size; the loop needs it fixed.
                return step + 1, tf.ensure_shape(delta, start.shape)

            _, delta = tf.while_loop(
                lambda step, _: step < self.steps, ascend, (tf.constant(0), start)
            )
            return x + delta

        def restart(index: tf.Tensor, best: tf.Tensor, robust: tf.Tensor):
            # Drawn for the whole batch, so that an example's start does not depend on which
            # others are attacked with it.
            if self.random_start:
                start = constraints.random_init(
                    x, self.eps, tf.random.experimental.stateless_fold_in(seed, index)
                )
            else:
                start = tf.zeros_like(x)
            if self.survivors_only:
                # Only the examples no restart has broken yet (all of them on the first): the
                # others' kept points cannot change, and a restart costs what survives.
                rows = tf.where(robust)[:, 0]
            else:
                rows = tf.range(tf.shape(x, out_type=tf.int64)[0])
            x_rows, y_rows = tf.gather(x, rows), tf.gather(y, rows)
            x_adv = attack_from(tf.gather(start, rows), x_rows, y_rows)
            broken = correct(model(x_adv, training=False), y_rows) < 0.5
            x_adv = tf.tensor_scatter_nd_update(x, rows[:, None], x_adv)
            broken = tf.tensor_scatter_nd_update(tf.zeros_like(robust), rows[:, None], broken)
            # Replace the kept point where this restart breaks a still-robust example, and
            # always on the first restart (so that every example gets an attacked point).
            take = tf.logical_or(tf.logical_and(robust, broken), tf.equal(index, 0))
            best = tf.where(tf.reshape(take, per_example), x_adv, best)
            return index + 1, best, tf.logical_and(robust, tf.logical_not(broken))

        # Once every example is broken, later restarts could not change the result: stop.
        _, best, _ = tf.while_loop(
            lambda index, _, robust: tf.logical_and(
                index < self.restarts, tf.logical_or(tf.equal(index, 0), tf.reduce_any(robust))
            ),
            restart,
            (tf.constant(0), x, tf.ones([tf.shape(x)[0]], tf.bool)),
        )
        return best
