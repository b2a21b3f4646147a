"""APGD (Croce & Hein, 2020): PGD with momentum and a step size that halves at checkpoints.

    attack = APGD(eps=8 / 255, loss="ce")                        # APGD-CE, 100 iterations
    attack = APGD(eps=8 / 255, loss="dlr_targeted")              # APGD-T, 9 target classes
    attack = APGD(eps=0.5, loss="ce", norm="l2")                 # ε in [0, 1]-pixel units
    x_adv, _ = attack(model, x, y, seed=0)

The L∞ version of the public reference (fra31/auto-attack, autoattack/autopgd_base.py):
start at x + ε·u/‖u‖∞ with u ~ U[-1, 1]^d, first step 2ε, momentum α = 0.75 from the second
step on, the step size halved per example at the checkpoints of `checkpoints(steps)` (and the
iterate moved back to its best-loss point) when the loss rose in at most ρ = 0.75 of the steps
since the last checkpoint, or when neither the step size nor the best loss changed since then.

The L2 version, as the same file's L2 branches: start at x + ε·t/(‖t‖₂ + 1e-12) with
t ~ N(0, I), clipped to the box; step along g/(‖g‖₂ + 1e-12); after the step and again after
the momentum average, the reference's radial projection onto the ball then a clip to the box
(`constraints.project_radial_l2`, which is not the exact P_C). The first step (2ε), momentum,
checkpoints and the halving rule are the L∞ version's.

Every iterate is checked: per example the result is a misclassified point (the latest one of the
first run that finds any), over restarts and target classes, each run only on the examples still
robust; an example that is never broken gets its clean input back. The model runs with
training=False; input gradients are those of the summed per-example losses (DESIGN.md §2),
computed in float32. The 100 iterations are one `tf.while_loop` inside a `tf.function`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.attacks.base import Attack, Loop
from fbat_tf.attacks.losses import correct, cross_entropy, dlr, dlr_targeted, input_gradient

LOSSES = ("ce", "dlr", "dlr_targeted")

# Reference constants (autopgd_base.py, APGDAttack.__init__ / attack_single_run).
_FIRST_CHECKPOINT = 0.22  # p_1
_WINDOW_SHRINK = 0.03  # p_{j+1} − p_j = max(p_j − p_{j−1} − 0.03, 0.06)
_SHORTEST_WINDOW = 0.06
_MOMENTUM = 0.75
_INITIAL_STEP = 2.0  # in units of ε
# Under float16 the input gradient is taken of 2^10 · loss so that it does not underflow
# (DESIGN.md §2): a fixed, moderate scale, since an attack has no optimizer's dynamic one.
_FLOAT16_LOSS_SCALE = 1024.0


def _checkpoint_windows(n_iter: int) -> list[tuple[int, int]]:
    """(iteration count at the checkpoint, iterations since the previous one), in order.

    Integer form of the reference's rule: the first window is ⌊0.22·N⌋, each next one is
    ⌊0.03·N⌋ shorter but at least ⌊0.06·N⌋ (all at least 1).
    """
    window = max(int(_FIRST_CHECKPOINT * n_iter), 1)
    shrink = max(int(_WINDOW_SHRINK * n_iter), 1)
    shortest = max(int(_SHORTEST_WINDOW * n_iter), 1)
    schedule, at = [], window
    while at <= n_iter:
        schedule.append((at, window))
        window = max(window - shrink, shortest)
        at += window
    return schedule


def checkpoints(n_iter: int) -> list[int]:
    """Iterations (1-based) after which the step size is checked; [22, 41, ..., 99] for 100."""
    return [at for at, _ in _checkpoint_windows(n_iter)]


def halve_step(
    increases: tf.Tensor,
    window: int | tf.Tensor,
    rho: float,
    reduced_last_check: tf.Tensor,
    best_loss_last_check: tf.Tensor,
    best_loss: tf.Tensor,
) -> tf.Tensor:
    """Per example, whether to halve the step size at a checkpoint (Croce & Hein, 2020).

    Condition 1: the loss rose in at most ρ·window of the window's steps (the reference's
    `check_oscillation` tests `count <= k * rho`). Condition 2: the step size was not halved at
    the previous checkpoint and the best loss has not improved since.
    """
    oscillating = tf.cast(increases, tf.float32) <= rho * tf.cast(window, tf.float32)
    stalled = tf.logical_and(tf.logical_not(reduced_last_check), best_loss_last_check >= best_loss)
    return tf.logical_or(oscillating, stalled)


def target_class(clean_logits: tf.Tensor, k: int) -> tf.Tensor:
    """APGD-T's k-th target (k = 0, 1, ...): the class with the (k+2)-th largest clean logit."""
    return tf.math.top_k(clean_logits, k=k + 2).indices[:, k + 1]


def _per_example(values: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    """Reshape [batch] values to broadcast against a [batch, ...] tensor."""
    return tf.reshape(values, [-1] + [1] * (len(like.shape) - 1))


class _Iterate(NamedTuple):
    """The per-example state APGD's loop carries from one iteration to the next."""

    x_adv: tf.Tensor
    x_previous: tf.Tensor
    grad: tf.Tensor
    x_best_adv: tf.Tensor
    fooled: tf.Tensor
    increases: tf.Tensor
    loss_previous: tf.Tensor
    x_best: tf.Tensor
    grad_best: tf.Tensor
    loss_best: tf.Tensor
    step_size: tf.Tensor
    reduced_last_check: tf.Tensor
    loss_best_last_check: tf.Tensor


class APGD(Attack):
    keeps_adversarial = True  # its kept point per example is the first or best adversarial one

    def __init__(
        self,
        eps: float,
        loss: str = "ce",
        steps: int = 100,
        restarts: int = 1,
        n_target_classes: int = 9,
        rho: float = 0.75,
        eot_iter: int = 1,
        jit_compile: bool | None = False,
        norm: str = "linf",
    ):
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if steps < 0 or restarts < 1 or eot_iter < 1:
            raise ValueError(
                f"need steps >= 0, restarts >= 1, eot_iter >= 1; "
                f"got {steps!r}, {restarts!r}, {eot_iter!r}"
            )
        if loss == "dlr_targeted" and n_target_classes < 1:
            raise ValueError(f"n_target_classes must be >= 1, got {n_target_classes!r}")
        if not 0 < rho <= 1:
            raise ValueError(f"rho must be in (0, 1], got {rho!r}")
        self.eps = float(eps)
        self.norm = constraints.check_norm(norm)
        self.loss = loss
        self.steps = int(steps)
        self.restarts = int(restarts)
        self.n_target_classes = int(n_target_classes)
        self.rho = float(rho)
        self.eot_iter = int(eot_iter)
        schedule = _checkpoint_windows(self.steps)
        # Indexed by the 0-based iteration i: is iteration i + 1 a checkpoint, and its window.
        is_checkpoint = np.zeros(max(self.steps, 1), bool)
        window = np.ones(max(self.steps, 1), np.int32)
        for at, length in schedule:
            is_checkpoint[at - 1], window[at - 1] = True, length
        self._is_checkpoint = tf.constant(is_checkpoint)
        self._window = tf.constant(window)
        self._run = Loop(self._single_run, jit_compile, batched=3)
        self._trace = Loop(functools.partial(self._single_run, trace=True), False, batched=3)

    @property
    def targeted(self) -> bool:
        return self.loss == "dlr_targeted"

    def perturb(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        x = tf.convert_to_tensor(x)
        y = tf.cast(tf.convert_to_tensor(y), tf.int32)
        clean_logits = model(x, training=False)
        num_classes = int(clean_logits.shape[-1])
        if self.targeted and self.n_target_classes > num_classes - 1:
            raise ValueError(
                f"APGD-T with n_target_classes={self.n_target_classes} needs at least "
                f"{self.n_target_classes + 1} classes, the model has {num_classes}"
            )
        # As the reference: a clean-misclassified example is not attacked and keeps x.
        robust = correct(clean_logits, y).numpy() > 0.5
        x_adv = x.numpy().copy()
        targets = range(self.n_target_classes) if self.targeted else [None]
        for k in targets:
            for restart in range(self.restarts):
                to_attack = np.flatnonzero(robust)
                if to_attack.size == 0:
                    return tf.convert_to_tensor(x_adv)
                rows = self._run.padded(model, x, tf.constant(to_attack))
                x_sub, y_sub = tf.gather(x, rows), tf.gather(y, rows)
                target = y_sub if k is None else target_class(tf.gather(clean_logits, rows), k)
                run_seed = tf.random.experimental.stateless_fold_in(
                    seed, restart + self.restarts * (k or 0)
                )
                fooled, x_best_adv, _ = self._run(model, x_sub, y_sub, target, run_seed)
                fooled = fooled.numpy()[: to_attack.size]
                x_adv[to_attack[fooled]] = x_best_adv.numpy()[: to_attack.size][fooled]
                robust[to_attack[fooled]] = False
        return tf.convert_to_tensor(x_adv)

    def loss_trace(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed) -> tuple:
        """The first run's (first restart, first target class) loss at its start and each of its
        iterates, [steps + 1, batch], and whether any iterate misclassifies each example: what
        the indicator of incomplete optimization reads (fbat_tf/indicators.py)."""
        x = tf.convert_to_tensor(x)
        y = tf.cast(tf.convert_to_tensor(y), tf.int32)
        target = y if not self.targeted else target_class(model(x, training=False), 0)
        seed = tf.random.experimental.stateless_fold_in(constraints.as_seed(seed), 0)
        fooled, _, _, losses = self._trace(model, x, y, target, seed)
        return losses, fooled

    def _objective(self, logits: tf.Tensor, y: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
        if self.loss == "ce":
            return cross_entropy(logits, y)
        if self.loss == "dlr":
            return dlr(logits, y)
        return dlr_targeted(logits, y, target)

    def _loss_and_gradient(self, model: keras.Model, x_adv: tf.Tensor, y, target):
        """Per-example loss and logits of the last draw, and the input gradient averaged over
        `eot_iter` forward passes (expectation over transformation for randomized models)."""
        scale = _FLOAT16_LOSS_SCALE if model.compute_dtype == "float16" else None

        def loss_and_logits(x_adv):
            logits = model(x_adv, training=False)
            return self._objective(logits, y, target), logits

        def one_draw():
            (loss, logits), grad = input_gradient(loss_and_logits, x_adv, scale)
            return loss, logits, grad

        loss, logits, grad = one_draw()
        if self.eot_iter > 1:
            # A graph loop, so that EOT-20 adds one copy of the model to the graph, not 20.
            def draw_more(j, loss, logits, grad):
                loss, logits, more = one_draw()
                return j + 1, loss, logits, grad + more

            _, loss, logits, grad = tf.while_loop(
                lambda j, *_: j < self.eot_iter - 1,
                draw_more,
                (tf.constant(0), loss, logits, grad),
            )
        return loss, logits, grad / float(self.eot_iter)

    def _single_run(self, model: keras.Model, x: tf.Tensor, y, target, seed, trace=False):
        """One restart on one target: (fooled [batch] bool, the latest misclassified iterate,
        the step size each example took at each iteration [steps, batch]); with `trace`, also
        the loss at the start and at each iterate [steps + 1, batch]."""
        eps = tf.constant(self.eps, x.dtype)
        if self.norm == "linf":
            # The reference's projection onto x + C, as one clip to bounds computed once.
            lower, upper = constraints.ball_bounds(x, eps)

            def to_ball(point: tf.Tensor) -> tf.Tensor:
                return tf.clip_by_value(point, lower, upper)

            direction = tf.sign
            # Reference L∞ start: x + ε·u/‖u‖∞, u ~ U[-1, 1]^d, clipped to the box (drawn by the
            # project's one noise source, the same numbers as stateless_uniform on this seed).
            u = constraints.uniform_noise(x, 1.0, seed)
            u_max = tf.reduce_max(tf.abs(tf.reshape(u, [tf.shape(u)[0], -1])), axis=1)
            x_adv = to_ball(x + eps * u / (_per_example(u_max, u) + 1e-12))
        else:

            def to_ball(point: tf.Tensor) -> tf.Tensor:
                return constraints.project_radial_l2(point, x, eps)

            def direction(v: tf.Tensor) -> tf.Tensor:
                return v / (_per_example(constraints.l2_norms(v), v) + 1e-12)

            # Reference L2 start: x + ε·t/‖t‖₂, t ~ N(0, I), clipped to the box.
            t = tf.random.stateless_normal(tf.shape(x), seed, dtype=x.dtype)
            x_adv = tf.clip_by_value(x + eps * direction(t), 0.0, 1.0)

        loss, logits, grad = self._loss_and_gradient(model, x_adv, y, target)
        fooled = correct(logits, y) < 0.5
        step_size = tf.fill(tf.shape(loss), _INITIAL_STEP * eps)
        start = _Iterate(
            x_adv=x_adv,
            x_previous=x_adv,
            grad=grad,
            x_best_adv=x_adv,
            fooled=fooled,
            increases=tf.zeros_like(loss, tf.int32),
            loss_previous=loss,
            x_best=x_adv,
            grad_best=grad,
            loss_best=loss,
            step_size=step_size,
            reduced_last_check=tf.ones_like(fooled),
            loss_best_last_check=loss,
        )
        step_sizes = tf.TensorArray(step_size.dtype, size=self.steps, element_shape=loss.shape)
        losses = tf.TensorArray(tf.float32, size=self.steps + 1, element_shape=loss.shape)
        losses = losses.write(0, tf.cast(loss, tf.float32))

        def iteration(i, step_sizes, losses, state):
            step_sizes = step_sizes.write(i, state.step_size)
            # The paper's Algorithm 1: a projected step to z (sign(g) for L∞, g/‖g‖₂ for L2),
            # then the momentum average x + α(z − x) + (1 − α)(x − x_previous), projected again;
            # the first step has no momentum.
            momentum = tf.cast(tf.where(i > 0, _MOMENTUM, 1.0), x.dtype)
            x_adv = state.x_adv
            z = to_ball(x_adv + _per_example(state.step_size, x) * direction(state.grad))
            x_next = to_ball(
                x_adv + momentum * (z - x_adv) + (1.0 - momentum) * (x_adv - state.x_previous)
            )
            state = state._replace(x_previous=x_adv, x_adv=x_next)

            loss, logits, grad = self._loss_and_gradient(model, state.x_adv, y, target)
            if trace:
                losses = losses.write(i + 1, tf.cast(loss, tf.float32))
            # Every iterate counts: a misclassified iterate replaces the kept adversarial point
            # (the reference's x_best_adv).
            fooled_now = correct(logits, y) < 0.5
            state = state._replace(
                grad=grad,
                x_best_adv=tf.where(_per_example(fooled_now, x), state.x_adv, state.x_best_adv),
                fooled=tf.logical_or(state.fooled, fooled_now),
                # Condition 1 counts f(x_{k+1}) > f(x_k) over the window. The first comparison
                # is with the start point's loss, as the paper writes it (the reference's code
                # compares with a not-yet-written zero there, loss_steps[-1]).
                increases=state.increases + tf.cast(loss > state.loss_previous, tf.int32),
                loss_previous=loss,
            )
            improved = loss > state.loss_best
            state = state._replace(
                x_best=tf.where(_per_example(improved, x), state.x_adv, state.x_best),
                grad_best=tf.where(_per_example(improved, x), grad, state.grad_best),
                loss_best=tf.where(improved, loss, state.loss_best),
            )

            at_checkpoint = self._is_checkpoint[i]
            halve = tf.logical_and(
                at_checkpoint,
                halve_step(
                    state.increases,
                    self._window[i],
                    self.rho,
                    state.reduced_last_check,
                    state.loss_best_last_check,
                    state.loss_best,
                ),
            )
            # Halving restarts from the best-loss point and its gradient (reference rule).
            step_size = tf.where(halve, state.step_size / 2.0, state.step_size)
            # Only a checkpoint can halve: the other iterations skip the two selects.
            x_adv, grad = tf.cond(
                at_checkpoint,
                lambda: (
                    tf.where(_per_example(halve, x), state.x_best, state.x_adv),
                    tf.where(_per_example(halve, x), state.grad_best, state.grad),
                ),
                lambda: (state.x_adv, state.grad),
            )
            state = state._replace(
                step_size=step_size,
                x_adv=x_adv,
                grad=grad,
                reduced_last_check=tf.where(at_checkpoint, halve, state.reduced_last_check),
                loss_best_last_check=tf.where(
                    at_checkpoint, state.loss_best, state.loss_best_last_check
                ),
                increases=tf.where(at_checkpoint, tf.zeros_like(state.increases), state.increases),
            )
            return i + 1, step_sizes, losses, state

        _, step_sizes, losses, state = tf.while_loop(
            lambda i, *_: i < self.steps, iteration, (tf.constant(0), step_sizes, losses, start)
        )
        if trace:
            return state.fooled, state.x_best_adv, step_sizes.stack(), losses.stack()
        return state.fooled, state.x_best_adv, step_sizes.stack()
