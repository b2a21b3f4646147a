"""Per-example classification losses and measures shared by training methods and attacks.

Every loss takes logits [batch, classes] and integer labels [batch] and returns one value per
example, computed in at least float32 whatever the model's compute dtype (16-bit logits are
cast first, DESIGN.md §2):

    ce = cross_entropy(model(x, training=False), y)        # [batch]
    robust = robust_hits(correct(model(x), y), model(x_adv), y)   # right clean and attacked
    margin = dlr(logits, y)                                 # Croce & Hein (2020), APGD-DLR
    targeted = dlr_targeted(logits, y, targets)             # their targeted variant
    aligned = cosine_per_example(grad_a, grad_b)            # GradAlign's per-example cosine

The one input-gradient helper of the project, for attacks and the methods' inner attacks:

    loss, grad = input_gradient(lambda x: cross_entropy(model(x, training=False), y), x)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf


class UnavailableGradientError(ValueError):
    """The model's output has no gradient with respect to its input: its graph does not
    differentiate (an op under `tf.stop_gradient`, a rounding or JPEG layer with no gradient
    defined). The gradient attacks cannot run on it; the gradient-free ones (Square) can."""


def as_loss_dtype(logits: tf.Tensor) -> tf.Tensor:
    """Logits in float32 (or float64 when the model runs in float64)."""
    if logits.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(logits, tf.float32)
    return logits


def cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """CE_i = -log softmax(logits_i)[y_i]."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int32), logits=as_loss_dtype(logits)
    )


def correct(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """1.0 where the arg-max class is the label, else 0.0 (float32, per example)."""
    predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
    return tf.cast(tf.equal(predicted, tf.cast(labels, tf.int32)), tf.float32)


def robust_hits(clean_right: tf.Tensor, adversarial_logits: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """1.0 where an example is robust, else 0.0 (float32, per example): classified correctly
    both clean (`clean_right`: `correct` of its clean logits) and at the attack's point. δ = 0
    lies in every threat model, so an example the model gets wrong clean is not robust whatever
    an attack returns for it (the definition of Madry et al., AutoAttack and RobustBench).
    Every robust count of an evaluation (evaluation.evaluate: each attack's, a user's own, a
    replayed or transferred attack's, training-time validation's) and of the source a file is
    re-checked against is made here."""
    return tf.cast(clean_right, tf.float32) * correct(adversarial_logits, y)


def _check_num_classes(logits: tf.Tensor, minimum: int, loss: str) -> int:
    """The static class count, or a ValueError naming it when the loss needs more classes."""
    num_classes = logits.shape[-1]
    if num_classes is None:
        raise ValueError(f"{loss} needs a static number of classes, got logits {logits.shape}")
    if num_classes < minimum:
        raise ValueError(f"{loss} needs at least {minimum} classes, the logits have {num_classes}")
    return int(num_classes)


def dlr(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Difference of logits ratio: −(z_y − max_{i≠y} z_i) / (z_π1 − z_π3 + 1e-12).

    π sorts the logits in decreasing order. The ratio is invariant to shifting and rescaling
    the logits, which is why APGD-DLR still moves where CE saturates (Croce & Hein, 2020).
    """
    logits = as_loss_dtype(tf.convert_to_tensor(logits))
    num_classes = _check_num_classes(logits, 3, "DLR loss")
    labels = tf.cast(labels, tf.int32)
    true_logit = tf.gather(logits, labels, axis=1, batch_dims=1)
    is_label = tf.one_hot(labels, num_classes, on_value=True, off_value=False)
    best_other = tf.reduce_max(tf.where(is_label, logits.dtype.min, logits), axis=1)
    top = tf.math.top_k(logits, k=3).values
    return -(true_logit - best_other) / (top[:, 0] - top[:, 2] + 1e-12)


def dlr_targeted(logits: tf.Tensor, labels: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    """Targeted DLR: −(z_y − z_t) / (z_π1 − (z_π3 + z_π4) / 2 + 1e-12), t the target class."""
    logits = as_loss_dtype(tf.convert_to_tensor(logits))
    _check_num_classes(logits, 4, "targeted DLR loss")
    true_logit = tf.gather(logits, tf.cast(labels, tf.int32), axis=1, batch_dims=1)
    target_logit = tf.gather(logits, tf.cast(targets, tf.int32), axis=1, batch_dims=1)
    top = tf.math.top_k(logits, k=4).values
    return -(true_logit - target_logit) / (top[:, 0] - 0.5 * (top[:, 2] + top[:, 3]) + 1e-12)


def cosine_per_example(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """cos(a_i, b_i) of the flattened per-example rows; 0 where either row is 0."""
    a = tf.reshape(a, [tf.shape(a)[0], -1])
    b = tf.reshape(b, [tf.shape(b)[0], -1])
    dot = tf.reduce_sum(a * b, axis=1)
    norms = tf.norm(a, axis=1) * tf.norm(b, axis=1)
    return tf.math.divide_no_nan(dot, norms)


def input_gradient(
    fn: Callable[[tf.Tensor], Any], x: tf.Tensor, loss_scale: tf.Tensor | float | None = None
) -> tuple[Any, tf.Tensor]:
    """(fn(x), ∇x Σ_i fn(x)_i): the gradient of the sum of per-example values, so that each
    example's gradient is its own (DESIGN.md §2).

    `fn` returns the per-example values [batch], or a tuple whose first item they are (the rest
    comes back untouched, e.g. the logits). The tape watches x only, so no weight gradient is
    recorded. With `loss_scale` s the sum is multiplied by s before it is differentiated and the
    gradient divided by s again: the same gradient, with 16-bit cotangents kept clear of
    underflow. The gradient has x's dtype and static shape (a frozen graph may lose its batch
    size). UnavailableGradientError where the model's output has no gradient in x (the tape
    gives none, or an op has no gradient defined).
    """
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(x)
        outputs = fn(x)
        values = outputs[0] if isinstance(outputs, tuple) else outputs
        total = tf.reduce_sum(values)
        if loss_scale is not None:
            total = total * tf.cast(loss_scale, total.dtype)
    try:
        grad = tape.gradient(total, x)
    except LookupError as error:  # an op of the graph has no gradient registered
        raise UnavailableGradientError(
            f"the model's input gradient is unavailable: {error}"
        ) from None
    if grad is None:
        raise UnavailableGradientError(
            "the model's input gradient is unavailable: its output does not depend "
            "differentiably on its input (a layer under tf.stop_gradient, or one without a "
            "gradient, as input rounding or JPEG compression)"
        )
    grad = tf.cast(grad, x.dtype)
    if loss_scale is not None:
        grad = grad / tf.cast(loss_scale, grad.dtype)
    grad.set_shape(x.shape)
    return outputs, grad
