"""PGD-K-R (Madry et al., 2018): R random restarts of K signed steps on the summed CE.

    attack = PGD(eps=8 / 255, steps=50, restarts=10)     # step size ε/4
    x_adv, _ = attack(model, x, y, seed=0)
    fgsm = PGD(eps, steps=1, restarts=1, step_size=eps, random_start=False)  # FGSM from x
    l2 = PGD(eps=0.5, norm="l2")                         # ε in [0, 1]-pixel units

Under the L2 norm each step moves along the gradient normalized per example (length: the step
size) and is projected onto the L2 ball ∩ box exactly (constraints.project_l2); the random start
is uniform in the ball (constraints.random_init).

The model runs with training=False. Per example the result is an adversarial point if any
iterate of any restart was one: a restart's point is the first of its iterates (the random start
included) that the model misclassifies, else its last; the attack's is the first restart's that
misclassifies, or else the first restart's point. An example counts as broken if any iterate of
any restart breaks it (a restart that keeps only its last iterate, as Madry et al.'s loop does,
can step past a point it found). Restarts and steps are `tf.while_loop`s, so the traced graph
holds one gradient step whatever K and R are. A restart attacks only the examples no earlier
restart has broken (their random starts are drawn for the whole batch all the same), later
restarts run side by side, as many as fit with those examples in the batch (fewer, larger matrix
products; each example keeps the first of them that breaks it), and the restarts stop once every
example is broken. Under XLA (`jit_compile=True`), which needs static shapes, every restart
attacks the whole batch.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from fbat_tf import catalog, constraints
from fbat_tf.attacks.base import Attack, Loop
from fbat_tf.attacks.losses import correct, cross_entropy, input_gradient


class PGD(Attack):
    keeps_adversarial = True  # its kept point per example is the first or best adversarial one

    def __init__(
        self,
        eps: float,
        steps: int = catalog.PGD_STEPS,
        restarts: int = catalog.PGD_RESTARTS,
        step_size: float | None = None,
        jit_compile: bool | None = False,
        random_start: bool = True,
        norm: str = "linf",
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
        self.norm = constraints.check_norm(norm)
        self.steps = int(steps)
        self.restarts = int(restarts)
        self.step_size = self.eps * catalog.PGD_STEP_SIZE if step_size is None else float(step_size)
        # Without a random start the attack starts from x (δ = 0).
        self.random_start = bool(random_start)
        self._run = Loop(self._attack, jit_compile, batched=2)
        self._trace = Loop(self._loss_trace, False, batched=2)

    @property
    def survivors_only(self) -> bool:
        """XLA compiles static shapes only: there every restart attacks the whole batch."""
        return not self._run.jit_compile

    def perturb(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        return self._run(model, x, y, seed)

    def loss_trace(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed) -> tuple:
        """The first restart's CE at each of its iterates δ_0 (its start), ..., δ_K, [K + 1,
        batch], and whether any of them misclassifies each example: what the indicator of
        incomplete optimization reads (fbat_tf/indicators.py). Its steps are the attack's."""
        x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        return self._trace(model, x, y, constraints.as_seed(seed))

    def _loss_trace(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor):
        lower, upper = constraints.delta_bounds(x, self.eps)
        if self.random_start:
            start = constraints.random_init(
                x, self.eps, tf.random.experimental.stateless_fold_in(seed, 0), self.norm
            )
        else:
            start = tf.zeros_like(x)
        trace = tf.TensorArray(tf.float32, size=self.steps + 1)

        def ascend(step, delta, trace, found):
            (loss, logits), grad = input_gradient(
                lambda delta: _loss_and_logits(model, x + delta, y), delta
            )
            trace = trace.write(step, tf.cast(loss, tf.float32))
            found = tf.logical_or(found, correct(logits, y) < 0.5)
            moved = delta + self.step_size * constraints.normalized(grad, self.norm)
            if self.norm == "linf":
                delta = tf.clip_by_value(moved, lower, upper)
            else:
                delta = constraints.project(moved, x, self.eps, self.norm)
            return step + 1, tf.ensure_shape(delta, start.shape), trace, found

        found = tf.zeros([tf.shape(x)[0]], tf.bool)
        _, delta, trace, found = tf.while_loop(
            lambda step, *_: step < self.steps, ascend, (tf.constant(0), start, trace, found)
        )
        loss, logits = _loss_and_logits(model, x + delta, y)
        trace = trace.write(self.steps, tf.cast(loss, tf.float32))
        return trace.stack(), tf.logical_or(found, correct(logits, y) < 0.5)

    def _attack(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor):
        # Graph loops over restarts and steps: the traced graph holds one gradient step
        # whatever K and R are, so tracing and compiling PGD-50-10 cost what PGD-5-1 does.
        per_example = [-1] + [1] * (len(x.shape) - 1)

        def attack_from(start: tf.Tensor, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            """The restart's point per example: the first of its iterates δ_0 (the start), ...,
            δ_K that the model misclassifies, else δ_K. Each step's gradient pass gives the
            logits at its iterate, so watching the iterates costs no pass of its own."""
            lower, upper = constraints.delta_bounds(x, self.eps)

            def ascend(step, delta, kept, found):
                (_, logits), grad = input_gradient(
                    lambda delta: _loss_and_logits(model, x + delta, y), delta
                )
                # δ_step, where it is the first iterate that breaks the example.
                new = tf.logical_and(tf.logical_not(found), correct(logits, y) < 0.5)
                kept = tf.where(tf.reshape(new, per_example), delta, kept)
                moved = delta + self.step_size * constraints.normalized(grad, self.norm)
                if self.norm == "linf":  # one clip: P_C for the L∞ ball (delta_bounds)
                    delta = tf.clip_by_value(moved, lower, upper)
                else:
                    delta = constraints.project(moved, x, self.eps, self.norm)
                # A frozen graph's gradient may lose the batch size; the loop needs it fixed.
                delta = tf.ensure_shape(delta, start.shape)
                return step + 1, delta, kept, tf.logical_or(found, new)

            found = tf.zeros([tf.shape(x)[0]], tf.bool)
            _, delta, kept, found = tf.while_loop(
                lambda step, *_: step < self.steps, ascend, (tf.constant(0), start, start, found)
            )
            return x + tf.where(tf.reshape(found, per_example), kept, delta)

        n = tf.shape(x, out_type=tf.int64)[0]

        def start_of(index: tf.Tensor) -> tf.Tensor:
            # Drawn for the whole batch, so that an example's start does not depend on which
            # others are attacked with it.
            if not self.random_start:
                return tf.zeros_like(x)
            return constraints.random_init(
                x, self.eps, tf.random.experimental.stateless_fold_in(seed, index), self.norm
            )

        def restarts_from(index: tf.Tensor, best: tf.Tensor, robust: tf.Tensor):
            """Restarts index, ..., index + g − 1, side by side in one batch."""
            if self.survivors_only:
                # Only the examples no restart has broken yet (all of them on the first): the
                # others' kept points cannot change, and a restart costs what survives. Later
                # restarts run side by side, as many as fit with the survivors in the batch:
                # fewer, larger matrix products, the same points (each example keeps the first
                # of them that breaks it).
                rows = tf.where(robust)[:, 0]
                fit = n // tf.maximum(tf.shape(rows, out_type=tf.int64)[0], 1)
                group = tf.where(tf.equal(index, 0), 1, tf.cast(fit, tf.int32))
            else:
                rows, group = tf.range(n), tf.constant(1)
            group = tf.clip_by_value(group, 1, self.restarts - index)
            starts = tf.TensorArray(x.dtype, size=group, infer_shape=False)
            starts = tf.while_loop(
                lambda j, _: j < group,
                lambda j, a: (j + 1, a.write(j, tf.gather(start_of(index + j), rows))),
                (tf.constant(0), starts),
            )[1].concat()
            x_rows, y_rows = tf.gather(x, rows), tf.gather(y, rows)
            x_tiled = tf.tile(x_rows, [group] + [1] * (len(x.shape) - 1))
            y_tiled = tf.tile(y_rows, [group])
            x_adv = attack_from(tf.ensure_shape(starts, x_rows.shape), x_tiled, y_tiled)
            broken = correct(model(x_adv, training=False), y_tiled) < 0.5
            # Per example the first restart of the group that breaks it (else the group's first).
            broken = tf.reshape(broken, [group, -1])
            first = tf.argmax(tf.cast(broken, tf.int32), 0, output_type=tf.int32)
            count = tf.shape(rows)[0]
            pick = first * count + tf.range(count)
            x_adv = tf.tensor_scatter_nd_update(x, rows[:, None], tf.gather(x_adv, pick))
            broken = tf.tensor_scatter_nd_update(
                tf.zeros_like(robust), rows[:, None], tf.reduce_any(broken, 0)
            )
            # Replace the kept point where this group breaks a still-robust example, and
            # always on the first restart (so that every example gets an attacked point).
            take = tf.logical_or(tf.logical_and(robust, broken), tf.equal(index, 0))
            best = tf.where(tf.reshape(take, per_example), x_adv, best)
            return index + group, best, tf.logical_and(robust, tf.logical_not(broken))

        # Once every example is broken, later restarts could not change the result: stop.
        _, best, _ = tf.while_loop(
            lambda index, _, robust: tf.logical_and(
                index < self.restarts, tf.logical_or(tf.equal(index, 0), tf.reduce_any(robust))
            ),
            restarts_from,
            (tf.constant(0), x, tf.ones([tf.shape(x)[0]], tf.bool)),
        )
        return best


def _loss_and_logits(model: keras.Model, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    logits = model(x, training=False)
    return cross_entropy(logits, y), logits
