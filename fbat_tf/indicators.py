"""Signs that an attack failed, so that its robust accuracy may overestimate robustness: the six
indicators of attack failure of Pintor et al. ("Indicators of Attack Failure: Debugging and
Improving Optimization of Adversarial Examples", NeurIPS 2022; pralab/IndicatorsOfAttackFailure,
src/indicators/indicators.py) per attack and ε, beside the reference AutoAttack's checks
(fbat_tf/checks.py). DESIGN.md §4.5.

    x, y = sample(split, result.clean_outcomes, points=32)   # the first clean-correct points
    checks = reference_checks(model, x, y, attacks)          # fbat_tf/checks.py: before them
    found = compute(model, x, y, attacks, result, seed=0)    # after them: a records.Indicators
    found.fired("pgd@8"), found.lines()

Each indicator counts the sample points on which it fires, among those the attack leaves robust
where it is about the attack's failure (a point the attack breaks is no overestimate):

- unavailable gradients (Pintor: the graph does not differentiate, or a point's gradient of the
  attack loss is zero): the input gradient is missing, or zero or non-finite, of CE at x or of
  DLR at APGD's random start (the reference AutoAttack's zero-gradient check). Gradient attacks.
- unstable predictions (Pintor: the mean over γ = 100 draws of |L(x) − L(x + u)| / |L(x)|, u
  uniform in [−r/2, r/2] per pixel, r = 8/255, their ε; capped at 1): here r is the attack's ε
  (for L2, u is rescaled to an L2 norm of ε/2) and a point fires above UNSTABLE_LOSS_CHANGE,
  this project's threshold (the reference reports the value, not a threshold); a point also
  fires where two calls on the same input differ (the reference AutoAttack's randomized check).
- incomplete optimization (Pintor: the attack loss along its iterates, rescaled to [0, 1] and
  made monotone, still moves by more than 0.05 over its last min(10, steps) values): the loss
  trace of one run of the attack itself (PGD: its first restart; APGD and AutoAttack: APGD's
  first run), on the points it leaves robust.
- silent success (Pintor: an iterate was adversarial, the returned point is not): the attack is
  run on the sample against a recorder of every point it queries; a point fires where a
  queried point inside its ball was misclassified and the returned one is not.
- transfer failure (Pintor: the surrogate's adversarial point is classified otherwise by the
  target): for attacks crafted on another model (`transfer`, a replayed exported file), points
  that fool the source and that the model attacked still classifies right.
- unconstrained attack failure (Pintor: with ε = ∞ the attack still fails on a point): PGD from
  x (no random start) with the box as its ball (L∞ ε = 1, L2 ε = √d) for a gradient attack,
  Square with the box as its ball for Square; points still right.

The reference AutoAttack's checks before it attacks, and Square's on its results, are in
fbat_tf/checks.py; `compute` records them beside the indicators.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf

from fbat_tf import classifiers, constraints, evaluation
from fbat_tf.attacks import losses
from fbat_tf.attacks.apgd import APGD
from fbat_tf.attacks.autoattack import AutoAttack
from fbat_tf.attacks.base import for_any_batch
from fbat_tf.attacks.pgd import PGD
from fbat_tf.attacks.square import Square
from fbat_tf.attacks.transfer import TransferAttack
from fbat_tf.checks import apgd_start, input_gradients, randomized, rows, square_beats_white_box
from fbat_tf.records import Check, Count, EvaluationResult, Indicators, units
from fbat_tf.records.indicators import INDICATORS

# How many clean-correct points of an evaluation the indicators look at (Pintor et al.'s demo
# runs 10): enough to tell a failing attack, cheap next to AutoAttack's time (bench/indicators.py).
POINTS = 32
# Pintor et al. (indicators.py): γ draws of noise for the unstable predictions indicator; the
# window and change of the incomplete optimization indicator.
UNSTABLE_DRAWS = 100
INCOMPLETE_WINDOW = 10
INCOMPLETE_CHANGE = 0.05
# This project's threshold on Pintor's unstable-predictions value (its mean relative loss change
# under noise of the attack's ε): the adversarially trained MLP of tests/data/l2_reference
# stays far below it at its ε (tests/test_indicators.py), a stochastic layer far above.
UNSTABLE_LOSS_CHANGE = 0.5
# Queries of the unconstrained Square: with the box as its ball its first stripes move every
# pixel to 0 or 1.
UNCONSTRAINED_QUERIES = 100


def sample(dataset: tf.data.Dataset, clean_outcomes: str, points: int = POINTS):
    """The first `points` examples of `dataset` (in evaluation order) that the clean pass got
    right (`clean_outcomes`, one "1" or "0" an example, EvaluationResult.clean_outcomes), as
    (x, y) tensors; None where it got none right."""
    wanted = [i for i, bit in enumerate(clean_outcomes) if bit == "1"][:points]
    if not wanted:
        return None
    xs, ys, at = [], [], 0
    for batch in dataset:
        x, y = batch[0], batch[1]
        size = int(x.shape[0])
        rows = [i - at for i in wanted if at <= i < at + size]
        if rows:
            xs.append(tf.gather(x, rows))
            ys.append(tf.gather(y, rows))
        at += size
        if at > wanted[-1]:
            break
    return tf.concat(xs, 0), tf.cast(tf.concat(ys, 0), tf.int32)


def _predicted(model: Callable, x: tf.Tensor) -> np.ndarray:
    return np.argmax(np.asarray(model(x, training=False)), -1)


def _right(model: Callable, x: tf.Tensor, y: tf.Tensor) -> np.ndarray:
    return _predicted(model, x) == np.asarray(y)


def _bad(grad: np.ndarray) -> np.ndarray:
    """Per example: the gradient is all zero, or not finite somewhere."""
    return (np.abs(grad).sum(1) == 0) | ~np.all(np.isfinite(grad), 1)


def unavailable_gradients(model, x, y, eps: float, norm: str, seed) -> np.ndarray:
    """Per point: the input gradient does not exist, or CE's at x or DLR's at APGD's random start
    is zero or non-finite (Pintor et al.; the reference AutoAttack's zero-gradient check)."""
    ce = input_gradients(model, x, lambda logits: losses.cross_entropy(logits, y))
    if ce is None:
        return np.ones(int(x.shape[0]), bool)
    bad = _bad(ce)
    if int(model(x[:1], training=False).shape[-1]) >= 3:
        start = apgd_start(x, eps, norm, constraints.as_seed(seed))
        dlr = input_gradients(model, start, lambda logits: losses.dlr(logits, y))
        bad |= np.ones_like(bad) if dlr is None else _bad(dlr)
    return bad


def _noisy(x: tf.Tensor, width: tf.Tensor, norm: str, seed: tf.Tensor, draw):
    """x plus Pintor et al.'s noise of draw `draw`, clipped to the box: uniform in [−ε/2, ε/2]
    per pixel (ε = `width`); for L2 rescaled to norm ε/2."""
    seed = tf.random.experimental.stateless_fold_in(seed, draw)
    u = (tf.random.stateless_uniform(tf.shape(x), seed, dtype=x.dtype) - 0.5) * width
    if norm == "l2":
        u = u / (rows(constraints.l2_norms(u), u) + 1e-12) * (width / 2)
    return tf.clip_by_value(x + u, 0.0, 1.0)


def _graph_loop(model, x, y, width, seed, draws, norm: str, dtype: tf.DType) -> tf.Tensor:
    """CE at the noisy x of draws 0, ..., draws − 1, [draws, batch], the draws a graph loop."""

    def draw(index, found):
        logits = model(_noisy(x, width, norm, seed, index), training=False)
        return index + 1, found.write(index, losses.cross_entropy(logits, y))

    found = tf.TensorArray(dtype, size=draws)
    _, found = tf.while_loop(lambda index, _: index < draws, draw, (tf.constant(0), found))
    return found.stack()


# Classifiers whose call runs one graph function (a Keras model's with its weights folded in,
# a SavedModel's signature): the draws run as one graph loop that calls it, with the losses of
# calling it once per draw, bit for bit. A Keras model is called as it is, layer by layer, once
# per draw: traced into a graph, Grappler rewrites some of its ops (the softplus activation's
# division by β becomes a product with 1/β), which moves the last bits of the losses.
_GRAPHS = (classifiers.InferenceGraph, classifiers.SavedModelClassifier)
_graph_loops: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _losses_under_noise(model, x, y, eps: float, norm: str, seed, dtype) -> np.ndarray:
    """CE at each of the UNSTABLE_DRAWS noisy copies of x, [UNSTABLE_DRAWS, batch], draw i's
    noise from the stateless seed fold_in(seed, i): one graph for a model of `_GRAPHS`
    (traced once for every batch size), else the model called once per draw, eagerly."""
    width = tf.constant(eps, x.dtype)
    draws = tf.constant(UNSTABLE_DRAWS)
    if isinstance(model, _GRAPHS):
        if model not in _graph_loops:
            _graph_loops[model] = tf.function(_graph_loop, autograph=False, jit_compile=False)
        loop = _graph_loops[model]
        return np.asarray(
            for_any_batch(loop, model, x, y, width, seed, draws, norm, dtype, batched=2)
        )
    return np.stack(
        [
            np.asarray(
                losses.cross_entropy(model(_noisy(x, width, norm, seed, draw), training=False), y)
            )
            for draw in range(UNSTABLE_DRAWS)
        ]
    )


def unstable_values(model, x, y, eps: float, norm: str, seed) -> np.ndarray:
    """Pintor et al.'s unstable-predictions value per point: the mean over UNSTABLE_DRAWS
    noisy copies of |CE(x) − CE(x + u)| / |CE(x)| (1 where CE(x) is 0), capped at 1."""
    reference = np.asarray(losses.cross_entropy(model(x, training=False), y))
    scale = np.where(reference == 0, 1.0, np.abs(reference))
    seed = constraints.as_seed(seed)
    drawn = _losses_under_noise(model, x, y, eps, norm, seed, tf.as_dtype(reference.dtype))
    total = np.zeros_like(reference)
    for loss in drawn:
        total += np.abs(reference - loss) / scale
    return np.minimum(total / UNSTABLE_DRAWS, 1.0)


def incomplete(trace: np.ndarray) -> np.ndarray:
    """Pintor et al.'s incomplete optimization per point, of a loss the attack maximizes,
    [steps + 1, points]: rescaled to [0, 1] (left as it is where it is constant at 0), made the
    running best, its change over the last min(INCOMPLETE_WINDOW, length) values above
    INCOMPLETE_CHANGE."""
    best = np.maximum.accumulate(np.asarray(trace, np.float64), axis=0)
    low, high = best.min(0), best.max(0)
    span = np.where(high - low > 0, high - low, 1.0)
    rescaled = (best - low) / span
    last = rescaled[-min(INCOMPLETE_WINDOW, len(rescaled)) :]
    return last.max(0) - last.min(0) > INCOMPLETE_CHANGE


class Recorder:
    """The model an attack is given, watching what it is asked: `found[j]` becomes True once a
    point inside sample point j's ball (ε in `norm`) that the model misclassifies is queried.
    The attack may query any subset or repetition of the rows, in any order: each query row is
    matched to the sample points whose ball holds it."""

    def __init__(self, model: Callable, x: tf.Tensor, y: tf.Tensor, eps: float, norm: str):
        self.model, self.eps, self.norm = model, float(eps), norm
        self.points = tf.reshape(tf.cast(x, tf.float32), [int(x.shape[0]), -1])
        self.labels = tf.cast(y, tf.int32)
        self.found = tf.Variable(tf.zeros([int(x.shape[0])], tf.bool), trainable=False)

    @property
    def compute_dtype(self):
        return getattr(self.model, "compute_dtype", "float32")

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        logits = self.model(x, training=training)
        queried = tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], -1])
        gaps = queried[:, None, :] - self.points[None, :, :]
        if self.norm == "linf":
            distance = tf.reduce_max(tf.abs(gaps), -1)
        else:
            distance = tf.norm(gaps, axis=-1)
        inside = distance <= self.eps * (1 + 1e-5) + 1e-6
        predicted = tf.argmax(logits, -1, output_type=tf.int32)
        wrong = tf.not_equal(predicted[:, None], self.labels[None, :])
        self.found.assign(tf.logical_or(self.found, tf.reduce_any(inside & wrong, 0)))
        return logits


def _trace_of(attack) -> Callable | None:
    """What gives the attack's loss trace (PGD, APGD; AutoAttack: its first APGD part)."""
    if isinstance(attack, PGD | APGD):
        return attack.loss_trace
    if isinstance(attack, AutoAttack):
        for part in attack.attacks.values():
            if isinstance(part, APGD):
                return part.loss_trace
    return None


def _box(x: tf.Tensor, norm: str) -> float:
    """The radius of a ball that holds the whole [0, 1] box around any point."""
    return 1.0 if norm == "linf" else float(np.sqrt(np.prod(x.shape[1:])))


def _unconstrained(model, crafted_on, x, y, attack, gradients: bool, norm: str, seed):
    """Per point: still right after the attack's family (PGD for one that reads `gradients`,
    else Square) with the box as its ball."""
    radius = _box(x, norm)
    if not gradients:
        unbounded = Square(radius, n_queries=UNCONSTRAINED_QUERIES, p_init=0.8, norm=norm)
    else:
        steps = attack.steps if isinstance(attack, PGD) else 50
        if isinstance(attack, TransferAttack) and isinstance(attack.attack, PGD):
            steps = attack.attack.steps
        unbounded = PGD(radius, steps, 1, random_start=False, norm=norm)
    x_adv, _ = unbounded(crafted_on, x, y, seed)
    return _right(model, x_adv, y)


def compute(
    model: Callable,
    x: tf.Tensor,
    y: tf.Tensor,
    attacks: Mapping[tuple[str, float], Callable],
    result: EvaluationResult | None = None,
    seed: int = 0,
    checks: Mapping[str, Check] | None = None,
) -> Indicators:
    """The six indicators for each attack and ε of `attacks` (as evaluation.evaluate was given
    them) on the sample (x, y) of clean-correct points, and `checks` (reference_checks, with
    Square's from `result`). An attack the evaluation could not run (no input gradients)
    fires unavailable gradients on every point, and no other."""
    start = time.perf_counter()
    n = int(x.shape[0])
    problem = evaluation.gradient_problem(model, x, y)

    def key(name):
        norm = getattr(attacks[name], "norm", "linf")
        return units.key(name[0], units.in_flag_units(name[1], norm), norm)

    running, _ = evaluation.applicable(attacks, problem, key)
    found: dict[str, dict[str, Count | None]] = {}
    unconstrained: dict[str, np.ndarray] = {}
    for index, (name, attack) in enumerate(attacks.items()):
        eps, norm = name[1], getattr(attack, "norm", "linf")
        seeded = tf.constant([seed, index], tf.int32)
        counts: dict[str, Count | None] = dict.fromkeys(INDICATORS)
        if name not in running:
            counts["unavailable_gradients"] = Count(n, n)
            found[key(name)] = counts
            continue
        attack = running[name]
        transfer = isinstance(attack, TransferAttack)
        crafted_on = attack.source if transfer else model
        # An ensemble reduced to its gradient-free parts: every point fires unavailable gradients.
        reduced = attack is not attacks[name]
        gradients = (transfer or getattr(attack, "needs_gradients", True)) and not reduced
        if reduced:
            counts["unavailable_gradients"] = Count(n, n)
        elif gradients:
            bad = unavailable_gradients(crafted_on, x, y, eps, norm, seeded)
            counts["unavailable_gradients"] = Count(int(bad.sum()), n)
        unstable = unstable_values(crafted_on, x, y, eps, norm, seeded) > UNSTABLE_LOSS_CHANGE
        unstable |= randomized(crafted_on, x, y)
        if transfer:
            x_adv, _ = attack(model, x, y, seeded)
            fooled_source = ~_right(crafted_on, x_adv, y)
            survived = _right(model, x_adv, y)
            counts["transfer_failure"] = Count(int((fooled_source & survived).sum()), n)
        elif (
            getattr(attack, "keeps_adversarial", False)
            and (held := _held(result, key(name), n)) is not None
        ):
            survived = held  # it cannot succeed silently (Attack.keeps_adversarial)
        else:
            recorder = Recorder(model, x, y, eps, norm)
            x_adv, _ = attack(recorder, x, y, seeded)
            survived = _right(model, x_adv, y)
            silent = recorder.found.numpy() & survived
            counts["silent_success"] = Count(int(silent.sum()), n)
        counts["unstable_predictions"] = Count(int((unstable & survived).sum()), n)
        trace = _trace_of(attack.attack if transfer else attack)
        if trace is not None:
            losses_, broken = trace(crafted_on, x, y, seeded)
            still = incomplete(np.asarray(losses_)) & ~np.asarray(broken)
            counts["incomplete_optimization"] = Count(int(still.sum()), n)
        if name[0] not in unconstrained:
            unconstrained[name[0]] = _unconstrained(
                model, crafted_on, x, y, attack, gradients, norm, seeded
            )
        counts["unconstrained_attack_failure"] = Count(int(unconstrained[name[0]].sum()), n)
        found[key(name)] = counts
    every = dict(checks or {})
    if result is not None:
        every["square_beats_white_box"] = square_beats_white_box(result)
    return Indicators(n, found, every, time.perf_counter() - start)


def _held(result: EvaluationResult | None, key: str, n: int) -> np.ndarray | None:
    """Whether each of the sample's n points survived `key` in the evaluation, or None."""
    if result is None or key not in result.outcomes or not result.clean_outcomes:
        return None
    wanted = [i for i, bit in enumerate(result.clean_outcomes) if bit == "1"][:n]
    held = result.outcome(key)
    return held[wanted] if len(wanted) == n else None
