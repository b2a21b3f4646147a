"""PGD-K-R (Madry et al., 2018): R random restarts of K signed steps on the summed CE.

    attack = PGD(eps=8 / 255, steps=50, restarts=10)     # step size ε/4
    x_adv = attack(model, x, y)

The model runs with training=False. Per example the result is the first restart that
misclassifies it, or else the last restart's point; an example counts as broken if any restart
breaks it.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.attacks.losses import correct, cross_entropy


class PGD:
    def __init__(
        self,
        eps: float,
        steps: int = 50,
        restarts: int = 10,
        step_size: float | None = None,
        seed: int = 0,
        jit_compile: bool = False,
    ):
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if steps < 0 or restarts < 1:
            raise ValueError(f"need steps >= 0 and restarts >= 1, got {steps!r}, {restarts!r}")
        self.eps = float(eps)
        self.steps = int(steps)
        self.restarts = int(restarts)
        self.step_size = self.eps / 4 if step_size is None else float(step_size)
        self.seed = int(seed)
        self._calls = 0
        self._run = tf.function(self._attack, jit_compile=jit_compile, reduce_retracing=True)

    def __call__(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        x = tf.convert_to_tensor(x)
        y = tf.convert_to_tensor(y)
        # A new seed per call, so that batches of one evaluation draw different starts.
        seed = tf.constant([self.seed, self._calls], tf.int32)
        self._calls += 1
        return self._run(model, x, y, seed)

    def _attack(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor):
        best = x
        robust = tf.ones([tf.shape(x)[0]], tf.bool)
        for restart in range(self.restarts):
            restart_seed = tf.random.experimental.stateless_fold_in(seed, restart)
            delta = constraints.random_init(x, self.eps, restart_seed)
            for _ in range(self.steps):
                with tf.GradientTape(watch_accessed_variables=False) as tape:
                    tape.watch(delta)
                    loss = tf.reduce_sum(cross_entropy(model(x + delta, training=False), y))
                grad = tape.gradient(loss, delta)
                delta = constraints.project(delta + self.step_size * tf.sign(grad), x, self.eps)
            x_adv = x + delta
            broken = correct(model(x_adv, training=False), y) < 0.5
            # Replace the kept point where this restart breaks a still-robust example, and
            # always on the first restart (so that every example gets an attacked point).
            take = tf.logical_or(tf.logical_and(robust, broken), restart == 0)
            best = tf.where(tf.reshape(take, [-1] + [1] * (len(x.shape) - 1)), x_adv, best)
            robust = tf.logical_and(robust, tf.logical_not(broken))
        return best
