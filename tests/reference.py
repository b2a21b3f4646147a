"""What the reference tests of Fast-BAT, GradAlign and ELLE share: the constraint set's projection,
per-example cross-entropy in training mode, a conv model with batch norm, weight-gradient
comparisons and central finite differences. Written from the definitions, not from fbat_tf."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf


def project(delta, x, eps):
    """Clip to [-eps, eps], then to [-x, 1 - x] (docs/DESIGN.md §2.2, P_C)."""
    delta = tf.minimum(tf.maximum(delta, -eps), eps)
    return tf.minimum(tf.maximum(delta, -x), 1.0 - x)


def per_example_ce(model, inputs, y):
    logits = model(inputs, training=True)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), logits


def conv_model(dtype: str, seed: int):
    """Conv, batch norm, ReLU, pooling, dense: 3 classes on 6×6×2 inputs."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6, 6, 2), dtype=dtype),
            keras.layers.Conv2D(3, 3, padding="same", dtype=dtype),
            keras.layers.BatchNormalization(dtype=dtype),
            keras.layers.ReLU(dtype=dtype),
            keras.layers.GlobalAveragePooling2D(dtype=dtype),
            keras.layers.Dense(3, dtype=dtype),
        ]
    )


def bent_dense_model(dtype: str):
    """Dense, softplus, dense: 3 classes on 12 inputs, the same weights in either dtype, its
    first layer large enough that the loss and its input gradient bend inside an ε-ball (a
    nearly linear model would leave GradAlign's and ELLE's terms ~ 0)."""
    model = keras.Sequential(
        [
            keras.Input((12,), dtype=dtype),
            keras.layers.Dense(8, activation="softplus", dtype=dtype),
            keras.layers.Dense(3, dtype=dtype),
        ]
    )
    rng = np.random.default_rng(7)
    model.set_weights(
        [
            rng.normal(size=(12, 8)) * 4 / np.sqrt(12),
            rng.normal(size=8) * 0.5,
            rng.normal(size=(8, 3)) / np.sqrt(8),
            rng.normal(size=3) * 0.1,
        ]
    )
    return model


# The models the reference tests compare on, by name: (builder taking a dtype, input shape).
CASES = {
    "dense": (bent_dense_model, (8, 12)),
    "conv": (lambda dtype: conv_model(dtype, 2025), (4, 6, 6, 2)),
}


def case_setup(case: str, dtype: str):
    """A CASES model and a batch for it: pixels in [0, 1], a fifth of them on the box's faces
    (so that every [0, 1] clip matters), and labels of its 3 classes."""
    build, shape = CASES[case]
    model = build(dtype)
    rng = np.random.default_rng(1)
    x = rng.uniform(0.05, 0.95, size=shape)
    where = rng.uniform(size=shape)
    x[where < 0.2] = 0.0
    x[where > 5 / 6] = 1.0
    y = rng.integers(0, 3, size=shape[0])
    return model, tf.constant(x, dtype=dtype), tf.constant(y, dtype=tf.int32)


def global_norm(tensors) -> float:
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(t, np.float64))) for t in tensors)))


def assert_grads_close(actual, expected, rtol):
    """Every weight gradient within rtol, relative to itself or to the largest entry."""
    assert len(actual) == len(expected)
    scale = max(float(np.max(np.abs(np.asarray(e)))) for e in expected)
    assert scale > 0
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        assert a is not None, f"gradient {i} is None"
        a = np.asarray(tf.convert_to_tensor(a))
        e = np.asarray(e)
        assert a.shape == e.shape, (i, a.shape, e.shape)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * scale, err_msg=f"variable {i}")


def finite_difference(model, fn, step):
    """Central differences of fn() with respect to every trainable weight."""
    result = []
    for var in model.trainable_variables:
        base = var.numpy()
        grad = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            bumped = base.copy()
            bumped[idx] += step
            var.assign(bumped)
            plus = fn()
            bumped[idx] = base[idx] - step
            var.assign(bumped)
            minus = fn()
            grad[idx] = (plus - minus) / (2 * step)
        var.assign(base)
        result.append(grad)
    return result


def mixed_second_derivative_fn(model: keras.Model, training: bool, jit_compile: bool = True):
    """A tf.function (x, y, v) -> (⟨∇x Σ_i CE_i, v⟩, its ∇θ), Fast-BAT's implicit-term form,
    XLA-compiled unless `jit_compile=False` (TensorFlow's own kernels); a weight the term does
    not reach gets None."""

    @tf.function(jit_compile=jit_compile)
    def compute(x, y, v):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                inner.watch(x)
                logits = tf.cast(model(x, training=training), tf.float32)
                loss = tf.reduce_sum(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
                )
            input_gradient = inner.gradient(loss, x)
            inner_product = tf.reduce_sum(input_gradient * v)
        return inner_product, outer.gradient(inner_product, model.trainable_variables)

    return compute
