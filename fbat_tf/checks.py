"""The checks the reference AutoAttack runs before it attacks (fra31/auto-attack,
autoattack/checks.py; thresholds its defaults), and Square's on its results. DESIGN.md §4.5.

    checks = reference_checks(model, x, y, attacks)   # {"randomized": Check, ...}, first batch
    square_beats_white_box(result)                     # after AutoAttack

A randomized model (RANDOMIZED_CALLS calls on the same batch: another count of right points, or
L2-normalized outputs more than RANDOMIZED_DIFFERENCE apart), softmax outputs (all below
1 + SOFTMAX_TOLERANCE, above −SOFTMAX_TOLERANCE, rows summing to 1 within it), zero gradients
(a point the model classifies right whose DLR gradient at APGD's random start is all zero; the
reference checks the points APGD attacks, and on a point whose label ranks third the DLR loss is
the constant 1), Square beating the white-box parts (its robust accuracy more than SQUARE_MARGIN
below theirs), a dynamic model (the reference watches PyTorch's autograd calls during inference;
here: gradient ops in the model's inference graph) and the class count (DLR needs 3 classes,
targeted DLR 4, and APGD-T's and FAB-T's targets one more than they are). The indicators of
attack failure (fbat_tf/indicators.py) use the gradient helpers here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.attacks import losses
from fbat_tf.attacks.masking import BLACK_BOX
from fbat_tf.records import Check, EvaluationResult

# The reference AutoAttack's defaults.
RANDOMIZED_CALLS = 5
RANDOMIZED_DIFFERENCE = 1e-4
SOFTMAX_TOLERANCE = 1e-5
SQUARE_MARGIN = 0.002


def input_gradients(model: Callable, x: tf.Tensor, loss: Callable) -> np.ndarray | None:
    """The input gradient of Σ loss(model(x)) per example, flattened; None where unavailable."""
    try:
        _, grad = losses.input_gradient(lambda x: loss(model(x, training=False)), x)
    except losses.UnavailableGradientError:
        return None
    return np.asarray(grad).reshape([int(x.shape[0]), -1])


def apgd_start(x: tf.Tensor, eps: float, norm: str, seed: tf.Tensor) -> tf.Tensor:
    """APGD's random start (the reference's, attacks/apgd.py)."""
    if norm == "linf":
        u = constraints.uniform_noise(x, 1.0, seed)
        top = tf.reduce_max(tf.abs(tf.reshape(u, [tf.shape(u)[0], -1])), axis=1)
        lower, upper = constraints.ball_bounds(x, eps)
        return tf.clip_by_value(x + eps * u / (rows(top, u) + 1e-12), lower, upper)
    t = tf.random.stateless_normal(tf.shape(x), seed, dtype=x.dtype)
    return tf.clip_by_value(x + eps * t / (rows(constraints.l2_norms(t), t) + 1e-12), 0.0, 1.0)


def rows(values: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    return tf.reshape(values, [-1] + [1] * (len(like.shape) - 1))


def randomized(model, x, y) -> np.ndarray:
    """Per point, as the reference AutoAttack's randomized check: RANDOMIZED_CALLS calls on the
    same input whose outputs, each L2-normalized, differ by more than RANDOMIZED_DIFFERENCE, or
    whose prediction is right in one call and wrong in another."""
    outputs = [np.asarray(model(x, training=False), np.float64) for _ in range(RANDOMIZED_CALLS)]
    normed = [o / (np.linalg.norm(o, axis=1, keepdims=True) + 1e-10) for o in outputs]
    spread = np.zeros(int(x.shape[0]))
    for i, a in enumerate(normed):
        for b in normed[i + 1 :]:
            spread = np.maximum(spread, np.linalg.norm(a - b, axis=1))
    right = np.stack([np.argmax(o, -1) == np.asarray(y) for o in outputs])
    return (spread > RANDOMIZED_DIFFERENCE) | (right.any(0) & ~right.all(0))


def square_beats_white_box(result: EvaluationResult) -> Check:
    """The reference AutoAttack's check on its results: Square's robust accuracy more than
    SQUARE_MARGIN below the least of the parts before it."""
    fired, said = [], []
    for attacked in result.robust:
        parts = {k: v for k, v in attacked.parts.items() if k != "clean"}
        if BLACK_BOX not in parts or len(parts) < 2:
            continue
        before = min(v for k, v in parts.items() if k != BLACK_BOX)
        gap = before - parts[BLACK_BOX]
        if gap > SQUARE_MARGIN:
            fired.append(attacked.key)
            said.append(f"{attacked.key}: Square took it {100 * gap:.2f} points below the others")
    return Check(bool(fired), "; ".join(said), tuple(fired))


def dynamic(model: Callable, x: tf.Tensor) -> set[str]:
    """The gradient ops of the model's inference graph on inputs like x: a model that
    differentiates at inference (a defence that optimizes its input) holds some."""
    from fbat_tf.attacks.base import graph_ops

    return {
        op
        for op in graph_ops(model, x)
        if op.endswith(("Grad", "GradV2", "Gradient")) or "BackpropFilter" in op
    }


def class_count(classes: int, attacks: Mapping) -> str | None:
    """The reference's class-count check on the attacks asked for: what cannot work with
    `classes` classes, in words; None where all can."""
    parts = []
    for attack in attacks.values():
        parts.extend(getattr(attack, "attacks", {}).values() or [attack])
    problems = []
    for part in parts:
        loss, targets = getattr(part, "loss", None), getattr(part, "n_target_classes", None)
        targeted = loss == "dlr_targeted" or type(part).__name__ == "FAB"
        if loss in ("dlr", "dlr_targeted") and classes <= 2:
            problems.append(f"the DLR loss needs 3 classes, the model has {classes}")
        elif loss == "dlr_targeted" and classes == 3:
            problems.append("the targeted DLR loss needs 4 classes, the model has 3")
        elif targeted and targets is not None and targets + 1 > classes:
            problems.append(
                f"{type(part).__name__} uses {targets} target classes, {classes - 1} possible"
            )
    return "; ".join(dict.fromkeys(problems)) or None


def zero_gradients(
    model: Callable,
    x: tf.Tensor,
    y: tf.Tensor,
    eps: float,
    norm: str,
    seed: int = 0,
    outputs: np.ndarray | None = None,
) -> Check:
    """The reference's zero-gradient check: the DLR gradient at APGD's random start in the
    ball of (ε, norm), on the points the model classifies right (the points APGD attacks; on
    a point whose label ranks third the DLR loss is the constant 1); every point where no
    input gradient exists. `outputs`: the model's on x, where the caller has them."""
    y = tf.cast(y, tf.int32)
    if outputs is None:
        outputs = np.asarray(model(x, training=False), np.float64)
    start = apgd_start(x, eps, norm, constraints.as_seed(seed))
    grad = input_gradients(model, start, lambda logits: losses.dlr(logits, y))
    if grad is None:
        return Check(True, f"{len(outputs)} of {len(outputs)} points: no input gradient exists")
    right = outputs.argmax(-1) == y.numpy()
    zero = right & (np.abs(grad).sum(1) == 0)
    return Check(
        bool(zero.any()),
        f"{int(zero.sum())} of the {int(right.sum())} points the model classifies right: "
        "the DLR gradient is zero",
    )


def reference_checks(
    model: Callable, x: tf.Tensor, y: tf.Tensor, attacks: Mapping, seed: int = 0
) -> dict[str, Check]:
    """The reference AutoAttack's checks before it attacks, on the batch (x, y) (the reference
    takes its first batch): randomized, softmax outputs, zero gradients (DLR at APGD's random
    start at the first ε, on the points the model classifies right: the reference checks the
    points APGD attacks, and on a point whose label ranks third the DLR loss is the constant
    1), dynamic model, class count. Square's is `square_beats_white_box`."""
    y = tf.cast(y, tf.int32)
    outputs = np.asarray(model(x, training=False), np.float64)
    random_points = randomized(model, x, y)
    softmax = bool(
        outputs.max() < 1 + SOFTMAX_TOLERANCE
        and outputs.min() > -SOFTMAX_TOLERANCE
        and bool(np.all(np.abs(outputs.sum(-1) - 1) < SOFTMAX_TOLERANCE))
    )
    checks = {
        "randomized": Check(
            bool(random_points.any()),
            f"{int(random_points.sum())} of {len(random_points)} points give other outputs "
            "when called again on the same input",
        ),
        "softmax_outputs": Check(
            softmax,
            "the outputs are probabilities, not logits"
            if softmax
            else "the outputs are logits (not probabilities summing to 1)",
        ),
    }
    eps, norm = 0.0, "linf"
    for (_, value), attack in attacks.items():
        eps, norm = value, getattr(attack, "norm", "linf")
        break
    classes = outputs.shape[-1]
    if classes >= 3:
        checks["zero_gradients"] = zero_gradients(model, x, y, eps, norm, seed, outputs)
    ops = dynamic(model, x)
    checks["dynamic_model"] = Check(
        bool(ops),
        f"the inference graph differentiates ({', '.join(sorted(ops))})"
        if ops
        else "the inference graph holds no gradient op",
    )
    problem = class_count(classes, attacks)
    checks["class_count"] = Check(problem is not None, problem or "")
    return checks
