"""FAB-T (Croce & Hein, 2020): the targeted Fast Adaptive Boundary attack for L∞ or L2, as
AutoAttack "standard" runs it (9 target classes, 100 iterations, 1 restart).

    attack = FAB(eps=8 / 255)                    # n_target_classes=9, steps=100, restarts=1
    attack = FAB(eps=0.5, norm="l2")             # ε in [0, 1]-pixel units
    x_adv, _ = attack(model, x, y, seed=0)       # x_adv ∈ C; x itself where FAB found nothing

FAB is a minimum-norm attack: per target it walks towards the linearized decision boundary
between the label y and the target t and keeps, per example, the adversarial point of smallest
norm (‖·‖∞ or ‖·‖₂) it meets. The k-th target (k = 0, 1, ...) is the class with the (k+2)-th
largest clean logit. Each target is tried only on the examples no earlier target has broken,
and an example counts as broken only by a point within ε (AutoAttack's `FABAttack.perturb`), so
`x_adv` is that point or the clean input. The model runs with training=False; the objective is
in float32.

The exact projection onto a hyperplane intersected with a box, which every FAB step solves, is
a standalone function per norm:

    delta = project_linf_hyperplane_box(points, w, b)    # argmin ‖δ‖∞: w·(p+δ) = b, p+δ ∈ [0,1]
    delta = project_l2_hyperplane_box(points, w, b)      # argmin ‖δ‖₂, the same constraints

Under L2 (the reference's fab_base.py, its L2 branches) the step projects with the L2 function,
the bias α, the kept point and the final ≤ ε check measure ‖·‖₂, and a restart starts from
x + ε/2·t/‖t‖₂ with t ~ N(0, I), clipped to the box; all else is the L∞ attack.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.attacks.base import Attack, Loop
from fbat_tf.attacks.losses import as_loss_dtype, input_gradient


def _oriented(points: tf.Tensor, w: tf.Tensor, b: tf.Tensor, lower, upper):
    """(w, needed, room) of the hyperplane w·z = b oriented so that the point lies on its side
    w·p ≥ b (the reference's `sign`): every coordinate then moves by −sign(w_i), w·(p + δ) must
    come down by needed = w·p − b ≥ 0, and room_i is the distance to the box face that way."""
    side = tf.where(tf.reduce_sum(w * points, -1) >= b, 1.0, -1.0)
    side = tf.cast(side, points.dtype)
    w = w * side[:, None]
    b = b * side
    needed = tf.reduce_sum(w * points, -1) - b
    room = tf.maximum(tf.where(w < 0, upper - points, points - lower), 0.0)
    return w, needed, room


def _smallest_level(
    slope: tf.Tensor, breaks: tf.Tensor, reach: tf.Tensor, needed: tf.Tensor
) -> tf.Tensor:
    """Per row, the smallest λ ≥ 0 with G(λ) = Σ_i slope_i·min(λ, breaks_i) = needed, where
    reach_i = slope_i·breaks_i is what coordinate i gives once saturated (λ ≥ breaks_i).

    G is concave and piecewise linear with breaks at the breaks_i. Instead of sorting the d
    breaks per row, λ is found by the fixed-point iteration λ ← (needed − Σ_{breaks_i < λ}
    reach_i) / Σ_{breaks_i ≥ λ} slope_i from λ_0 = needed / Σ slope_i: each step solves the
    line of G's piece at λ, which lies above the concave G, so λ rises monotonically to the
    answer and stops on its linear piece after a few steps, as Michelot's simplex projection
    does. Rows where needed > Σ reach (no λ reaches it) get a meaningless value; the callers
    replace it."""

    def solve_on_piece(saturated: tf.Tensor) -> tf.Tensor:
        """λ with Σ_saturated reach_i + λ·Σ_free slope_i = needed (0 where nothing is free)."""
        mask = tf.cast(saturated, reach.dtype)
        saturated_reach = tf.reduce_sum(reach * mask, -1)
        free = tf.reduce_sum(slope * (1.0 - mask), -1)
        safe_free = tf.where(free > 0, free, tf.ones_like(free))
        return tf.where(free > 0, (needed - saturated_reach) / safe_free, tf.zeros_like(free))

    def newly_saturated(lam: tf.Tensor, saturated: tf.Tensor) -> tf.Tensor:
        return tf.logical_and(breaks < lam[:, None], tf.logical_not(saturated))

    def refine(lam: tf.Tensor, saturated: tf.Tensor, newly: tf.Tensor):
        saturated = tf.logical_or(saturated, newly)
        lam = solve_on_piece(saturated)
        return lam, saturated, newly_saturated(lam, saturated)

    # λ only rises, so the saturated set only grows: at most d rounds, in practice a few.
    saturated = tf.zeros_like(breaks, tf.bool)
    lam = solve_on_piece(saturated)
    lam, _, _ = tf.while_loop(
        lambda lam, saturated, newly: tf.reduce_any(newly),
        refine,
        (lam, saturated, newly_saturated(lam, saturated)),
    )
    return tf.maximum(lam, 0.0)


# Straight-line code and a written-out tf.while_loop: traced without AutoGraph's rewriting.
@tf.autograph.experimental.do_not_convert
def project_linf_hyperplane_box(
    points: tf.Tensor,
    w: tf.Tensor,
    b: tf.Tensor,
    lower: float | tf.Tensor = 0.0,
    upper: float | tf.Tensor = 1.0,
) -> tf.Tensor:
    """Per row, δ = argmin ‖δ‖∞ subject to w·(p + δ) = b and lower ≤ p + δ ≤ upper.

    points, w: [n, d]; b: [n]; lower, upper: scalars or broadcastable to [n, d], with the points
    inside the box. Where no point of the box lies on the hyperplane, δ moves p to the box corner
    nearest to it (the reference's `projection_linf` leaves that corner too), so FAB still steps
    towards the boundary.

    The same exact solution as the reference's sort-based `projection_linf`: with ‖δ‖∞ ≤ λ the
    farthest one can move w·(p + δ) towards b is G(λ) = Σ_i |w_i|·min(λ, room_i), room_i being
    the distance to the box face in direction −sign(w_i); δ_i = −sign(w_i)·min(λ*, room_i) with
    λ* the smallest λ with G(λ) = |w·p − b|, found by `_smallest_level`'s fixed-point iteration
    instead of sorting the d breaks per row: same result, a fraction of the sort's cost for
    d ~ 1000.
    """
    points = tf.convert_to_tensor(points)
    w = tf.convert_to_tensor(w, points.dtype)
    b = tf.convert_to_tensor(b, points.dtype)
    w, needed, room = _oriented(points, w, b, lower, upper)
    weight = tf.abs(w)
    reach = weight * room  # what coordinate i contributes once saturated (λ ≥ room_i)
    feasible = tf.reduce_sum(reach, -1) >= needed  # G(max room) ≥ needed: the plane meets the box
    lam = _smallest_level(weight, room, reach, needed)
    # Infeasible rows: λ = ∞ moves every coordinate to its face, the box corner nearest the plane.
    lam = tf.where(feasible, lam, tf.fill(tf.shape(lam), tf.constant(np.inf, points.dtype)))
    return -tf.sign(w) * tf.minimum(lam[:, None], room)


@tf.autograph.experimental.do_not_convert
def project_l2_hyperplane_box(
    points: tf.Tensor,
    w: tf.Tensor,
    b: tf.Tensor,
    lower: float | tf.Tensor = 0.0,
    upper: float | tf.Tensor = 1.0,
) -> tf.Tensor:
    """Per row, δ = argmin ‖δ‖₂ subject to w·(p + δ) = b and lower ≤ p + δ ≤ upper; arguments
    and the infeasible case (the box corner nearest the plane) as `project_linf_hyperplane_box`.

    The problem the reference's sort-based `projection_l2` (fab_projections.py) solves: by the
    KKT conditions δ_i = −sign(w_i)·min(α|w_i|, room_i) for a multiplier α ≥ 0, room_i as in
    the L∞ case, and w·(p + δ) comes down by G(α) = Σ_i |w_i|·min(α|w_i|, room_i)
    = Σ_i w_i²·min(α, room_i/|w_i|), concave and piecewise linear in α with breaks at
    room_i/|w_i|. α is the smallest with G(α) = |w·p − b|, by `_smallest_level`; where the box
    never binds it is the closed form (w·p − b)/‖w‖², δ = −(w·p − b)·w/‖w‖².
    """
    points = tf.convert_to_tensor(points)
    w = tf.convert_to_tensor(w, points.dtype)
    b = tf.convert_to_tensor(b, points.dtype)
    w, needed, room = _oriented(points, w, b, lower, upper)
    weight = tf.abs(w)
    moves = weight > 0
    # A coordinate with w_i = 0 never moves: its break is ∞ and its slope 0.
    infinity = tf.constant(np.inf, points.dtype)
    breaks = tf.where(moves, room / tf.where(moves, weight, tf.ones_like(weight)), infinity)
    reach = weight * room
    feasible = tf.reduce_sum(reach, -1) >= needed
    alpha = _smallest_level(tf.square(w), breaks, reach, needed)
    alpha = tf.where(feasible, alpha, tf.fill(tf.shape(alpha), infinity))
    # α = ∞ (infeasible rows) takes every moving coordinate to its face.
    length = tf.where(moves, tf.minimum(alpha[:, None] * weight, room), tf.zeros_like(room))
    return -tf.sign(w) * length


class FAB(Attack):
    keeps_adversarial = True  # its kept point per example is the first or best adversarial one
    """Targeted FAB for L∞ or L2 (AutoAttack's FAB-T); see the module docstring.

    eps: the ε of the threat model; only adversarials with ‖x_adv − x‖ ≤ ε count, and it sets
        the radius of random restarts (0.5·ε, as the reference draws them).
    n_target_classes: how many targets, in order of decreasing clean logit (AutoAttack: 9).
    steps, restarts: iterations per (target, restart) (100) and restarts per target (1; the
        restarts after the first start from a random point).
    alpha_max, eta, beta: the reference's bias towards the original point (0.1), extrapolation
        (1.05) and backward step after an adversarial is found (0.9).
    jit_compile: compile each run with XLA (None, the default: `base.xla_pays`, i.e. on a GPU,
        and on a CPU for a model without convolutions). XLA fuses the element-wise work of the
        projection, two thirds of FAB's time otherwise.
    norm: "linf" or "l2" (constraints.NORMS), the norm minimized and bounded by ε.
    """

    def __init__(
        self,
        eps: float,
        n_target_classes: int = 9,
        steps: int = 100,
        restarts: int = 1,
        alpha_max: float = 0.1,
        eta: float = 1.05,
        beta: float = 0.9,
        jit_compile: bool | None = None,
        norm: str = "linf",
    ):
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if n_target_classes < 1 or steps < 0 or restarts < 1:
            raise ValueError(
                "need n_target_classes >= 1, steps >= 0 and restarts >= 1, got "
                f"{n_target_classes!r}, {steps!r}, {restarts!r}"
            )
        if not 0 <= alpha_max <= 1 or not eta >= 1 or not 0 < beta <= 1:
            raise ValueError(
                "need 0 <= alpha_max <= 1, eta >= 1 and 0 < beta <= 1, got "
                f"{alpha_max!r}, {eta!r}, {beta!r}"
            )
        self.eps = float(eps)
        self.norm = constraints.check_norm(norm)
        self.n_target_classes = int(n_target_classes)
        self.steps = int(steps)
        self.restarts = int(restarts)
        self.alpha_max = float(alpha_max)
        self.eta = float(eta)
        self.beta = float(beta)
        self._run = Loop(self._single_run, jit_compile, batched=4, dense_on_cpu=True)

    def perturb(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        x = tf.convert_to_tensor(x)
        y = tf.cast(tf.convert_to_tensor(y), tf.int32)
        logits = as_loss_dtype(model(x, training=False))
        n_classes = int(logits.shape[-1])
        if self.n_target_classes > n_classes - 1:
            raise ValueError(
                f"n_target_classes={self.n_target_classes} needs at least "
                f"{self.n_target_classes + 1} classes, the model has {n_classes}"
            )
        # The reference's target_class = 2, ..., n+1 picks `sort(logits)[:, -target_class]`.
        ranked = tf.argsort(logits, axis=-1, direction="DESCENDING", stable=True)
        robust = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), y)
        per_example = [-1] + [1] * (len(x.shape) - 1)
        x_adv = x
        for k in range(self.n_target_classes):
            for restart in range(self.restarts):
                # FABAttack.perturb: each (target, restart) runs on the still-robust examples only.
                index = tf.where(robust)[:, 0]
                count = int(tf.size(index))
                if count == 0:
                    return x_adv
                rows = self._run.padded(model, x, index)
                x_sub = tf.gather(x, rows)
                start = x_sub
                if restart > 0:
                    # The reference's restart: t ~ U[-1, 1]^d (L∞) or N(0, I) (L2) scaled to
                    # ‖·‖ = ε/2 (min(res2, ε) with res2 = 1e10 on a fresh run), clipped to the
                    # image box. Drawn here: an XLA-compiled run would draw other numbers from
                    # the same seed.
                    run_seed = tf.random.experimental.stateless_fold_in(seed, k)
                    run_seed = tf.random.experimental.stateless_fold_in(run_seed, restart)
                    if self.norm == "linf":
                        t = tf.random.stateless_uniform(tf.shape(x_sub), run_seed, -1, 1, x.dtype)
                    else:
                        t = tf.random.stateless_normal(tf.shape(x_sub), run_seed, dtype=x.dtype)
                    t_norm = self._norms(t)
                    start = tf.clip_by_value(
                        x_sub + 0.5 * self.eps * t / tf.reshape(t_norm, per_example), 0.0, 1.0
                    )
                adv, broken = self._run(
                    model, x_sub, tf.gather(y, rows), tf.gather(ranked[:, k + 1], rows), start
                )
                adv, broken = adv[:count], broken[:count]
                broken_index = tf.boolean_mask(index, broken)[:, None]
                x_adv = tf.tensor_scatter_nd_update(
                    x_adv, broken_index, tf.boolean_mask(adv, broken)
                )
                robust = tf.tensor_scatter_nd_update(
                    robust, broken_index, tf.zeros([tf.shape(broken_index)[0]], tf.bool)
                )
        return x_adv

    def _norms(self, v: tf.Tensor) -> tf.Tensor:
        """‖v‖ of each example of a batch in the attack's norm, shape [N]."""
        if self.norm == "l2":
            return constraints.l2_norms(v)
        return tf.reduce_max(tf.abs(tf.reshape(v, [tf.shape(v)[0], -1])), -1)

    def _single_run(
        self,
        model: keras.Model,
        x0: tf.Tensor,
        y: tf.Tensor,
        target: tf.Tensor,
        x1: tf.Tensor,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """One FAB run towards `target` from x1 (x0, or a restart's random start): the
        reference's `attack_single_run`, targeted branch.

        Returns the smallest-norm adversarial point found per example and whether it breaks the
        example within ε.
        """
        n = tf.shape(x0)[0]
        flat_x0 = tf.reshape(x0, [n, -1])

        def per_example(v: tf.Tensor) -> tf.Tensor:
            return tf.reshape(v, [-1] + [1] * (len(x0.shape) - 1))

        project = project_l2_hyperplane_box if self.norm == "l2" else project_linf_hyperplane_box

        best = x0
        best_norm = tf.fill([n], tf.constant(np.inf, x0.dtype))

        def step(i, x1, best, best_norm):
            # get_diff_logits_grads_batch_targeted: the linearized boundary f_t − f_y = 0 at x1.
            def difference_of(x1):
                logits = as_loss_dtype(model(x1, training=False))
                return tf.gather(logits, target, batch_dims=1) - tf.gather(logits, y, batch_dims=1)

            # The sum's gradient is each example's own (inference mode: no cross-example
            # terms), so one backward pass gives the reference's per-example Jacobian rows.
            difference, w = input_gradient(difference_of, x1)
            w = tf.reshape(tf.cast(w, x0.dtype), [n, -1])
            difference = tf.cast(difference, x0.dtype)
            flat_x1 = tf.reshape(x1, [n, -1])
            b = tf.reduce_sum(w * flat_x1, -1) - difference  # hyperplane {z : w·z = b}
            # Project both the current point and the original point onto it (one batched call).
            projections = project(
                tf.concat([flat_x1, flat_x0], 0), tf.concat([w, w], 0), tf.concat([b, b], 0)
            )
            step_current = tf.reshape(projections[:n], tf.shape(x0))
            step_original = tf.reshape(projections[n:], tf.shape(x0))
            norm_current = tf.maximum(self._norms(step_current), 1e-8)
            norm_original = tf.maximum(self._norms(step_original), 1e-8)
            # Biased step: α = min(‖d_current‖/(‖d_current‖ + ‖d_original‖), α_max).
            alpha = per_example(
                tf.minimum(norm_current / (norm_current + norm_original), self.alpha_max)
            )
            x1 = tf.clip_by_value(
                (x1 + self.eta * step_current) * (1.0 - alpha)
                + (x0 + self.eta * step_original) * alpha,
                0.0,
                1.0,
            )
            # Any class but y counts (the reference's `is_adv`), not just the target.
            predicted = tf.argmax(model(x1, training=False), -1, output_type=tf.int32)
            is_adv = tf.not_equal(predicted, y)
            norm = self._norms(x1 - x0)
            improved = tf.logical_and(is_adv, norm < best_norm)
            best = tf.where(per_example(improved), x1, best)
            best_norm = tf.where(improved, norm, best_norm)
            # Backward step towards the original point once adversarial (β).
            x1 = tf.where(per_example(is_adv), x0 + self.beta * (x1 - x0), x1)
            return i + 1, x1, best, best_norm

        _, _, best, best_norm = tf.while_loop(
            lambda i, *_: i < self.steps, step, (tf.constant(0), x1, best, best_norm)
        )

        # FABAttack.perturb counts only points within ε that the model misclassifies.
        predicted = tf.argmax(model(best, training=False), -1, output_type=tf.int32)
        broken = tf.logical_and(best_norm <= self.eps, tf.not_equal(predicted, y))
        return best, broken
