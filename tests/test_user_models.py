"""Users' own Keras models: one built with keras.layers.BatchNormalization gets a wrong Fast-BAT
implicit term (Keras' batch statistics have wrong second derivatives), one with
keras.layers.MaxPooling2D a wrong one under XLA (XLA's second derivative of max pooling picks
each window's maximum at bfloat16 precision); the trainer switches those layers, in place and
with their weights, to fbat_tf's, after which the term equals central finite differences of
the implicit objective (float64), and under XLA what TensorFlow's own kernels compute eagerly.
Batch norm of an unknown subclass is refused. And the README's Python example runs as
printed."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import methods
from fbat_tf.models.layers import BatchNormalization, MaxPooling2D, Resizing
from fbat_tf.trainer import AdversarialTrainer
from tests.reference import assert_grads_close, finite_difference, global_norm
from tests.test_fastbat_reference import _implicit_objective, _inputs, _reference, _seed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPS, LAMBDA_INV = 0.1, 1.0


def functional_model_with_keras_batch_norm(batch_norm=keras.layers.BatchNormalization):
    keras.utils.set_random_seed(7)
    inputs = keras.Input((6, 6, 2), dtype="float64")
    h = keras.layers.Conv2D(3, 3, padding="same", dtype="float64")(inputs)
    h = batch_norm(dtype="float64", name="users_bn")(h)
    h = keras.layers.Activation("softplus", dtype="float64")(h)
    h = keras.layers.GlobalAveragePooling2D(dtype="float64")(h)
    outputs = keras.layers.Dense(3, dtype="float64")(h)
    model = keras.Model(inputs, outputs)
    bn = model.get_layer("users_bn")
    rng = np.random.default_rng(0)
    bn.gamma.assign(rng.uniform(0.5, 1.5, 3))
    bn.beta.assign(rng.normal(size=3))
    return model


def implicit_term(model, x, y):
    """Fast-BAT's g2: the difference of two steps whose coefficients c differ by one."""

    def step(ig_coef):
        method = methods.create("fastbat", eps=EPS, lambda_inv=LAMBDA_INV, ig_coef=ig_coef)
        grads, _ = method.gradients(model, x, y, _seed())
        return [np.asarray(g) for g in grads]

    return [b - a for a, b in zip(step(1.0), step(2.0), strict=True)]


def finite_difference_term(model, x, y):
    ref = _reference(
        model, x, y, _seed(), eps=EPS, lambda_inv=LAMBDA_INV, linearization="pgd_nosign"
    )
    u = ref.mask * ref.upper_input_gradient
    return finite_difference(model, lambda: _implicit_objective(model, x, y, ref.z, u), 1e-5)


@pytest.mark.slow
def test_keras_batch_norm_is_converted_and_then_gives_the_exact_implicit_term(caplog):
    model = functional_model_with_keras_batch_norm()
    x, y = _inputs((4, 6, 6, 2), "float64")
    numeric = finite_difference_term(model, x, y)
    wrong = implicit_term(model, x, y)
    error = global_norm([a - b for a, b in zip(wrong, numeric, strict=True)])
    assert error > 1e-2 * global_norm(numeric)  # what users got before, silently (3% here)

    # A training-mode call moves the moving statistics: snapshot after it, compare before it.
    logits = {True: model(x, training=True).numpy()}
    weights = [w.copy() for w in model.get_weights()]
    logits[False] = model(x, training=False).numpy()
    with caplog.at_level(logging.WARNING):
        trainer = AdversarialTrainer(model, methods.create("fastbat", eps=EPS), jit_compile=False)
    # Names what it converted, as what it was; this model has no max pooling to convert.
    assert caplog.text.rstrip().endswith("same weights: users_bn (BatchNormalization)")
    layer = trainer.classifier.get_layer("users_bn")
    assert trainer.classifier is model and isinstance(layer, BatchNormalization)
    for before, after in zip(weights, model.get_weights(), strict=True):
        np.testing.assert_array_equal(before, after)
    for mode in (False, True):
        np.testing.assert_allclose(model(x, training=mode).numpy(), logits[mode], rtol=1e-12)

    assert_grads_close(implicit_term(model, x, y), numeric, rtol=1e-6)


def model_with_keras_max_pooling():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((16, 16, 2))
    h = keras.layers.Conv2D(4, 3, padding="same")(inputs)
    h = keras.layers.Activation("softplus")(h)
    h = keras.layers.MaxPooling2D(2, name="users_pool")(h)
    h = keras.layers.Conv2D(4, 3, padding="same")(h)
    h = keras.layers.Activation("softplus")(h)
    h = keras.layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, keras.layers.Dense(3)(h))


def second_derivative(model, x, y, v, jit_compile):
    """∇θ⟨∇x Σ CE, v⟩, the product Fast-BAT's implicit term and GradAlign differentiate. (Not
    the implicit term itself: XLA draws its random start from other random numbers.)"""

    def compute():
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss = tf.reduce_sum(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x, training=True))
                )
            product = tf.reduce_sum(inner.gradient(loss, x) * v)
        return outer.gradient(product, model.trainable_variables)

    grads = tf.function(compute, jit_compile=True)() if jit_compile else compute()
    return [np.asarray(g, dtype=np.float64) for g in grads]


@pytest.mark.slow
def test_keras_max_pooling_is_converted_and_then_differentiates_twice_under_xla_exactly(caplog):
    model = model_with_keras_max_pooling()
    x, y = _inputs((4, 16, 16, 2), "float32")
    v = tf.constant(np.random.default_rng(1).normal(size=x.shape), tf.float32)
    # TensorFlow's own kernels, eagerly: exact second derivatives of max pooling.
    eager = second_derivative(model, x, y, v, jit_compile=False)
    wrong = second_derivative(model, x, y, v, jit_compile=True)
    error = global_norm([a - b for a, b in zip(wrong, eager, strict=True)])
    assert error > 1e-3 * global_norm(eager)  # what XLA gives (bfloat16 comparisons)

    with caplog.at_level(logging.WARNING):
        AdversarialTrainer(model, methods.create("fastbat", eps=EPS), jit_compile=True)
    assert caplog.text.rstrip().endswith("same weights: users_pool (MaxPooling2D)")
    assert isinstance(model.get_layer("users_pool"), MaxPooling2D)
    assert_grads_close(second_derivative(model, x, y, v, jit_compile=True), eager, rtol=1e-5)


def model_that_resizes_its_input(shape=(5, 7, 2), size=(8, 9), **resizing):
    keras.utils.set_random_seed(5)
    inputs = keras.Input(shape, dtype="float64")
    h = keras.layers.Resizing(*size, dtype="float64", name="users_resize", **resizing)(inputs)
    h = keras.layers.Conv2D(3, 3, padding="same", dtype="float64")(h)
    h = keras.layers.Activation("softplus", dtype="float64")(h)
    h = keras.layers.GlobalAveragePooling2D(dtype="float64")(h)
    return keras.Model(inputs, keras.layers.Dense(3, dtype="float64")(h))


def test_keras_resizing_is_converted_and_then_gives_the_implicit_term_it_dropped(caplog):
    """TensorFlow declares the gradient of its bilinear resize not differentiable: through
    Keras' Resizing, Fast-BAT's implicit term is None for every weight (zero, silently)."""
    model = model_that_resizes_its_input()
    x, y = _inputs((4, 5, 7, 2), "float64")
    v = tf.constant(np.random.default_rng(1).normal(size=x.shape), tf.float64)
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            inner.watch(x)
            loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x)))
        product = tf.reduce_sum(inner.gradient(loss, x) * v)
    assert outer.gradient(product, model.trainable_variables) == [None] * 4
    logits = model(x).numpy()

    with caplog.at_level(logging.WARNING):
        AdversarialTrainer(model, methods.create("fastbat", eps=EPS), jit_compile=False)
    assert caplog.text.rstrip().endswith("same weights: users_resize (Resizing)")
    assert isinstance(model.get_layer("users_resize"), Resizing)
    np.testing.assert_allclose(model(x).numpy(), logits, rtol=1e-6)
    # A product of matrices under XLA too; the float32 v exercises the cast.
    compiled = tf.function(lambda x: model(x), jit_compile=True)
    np.testing.assert_allclose(compiled(x).numpy(), logits, rtol=1e-6)

    term = implicit_term(model, x, y)
    assert global_norm(term) > 0
    assert_grads_close(term, finite_difference_term(model, x, y), rtol=1e-6)


def test_a_resize_that_is_not_linear_is_refused_naming_the_fix():
    # Padded to the target's aspect ratio with 1s (two rows above and below): an affine map,
    # not two matrix products.
    model = model_that_resizes_its_input((4, 8, 2), (8, 8), pad_to_aspect_ratio=True, fill_value=1)
    AdversarialTrainer(model, methods.create("fastbat", eps=EPS), jit_compile=False)
    with pytest.raises(ValueError, match="users_resize: this resize.*in the data pipeline"):
        model(_inputs((2, 4, 8, 2), "float64")[0])


def test_first_order_methods_leave_the_model_alone():
    model = functional_model_with_keras_batch_norm()
    AdversarialTrainer(model, methods.create("fastat", eps=EPS), jit_compile=False)
    assert type(model.get_layer("users_bn")) is keras.layers.BatchNormalization


def test_the_warning_names_five_converted_layers_and_counts_the_rest(caplog):
    inputs = keras.Input((4,))
    h = inputs
    for i in range(7):
        h = keras.layers.BatchNormalization(name=f"bn{i}")(h)
    model = keras.Model(inputs, keras.layers.Dense(3)(h))
    with caplog.at_level(logging.WARNING):
        AdversarialTrainer(model, methods.create("fastbat", eps=EPS), jit_compile=False)
    listed = ", ".join(f"bn{i} (BatchNormalization)" for i in range(5))
    assert caplog.text.rstrip().endswith(f"same weights: {listed} and 2 more")


def test_batch_norm_of_an_unknown_subclass_is_refused_naming_the_fix():
    class MyBatchNorm(keras.layers.BatchNormalization):
        pass

    model = functional_model_with_keras_batch_norm(MyBatchNorm)
    with pytest.raises(ValueError, match="users_bn .MyBatchNorm.*fbat_tf.models.layers"):
        AdversarialTrainer(model, methods.create("fastat_ga", eps=EPS), jit_compile=False)


@pytest.mark.slow
def test_readme_python_example_runs_and_says_only_what_it_is_about():
    """As a user runs it (no log level set): it printed TensorFlow's start-up lines twice, a
    `failed call to cuInit` error on a CPU machine, XLA's INFO lines and Keras' warning that
    fit's `shuffle=True` is ignored for a tf.data pipeline (README's own fit call). It now says
    only the trainer's warning of the layers it switched, and its numbers."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("## Python API", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "robust accuracy" in result.stdout
    said = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("WARNING:absl:fastbat differentiates"), said


class _RawResize(keras.layers.Layer):
    """A user's own layer resizing with tf.image.resize: no Keras layer for the trainer to
    switch, and TensorFlow's resize gradient has no gradient of its own."""

    def call(self, x):
        return tf.image.resize(x, (8, 8), method="bilinear")


def test_a_resize_the_trainer_cannot_switch_is_refused_not_trained_first_order():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((5, 7, 2), dtype="float64")
    h = keras.layers.Conv2D(3, 3, padding="same", dtype="float64", name="before")(inputs)
    h = _RawResize(dtype="float64")(h)
    h = keras.layers.GlobalAveragePooling2D(dtype="float64")(h)
    outputs = keras.layers.Dense(3, dtype="float64", name="after")(h)
    model = keras.Model(inputs, outputs)
    x, y = _inputs((4, 5, 7, 2), "float64")
    method = methods.create("fastbat", eps=EPS, lambda_inv=LAMBDA_INV, ig_coef=1.0)
    with pytest.raises(ValueError) as refused:
        method.gradients(model, x, y, _seed())
    said = str(refused.value)
    # The input gradient passes the resize's gradient op, which TensorFlow does not
    # differentiate: the weights after it lose their term, and the bias before it (the
    # convolution's kernel keeps the part of its term that its own transpose carries).
    assert "no gradient for 3 of the model's weights (before/bias, after/kernel, after" in said
    assert "--ig=none" in said and "keras.layers.Resizing" in said
    # First-order Fast-BAT needs no second derivative: it trains such a model.
    first_order = methods.create("fastbat", eps=EPS, lambda_inv=LAMBDA_INV, ig="none")
    grads, _ = first_order.gradients(model, x, y, _seed())
    assert all(g is not None for g in grads)


def _mlp(activation=None) -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation)]
    )


def _trainer(model) -> AdversarialTrainer:
    trainer = AdversarialTrainer(model, methods.create("fastat", eps=EPS), jit_compile=False)
    trainer.compile(optimizer=keras.optimizers.SGD(0.1))
    return trainer


_IMAGES = np.random.default_rng(0).uniform(size=(16, 4, 4, 1)).astype(np.float32)
_LABELS = np.arange(16) % 10

# What the Python API took silently (or failed on inside TensorFlow) and the programs refuse:
# each with the words of its one-line refusal.
_REFUSED = {
    "softmax": ("softmax", _LABELS, "the model's outputs are probabilities"),
    "float labels": (None, _LABELS + 0.5, "label 0.5 is not a class index"),
    "label 10": (None, np.where(_LABELS == 3, 10, _LABELS), "label 10 is outside 0 to 9"),
    "label -1": (None, np.where(_LABELS == 3, -1, _LABELS), "label -1 is outside 0 to 9"),
    "one-hot": (None, np.eye(10)[_LABELS], ", 10], not one class index per example"),
}


@pytest.mark.parametrize("case", list(_REFUSED))
def test_the_python_api_refuses_what_the_programs_refuse_in_one_line(case):
    """A softmax model trained on cross-entropy of probabilities, float labels truncated, and a
    label out of range (fit skipped every batch as non-finite and returned; evaluate raised
    TensorFlow's InvalidArgumentError): fit, Keras' evaluate and evaluation.evaluate refuse
    each before any step, in one line saying what is wrong."""
    from fbat_tf.attacks.pgd import PGD
    from fbat_tf.evaluation import evaluate

    activation, labels, said = _REFUSED[case]
    trainer = _trainer(_mlp(activation))
    dataset = tf.data.Dataset.from_tensor_slices((_IMAGES, labels)).batch(8)
    before = [w.copy() for w in trainer.classifier.get_weights()]
    for call in (
        lambda: trainer.fit(dataset, epochs=1, verbose=0),
        lambda: trainer.fit(_IMAGES, labels, batch_size=8, epochs=1, verbose=0),
        lambda: trainer.evaluate(dataset, verbose=0),
        lambda: evaluate(trainer.classifier, dataset, {("pgd", EPS): PGD(EPS, steps=1)}),
    ):
        with pytest.raises(ValueError) as refused:
            call()
        message = str(refused.value)
        assert said in message and "\n" not in message, message
    assert int(trainer.optimizer.iterations) == 0
    after = trainer.classifier.get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def test_the_python_api_trains_and_evaluates_labels_that_are_class_indices():
    """Integer labels, and float ones that are whole numbers, pass the check."""
    from fbat_tf.attacks.pgd import PGD
    from fbat_tf.evaluation import evaluate

    trainer = _trainer(_mlp())
    for labels in (_LABELS, _LABELS.astype(np.float32)):
        dataset = tf.data.Dataset.from_tensor_slices((_IMAGES, labels)).batch(8)
        trainer.fit(dataset, epochs=1, verbose=0)
        result = evaluate(trainer.classifier, dataset, {("pgd", EPS): PGD(EPS, steps=1)})
        assert result.examples == 16
    assert int(trainer.optimizer.iterations) == 4
