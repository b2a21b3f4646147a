"""Diagnostics of a classifier's input gradients, reported next to robust accuracy.

    score = gradient_alignment(model, x, y, eps=8 / 255, seed=0)    # scalar tensor in [-1, 1]

Gradient alignment (GA), the score the Fast-BAT paper (Zhang et al., 2022) reports after
GradAlign (Andriushchenko & Flammarion, 2020): the mean over examples of
cos(∇x CE_i(x), ∇x CE_i(x + η_i)), η ~ U[-ε, ε]^d. Low GA means the loss is far from linear
inside the ε-ball, the regime where single-step training overfits catastrophically. Over a
dataset, average the per-batch scores weighted by batch size.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from fbat_tf import constraints
from fbat_tf.attacks.losses import cosine_per_example, cross_entropy, input_gradient


def _input_gradient(model: keras.Model, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """∇x Σ_i CE_i(x), in inference mode."""
    return input_gradient(lambda x: cross_entropy(model(x, training=False), y), x)[1]


def gradient_alignment(
    model: keras.Model,
    x: tf.Tensor,
    y: tf.Tensor,
    eps: float,
    seed: int | tf.Tensor = 0,
) -> tf.Tensor:
    """GA = mean_i cos(∇x CE_i(x), ∇x CE_i(x + η_i)), model in inference mode.

    η is drawn as GradAlign's training term in this project draws it (`constraints.random_init`:
    U[-ε, ε]^d, then projected so that x + η stays in [0, 1]); `seed` is an int or an int32
    tensor of shape [2]. An example whose gradient is zero contributes a cosine of 0.
    """
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    x = tf.convert_to_tensor(x)
    y = tf.cast(tf.convert_to_tensor(y), tf.int32)
    eta = constraints.random_init(x, eps, constraints.as_seed(seed))
    grad_clean = _input_gradient(model, x, y)
    grad_noisy = _input_gradient(model, x + eta, y)
    return tf.reduce_mean(cosine_per_example(grad_clean, grad_noisy))
