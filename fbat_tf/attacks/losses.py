"""Per-example classification losses shared by training methods and attacks.

Every loss takes logits [batch, classes] and integer labels [batch] and returns one value per
example, computed in at least float32 whatever the model's compute dtype (16-bit logits are
cast first, DESIGN.md §2):

    ce = cross_entropy(model(x, training=False), y)        # [batch]
"""

from __future__ import annotations

import tensorflow as tf


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
