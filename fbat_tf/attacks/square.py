"""Square Attack (Andriushchenko et al., 2020), untargeted: L∞ as AutoAttack "standard" runs it,
and the L2 form of the same reference (fra31/auto-attack).

    attack = Square(eps=8 / 255)                 # n_queries=5000, p_init=0.8, margin loss
    x_adv, _ = attack(model, x, y, seed=0)       # x_adv ∈ C; x itself where Square found nothing
    Square(eps=8 / 255, n_queries=10000, restarts=5)   # a stronger black-box check
    Square(eps=0.5, norm="l2")                   # ε in [0, 1]-pixel units, over a whole image

A black-box, score-based random search: it only reads the model's logits (model(x,
training=False)), never a gradient. From a start of vertical stripes of ±ε it proposes, once per
query, a random square window whose pixels are set to the opposite ±ε per channel, and keeps a
candidate for an example only if it lowers that example's margin logit_y − max_{i≠y} logit_i
(float32). Examples already misclassified are not queried again. The square's area follows the
piecewise-constant schedule `p_selection`:

    p_selection(0.8, it=100, n_queries=5000)     # 0.2 = p_init / 4

AutoAttack builds its SquareAttack with `resc_schedule=False`, so the schedule reads the absolute
query count (the default here); `rescale_schedule=True` stretches it to the query budget as the
reference's SquareAttack does when used alone.

The L2 form (square_l2.py) searches the same way, with the same acceptance and schedule, from
another start and with other candidates: from a grid of ±eta tiles (centred-square patterns,
half positive, half negative) scaled to ‖δ‖₂ = ε, each query moves the perturbation of two random
windows into one of them, adding a new ±eta pattern there, and rescales the whole to ‖δ‖₂ = ε
before clipping to [0, 1]. Its windows' sides are odd and at least 3 pixels.

Restarts, as the reference's `n_restarts`: after the first search, each restart searches again
from a new random start, with `n_queries` queries of its own, on the examples still
classified correctly, and an example broken by any search keeps the point that broke it.
Search r ≥ 1 draws from stateless_fold_in(seed, r) and the first from the seed itself, so the
first search of R restarts is the single search of restarts=1: R restarts break every example
that one breaks, and more. AutoAttack runs one (5000 queries, 1 restart).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.attacks import square_l2
from fbat_tf.attacks.base import Attack, Loop

# The reference's `p_selection` breakpoints, in queries of a 10,000-query budget: past the k-th
# one, p = p_init / 2^k.
P_SCHEDULE_BREAKPOINTS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)


def p_selection(p_init: float, it: int, n_queries: int, rescale: bool = False) -> float:
    """Fraction p of the image's pixels a square covers at query `it` (0-based).

    p = p_init / 2^k with k the number of breakpoints (10, 50, 200, ..., 8000) strictly below
    `it`; with `rescale` the count is first mapped to a 10,000-query budget,
    it ← int(it / n_queries · 10000) (the reference's `resc_schedule`; AutoAttack turns it off).
    """
    if rescale:
        it = int(it / n_queries * 10000)
    halvings = sum(1 for breakpoint in P_SCHEDULE_BREAKPOINTS if it > breakpoint)
    return p_init / 2**halvings


def square_side(p: float, height: int, width: int) -> int:
    """Side s = max(round(√(p·H·W)), 1) of a square covering a fraction p of the pixels."""
    # The reference: max(int(round(sqrt(p · n_features / c))), 1); Python's round, like torch's,
    # rounds halves to even. Capped at the shorter side, which only non-square images reach.
    return min(max(int(round(math.sqrt(p * height * width))), 1), height, width)


class Square(Attack):
    keeps_adversarial = True  # its kept point per example is the first or best adversarial one
    needs_gradients = False  # it reads the model's outputs only
    """Square Attack, L∞ or L2 (untargeted); see the module docstring.

    eps: the radius, in [0, 1]-pixel units. norm: "linf" or "l2" (‖δ‖₂ over all of one image's
    pixels). n_queries: queries per example after the initial one, per restart
    (AutoAttack: 5000). restarts: searches from new random starts on the examples still robust
    (AutoAttack: 1). p_init: initial fraction of pixels per square (0.8). loss: "margin"
    (AutoAttack) or "ce" (accept when −CE drops). rescale_schedule: stretch the p-schedule to
    n_queries (off in AutoAttack). jit_compile: compile the search with XLA (None, the default:
    `base.xla_pays`, i.e. on a GPU, and on a CPU for a model without convolutions).
    """

    def __init__(
        self,
        eps: float,
        n_queries: int = 5000,
        p_init: float = 0.8,
        restarts: int = 1,
        loss: str = "margin",
        rescale_schedule: bool = False,
        jit_compile: bool | None = None,
        norm: str = "linf",
    ):
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        if n_queries < 0:
            raise ValueError(f"n_queries must be >= 0, got {n_queries!r}")
        if restarts < 1:
            raise ValueError(f"restarts must be >= 1, got {restarts!r}")
        if not 0 < p_init <= 1:
            raise ValueError(f"p_init must be in (0, 1], got {p_init!r}")
        if loss not in ("margin", "ce"):
            raise ValueError(f"loss must be 'margin' or 'ce', got {loss!r}")
        self.eps = float(eps)
        self.n_queries = int(n_queries)
        self.p_init = float(p_init)
        self.restarts = int(restarts)
        self.loss = loss
        self.rescale_schedule = bool(rescale_schedule)
        self.norm = constraints.check_norm(norm)
        # The searches' batch-first arguments: x, y and the start (L2: and the windows' signs).
        search, batched = (self._search, 3) if self.norm == "linf" else (self._search_l2, 4)
        self._run = Loop(search, jit_compile, batched=batched, dense_on_cpu=True)
        self._recording = Loop(search, False, batched=batched)

    def perturb(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        x = tf.convert_to_tensor(x)
        y = tf.cast(tf.convert_to_tensor(y), tf.int32)
        x_adv = self._attack(model, x, y, seed, record=False)[0]
        for restart in range(1, self.restarts):
            # The examples still classified correctly: clean-correct ones Square has not broken
            # (an unbroken example's point is its clean input).
            predicted = tf.argmax(model(x_adv, training=False), -1, output_type=tf.int32)
            index = tf.where(tf.equal(predicted, y))[:, 0]
            if int(tf.size(index)) == 0:
                break
            x_sub, y_sub = tf.gather(x, index), tf.gather(y, index)
            restart_seed = tf.random.experimental.stateless_fold_in(seed, restart)
            candidate = self._attack(model, x_sub, y_sub, restart_seed, record=False)[0]
            predicted = tf.argmax(model(candidate, training=False), -1, output_type=tf.int32)
            broken = tf.not_equal(predicted, y_sub)
            x_adv = tf.tensor_scatter_nd_update(
                x_adv, tf.boolean_mask(index, broken)[:, None], tf.boolean_mask(candidate, broken)
            )
        return x_adv

    def attack_with_history(
        self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: int | tf.Tensor
    ) -> tuple[tf.Tensor, np.ndarray]:
        """x_adv and the kept point per example after the start and after each query.

        history[q] is the current best point of every example after query q (q = 0: the stripe
        start; clean-misclassified examples stay at x). The first search only, whatever
        `restarts` says. For tests and diagnostics: it holds (queries + 1) copies of the batch.
        """
        return self._attack(model, x, y, constraints.as_seed(seed), record=True)

    def _attack(
        self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor, record: bool
    ):
        x = tf.convert_to_tensor(x)
        y = tf.cast(tf.convert_to_tensor(y), tf.int32)
        if len(x.shape) != 4:
            raise ValueError(f"Square needs NHWC images, got shape {x.shape}")
        height, width = int(x.shape[1]), int(x.shape[2])
        sides = self._sides(height, width)
        # SquareAttack.perturb attacks the clean-correct examples only.
        predicted = tf.argmax(model(x, training=False), -1, output_type=tf.int32)
        index = tf.where(tf.equal(predicted, y))[:, 0]
        history = None
        if int(tf.size(index)) == 0:
            if record:
                history = np.asarray(x)[None]
            return x, history
        # The history's frames grow with the queries asked: a plain graph (XLA needs a size).
        run = self._recording if record else self._run
        rows = run.padded(model, x, index)
        x_sub, y_sub = tf.gather(x, rows), tf.gather(y, rows)
        x_best, frames = run(model, x_sub, y_sub, *self._inputs(seed, x_sub.shape, sides), record)
        x_best, y_sub = x_best[: int(tf.size(index))], y_sub[: int(tf.size(index))]
        predicted = tf.argmax(model(x_best, training=False), -1, output_type=tf.int32)
        broken = tf.not_equal(predicted, y_sub)
        broken_index = tf.boolean_mask(index, broken)[:, None]
        x_adv = tf.tensor_scatter_nd_update(x, broken_index, tf.boolean_mask(x_best, broken))
        if record:
            history = np.repeat(np.asarray(x)[None], frames.shape[0], axis=0)
            history[:, index.numpy()] = frames.numpy()
        return x_adv, history

    def _sides(self, height: int, width: int) -> list[int]:
        """The square's side at every query."""
        side = square_side if self.norm == "linf" else square_l2.query_side
        return [
            side(p_selection(self.p_init, it, self.n_queries, self.rescale_schedule), height, width)
            for it in range(self.n_queries)
        ]

    def _inputs(self, seed: tf.Tensor, shape: tf.TensorShape, sides: list[int]) -> tuple:
        """The search's arguments after (x, y), for a batch of `shape`: its draws from `seed`
        and the square sides `sides` (L∞: `_search`'s; L2: `_search_l2`'s)."""
        if self.norm == "linf":
            stripes, corners, signs = self._draws(seed, shape, sides)
            return stripes, tf.constant(sides, tf.int32), corners, signs
        draws = square_l2.draws(seed, shape, sides)
        start = square_l2.start(draws.start_signs, draws.start_flips, shape[1], shape[2])
        table, table_rows = square_l2.pattern_table(sides)
        sides = tf.constant(sides, tf.int32)
        return start, draws.signs, sides, table, table_rows, draws.corners, draws.flips

    def _margin_and_loss(
        self, model: keras.Model, x: tf.Tensor, y: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The reference's `margin_and_loss`, untargeted: (margin, the loss to lower)."""
        logits = tf.cast(model(x, training=False), tf.float32)
        is_label = tf.one_hot(y, tf.shape(logits)[-1], on_value=True, off_value=False)
        label_logit = tf.reduce_max(tf.where(is_label, logits, -np.inf), -1)
        other_logit = tf.reduce_max(tf.where(is_label, -np.inf, logits), -1)
        margin = label_logit - other_logit
        if self.loss == "margin":
            return margin, margin
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        return margin, -ce

    @staticmethod
    def _draws(seed: tf.Tensor, shape: tf.TensorShape, sides: list[int]):
        """Every random draw of a search on a batch of `shape`, made before it (an XLA-compiled
        search would draw other numbers from the same seed): the stripe start's signs
        [n, 1, W, C], one ±ε per example, column and channel; and per query the window's corner
        (top, left) [queries, 2] and its per-channel signs [queries, C], one for the batch.

        As the reference's random_int(0, H − s), a corner is in {0, ..., H − s − 1} (0 when
        s = H)."""
        n, height, width, channels = shape
        start_seed, position_seed, signs_seed = tf.unstack(
            tf.random.experimental.stateless_split(seed, 3)
        )

        def random_signs(shape: list[int], signs_seed: tf.Tensor) -> tf.Tensor:
            bits = tf.random.stateless_uniform(shape, signs_seed, 0, 2, dtype=tf.int32)
            return tf.cast(2 * bits - 1, tf.float32)

        uniform = tf.random.stateless_uniform([len(sides), 2], position_seed, dtype=tf.float32)
        room = tf.constant([[height, width]], tf.float32) - tf.constant(sides, tf.float32)[:, None]
        corners = tf.cast(uniform * room, tf.int32)
        stripes = random_signs([n, 1, width, channels], start_seed)
        return stripes, corners, random_signs([len(sides), channels], signs_seed)

    def _search(
        self,
        model: keras.Model,
        x: tf.Tensor,
        y: tf.Tensor,
        stripes: tf.Tensor,
        sides: tf.Tensor,
        corners: tf.Tensor,
        signs: tf.Tensor,
        record: bool,
    ) -> tuple[tf.Tensor, tf.Tensor | None]:
        """The reference's `attack_single_run`, L∞ branch, on clean-correct examples, with the
        draws of `_draws` for the square sides `sides`."""
        height, width = x.shape[1], x.shape[2]
        eps = tf.cast(self.eps, x.dtype)
        stripes, signs = tf.cast(stripes, x.dtype), tf.cast(signs, x.dtype)
        rows, cols = tf.range(height), tf.range(width)
        # The window's pixels go back into x + C by one clip to these bounds.
        lower, upper = constraints.ball_bounds(x, eps)

        def candidate(query, lower, upper, x_best):
            side, top, left = sides[query], corners[query, 0], corners[query, 1]
            in_rows = tf.logical_and(rows >= top, rows < top + side)
            in_cols = tf.logical_and(cols >= left, cols < left + side)
            window = tf.cast(tf.logical_and(in_rows[:, None], in_cols[None, :]), x.dtype)
            # ±2ε per channel inside the window, then back into C: each window pixel lands on
            # x ± ε (or the image bound), flipped or kept.
            change = 2.0 * eps * window[None, :, :, None] * signs[query]
            return tf.clip_by_value(x_best + change, lower, upper)

        def rows_of(query):
            return lower, upper

        # Stripe start: ±ε constant down each column.
        x_best = tf.clip_by_value(x + eps * stripes, 0.0, 1.0)
        return self._random_search(model, y, x_best, tf.shape(sides)[0], candidate, rows_of, record)

    def _search_l2(
        self,
        model: keras.Model,
        x: tf.Tensor,
        y: tf.Tensor,
        start: tf.Tensor,
        signs: tf.Tensor,
        sides: tf.Tensor,
        table: tf.Tensor,
        table_rows: tf.Tensor,
        corners: tf.Tensor,
        flips: tf.Tensor,
        record: bool,
    ) -> tuple[tf.Tensor, tf.Tensor | None]:
        """The reference's `attack_single_run`, L2 branch, on clean-correct examples: from the
        direction `start` (square_l2.start), with the draws of square_l2.draws, the square sides
        `sides` and their patterns (square_l2.pattern_table: `table`, each query's row of it)."""
        height, width = x.shape[1], x.shape[2]
        eps = tf.cast(self.eps, x.dtype)
        table, signs = tf.cast(table, x.dtype), tf.cast(signs, x.dtype)

        def candidate(query, x, signs, x_best):
            side, corner = sides[query], corners[query]
            window_1 = square_l2.window(side, corner[0, 0], corner[0, 1], height, width, x.dtype)
            window_2 = square_l2.window(side, corner[1, 0], corner[1, 1], height, width, x.dtype)
            padded = table[table_rows[query]]
            pattern = square_l2.placed(padded, flips[query], corner[0, 0], corner[0, 1], window_1)
            return square_l2.candidate(x, x_best, eps, signs, pattern, window_1, window_2)

        def rows_of(query):
            return x, tf.gather(signs, query, axis=1)  # window 1's signs at this query

        x_best = square_l2.on_sphere(x, tf.cast(start, x.dtype), eps)
        return self._random_search(model, y, x_best, tf.shape(sides)[0], candidate, rows_of, record)

    def _keep_better(self, model, x_new, y, x_best, margin_min, loss_min):
        """(points, margins, losses) kept after a query with candidates `x_new`: an example takes
        its candidate if the loss drops or the candidate is misclassified (the reference's
        idx_improved / idx_miscl; with the margin loss both mean a lower margin)."""
        margin, loss = self._margin_and_loss(model, x_new, y)
        lowered = loss < loss_min
        accepted = tf.logical_or(lowered, margin <= 0.0)
        return (
            tf.where(accepted[:, None, None, None], x_new, x_best),
            tf.where(accepted, margin, margin_min),
            tf.where(lowered, loss, loss_min),
        )

    def _random_search(self, model, y, x_best, n_queries, candidate, rows_of, record):
        """The search both norms share, the reference's `attack_single_run` after its start: at
        each query, on the examples still classified correctly, `candidate(query, *rows,
        x_best)` (`rows`: those examples' rows of the batch-first tensors `rows_of(query)`)
        replaces an example's point as `_keep_better` says. Ends
        after `n_queries` queries or once every example is broken: (x_best, and if `record` the
        points after the start and each query)."""
        margin_min, loss_min = self._margin_and_loss(model, x_best, y)
        frames = tf.TensorArray(x_best.dtype, size=0, dynamic_size=True, element_shape=x_best.shape)
        if record:
            frames = frames.write(0, x_best)

        def searching(query, x_best, margin_min, loss_min, frames):
            return tf.logical_and(query < n_queries, tf.reduce_any(margin_min > 0.0))

        def propose(query, rows, x_best, y, margin_min, loss_min):
            """One query on the given rows: their new best points, margins and losses."""
            x_new = candidate(query, *rows, x_best)
            return self._keep_better(model, x_new, y, x_best, margin_min, loss_min)

        def on_every_row(query, x_best, margin_min, loss_min):
            return propose(query, rows_of(query), x_best, y, margin_min, loss_min)

        def on_active_rows(query, x_best, margin_min, loss_min):
            # Only examples still classified correctly are queried again.
            active = tf.where(margin_min > 0.0)
            proposed = propose(
                query,
                tuple(tf.gather_nd(v, active) for v in rows_of(query)),
                *(tf.gather_nd(v, active) for v in (x_best, y, margin_min, loss_min)),
            )
            return tuple(
                tf.tensor_scatter_nd_update(v, active, new)
                for v, new in zip((x_best, margin_min, loss_min), proposed, strict=True)
            )

        def search(query, x_best, margin_min, loss_min, frames):
            # While no example is broken (most of the search on robust ones), every row is
            # queried, without gathering and scattering them.
            x_best, margin_min, loss_min = tf.cond(
                tf.reduce_all(margin_min > 0.0),
                lambda: on_every_row(query, x_best, margin_min, loss_min),
                lambda: on_active_rows(query, x_best, margin_min, loss_min),
            )
            query += 1
            if record:
                frames = frames.write(query, x_best)
            return query, x_best, margin_min, loss_min, frames

        # A graph loop written out: tracing needs no AutoGraph rewriting.
        _, x_best, _, _, frames = tf.while_loop(
            searching, search, (tf.constant(0), x_best, margin_min, loss_min, frames)
        )
        return x_best, frames.stack() if record else None
