"""AdversarialTrainer and schedules against closed forms: the cyclic schedule against
numpy.interp, coupled weight decay and momentum against PyTorch's SGD update written out by hand,
step counts of Free-AT, loss scaling under mixed_float16, and batch-norm statistics."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import methods, schedules
from fbat_tf.methods.fast_at import FastAT
from fbat_tf.trainer import AdversarialTrainer

SHAPE = (8, 8, 1)


def tiny_classifier() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Conv2D(4, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(momentum=0.9),
            keras.layers.ReLU(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3, dtype="float32"),
        ]
    )


def dataset(n: int = 32, batch: int = 8) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (n, *SHAPE)).astype(np.float32)
    y = rng.integers(0, 3, n).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)


def test_cyclic_schedule_matches_interpolation():
    schedule = schedules.Cyclic(lr_max=0.2, total_steps=200)
    steps = np.arange(0, 230, 7)
    expected = np.interp(steps, [0, 100, 200], [0.0, 0.2, 0.0])
    got = np.array([float(schedule(s)) for s in steps])
    np.testing.assert_allclose(got, expected, atol=1e-7)


def test_piecewise_schedule():
    schedule = schedules.piecewise(lr_max=0.1, total_steps=100)
    got = [float(schedule(s)) for s in (0, 49, 50, 74, 75, 99)]
    np.testing.assert_allclose(got, [0.1, 0.1, 0.01, 0.01, 0.001, 0.001], rtol=1e-6)


def test_weight_decay_is_coupled_before_momentum():
    """Two steps of the trainer against v ← μv + (g + λw); w ← w − lr·v, written out."""
    classifier = tiny_classifier()
    method = methods.create("standard")
    lr, momentum, decay = 0.05, 0.9, 0.01
    trainer = AdversarialTrainer(classifier, method, weight_decay=decay, jit_compile=False)
    trainer.compile(optimizer=keras.optimizers.SGD(lr, momentum=momentum))
    batches = list(dataset(16, 8))
    weights = [w.numpy().copy() for w in classifier.trainable_variables]
    velocity = [np.zeros_like(w) for w in weights]
    # The gradients of each step, computed independently on a copy of the weights.
    reference = tiny_classifier()
    for x, y in batches:
        for target, w in zip(reference.trainable_variables, weights, strict=True):
            target.assign(w)
        with tf.GradientTape() as tape:
            logits = reference(x, training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            )
        grads = [g.numpy() for g in tape.gradient(loss, reference.trainable_variables)]
        velocity = [
            momentum * v + g + decay * w for v, g, w in zip(velocity, grads, weights, strict=True)
        ]
        weights = [w - lr * v for w, v in zip(weights, velocity, strict=True)]
    trainer.fit(dataset(16, 8), epochs=1, verbose=0)
    for w, expected in zip(classifier.trainable_variables, weights, strict=True):
        np.testing.assert_allclose(w.numpy(), expected, rtol=2e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fastbat", "free"])
def test_fit_with_xla_counts_optimizer_steps_and_updates_batch_norm(name):
    classifier = tiny_classifier()
    method = methods.create(name, eps=8 / 255, **({"replays": 3} if name == "free" else {}))
    method.build((8, *SHAPE))
    trainer = AdversarialTrainer(classifier, method, jit_compile=True)
    trainer.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9))
    moving_mean = classifier.layers[1].moving_mean.numpy().copy()
    history = trainer.fit(dataset(32, 8), epochs=2, verbose=0)
    assert int(trainer.optimizer.iterations) == 2 * 4 * method.replays
    assert not np.allclose(moving_mean, classifier.layers[1].moving_mean.numpy())
    assert set(method.log_names) <= set(history.history)
    assert np.all(np.isfinite(history.history["loss"]))


@pytest.mark.slow
def test_fit_with_xla_moves_elle_a_s_lambda_state_once_a_step():
    """The trainer hands each step's logs to the method after its gradient, outside XLA: ELLE-A's
    statistic counts every optimizer step, and its mean is that of the steps' E_lin."""
    classifier = tiny_classifier()
    method = methods.create("elle", eps=8 / 255)
    method.build((8, *SHAPE))
    trainer = AdversarialTrainer(classifier, method, jit_compile=True)
    trainer.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9))
    history = trainer.fit(dataset(32, 8), epochs=2, verbose=0)
    state = method.variables()
    assert float(state["count"].numpy()) == 2 * 4
    epochs_mean = np.mean(history.history["elle_error"])  # both epochs have 4 steps
    np.testing.assert_allclose(float(state["mean"].numpy()), epochs_mean, rtol=1e-5)
    assert float(state["mean"].numpy()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_fit_under_mixed_precision(policy):
    keras.mixed_precision.set_global_policy(policy)
    classifier = tiny_classifier()
    method = methods.create("fastbat", eps=8 / 255)
    trainer = AdversarialTrainer(classifier, method, jit_compile=True)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    if policy == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    trainer.compile(optimizer=optimizer)
    before = [w.numpy().copy() for w in classifier.trainable_variables]
    history = trainer.fit(dataset(32, 8), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = [w.numpy() for w in classifier.trainable_variables]
    assert any(not np.allclose(b, a) for b, a in zip(before, after, strict=True))
    if policy == "mixed_float16":
        # The dynamic scale is in effect: the step passed loss_scale > 1 to the method.
        assert float(optimizer.dynamic_scale) > 1.0


@pytest.mark.slow
def test_loss_scaled_step_equals_the_unscaled_step():
    """Under a LossScaleOptimizer (float32, so nothing overflows) the weights move exactly as
    with the plain optimizer: the method's gradients were scaled and the optimizer unscaled them."""
    results = []
    for scaled in (False, True):
        classifier = tiny_classifier()
        trainer = AdversarialTrainer(
            classifier, methods.create("fastat", eps=8 / 255), jit_compile=False
        )
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
        if scaled:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=1024.0)
        trainer.compile(optimizer=optimizer)
        trainer.fit(dataset(16, 8), epochs=1, verbose=0)
        results.append([w.numpy() for w in classifier.trainable_variables])
    for plain, scaled in zip(*results, strict=True):
        np.testing.assert_allclose(plain, scaled, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_steps_are_reproducible_from_the_seed():
    outcomes = []
    for _ in range(2):
        classifier = tiny_classifier()
        trainer = AdversarialTrainer(classifier, methods.create("fastbat"), seed=3)
        trainer.compile(optimizer=keras.optimizers.SGD(0.05))
        trainer.fit(dataset(16, 8), epochs=1, verbose=0)
        outcomes.append([w.numpy() for w in classifier.trainable_variables])
    for a, b in zip(*outcomes, strict=True):
        np.testing.assert_array_equal(a, b)


class RecordingFastAT(FastAT):
    """Fast-AT that keeps, in variables, the seed and loss scale of its latest step."""

    def __init__(self, eps: float):
        super().__init__(eps)
        self.seen_seed = tf.Variable([0, 0], dtype=tf.int32, trainable=False)
        self.seen_scale = tf.Variable(0.0, dtype=tf.float32, trainable=False)

    def gradients(self, model, x, y, seed, loss_scale=None):
        self.seen_seed.assign(seed)
        self.seen_scale.assign(-1.0 if loss_scale is None else tf.cast(loss_scale, tf.float32))
        return super().gradients(model, x, y, seed, loss_scale)


class Seen(keras.callbacks.Callback):
    def __init__(self, method):
        super().__init__()
        self.method = method
        self.seeds, self.scales = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.seeds.append(tuple(self.method.seen_seed.numpy()))
        self.scales.append(float(self.method.seen_scale.numpy()))


@pytest.mark.slow
def test_each_step_draws_from_its_own_seed_and_the_run_seed_matters():
    method = RecordingFastAT(8 / 255)
    trainer = AdversarialTrainer(tiny_classifier(), method, seed=3, jit_compile=False)
    trainer.compile(optimizer=keras.optimizers.SGD(0.05))
    seen = Seen(method)
    trainer.fit(dataset(32, 8), epochs=2, verbose=0, callbacks=[seen])
    # fold_in([run seed, step counter], replica 0), as TensorFlow's stateless_fold_in defines it.
    expected = [
        tuple(
            tf.cast(
                tf.random.experimental.stateless_fold_in(tf.constant([3, k], tf.int64), 0), tf.int32
            ).numpy()
        )
        for k in range(8)
    ]
    assert seen.seeds == expected
    assert len(set(seen.seeds)) == 8

    outcomes = []
    for seed in (3, 4):
        classifier = tiny_classifier()
        trainer = AdversarialTrainer(classifier, methods.create("fastat", eps=8 / 255), seed=seed)
        trainer.compile(optimizer=keras.optimizers.SGD(0.05))
        trainer.fit(dataset(16, 8), epochs=1, verbose=0)
        outcomes.append([w.numpy() for w in classifier.trainable_variables])
    assert any(not np.allclose(a, b) for a, b in zip(*outcomes, strict=True))


def test_a_skipped_step_does_not_repeat_its_randomness():
    # A loss scale of 2^20 overflows float16 gradients: LossScaleOptimizer skips those steps
    # (its iteration count stands still) and halves the scale until the gradients are finite.
    keras.mixed_precision.set_global_policy("mixed_float16")
    method = RecordingFastAT(8 / 255)
    trainer = AdversarialTrainer(tiny_classifier(), method, seed=3, jit_compile=False)
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.05), initial_scale=2.0**20
    )
    trainer.compile(optimizer=optimizer)
    seen = Seen(method)
    trainer.fit(dataset(64, 8), epochs=1, verbose=0, callbacks=[seen])
    assert int(optimizer.iterations.numpy()) < 8  # some steps were skipped
    assert len(set(seen.seeds)) == 8
    assert int(trainer.seed_counter.numpy()) == 8


def test_the_method_receives_the_dynamic_loss_scale_under_mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    method = RecordingFastAT(8 / 255)
    trainer = AdversarialTrainer(tiny_classifier(), method, jit_compile=False)
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01))
    trainer.compile(optimizer=optimizer)
    seen = Seen(method)
    trainer.fit(dataset(16, 8), epochs=1, verbose=0, callbacks=[seen])
    assert seen.scales[0] == float(optimizer.initial_scale) > 1.0


def test_weight_decay_is_scaled_with_the_loss():
    """With a weight decay that moves the weights, a loss-scaled step makes the same update."""
    updates = []
    for scaled in (False, True):
        classifier = tiny_classifier()
        start = [w.numpy().copy() for w in classifier.trainable_variables]
        trainer = AdversarialTrainer(
            classifier, methods.create("standard"), weight_decay=0.05, jit_compile=False
        )
        optimizer = keras.optimizers.SGD(0.1)
        if scaled:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=1024.0)
        trainer.compile(optimizer=optimizer)
        trainer.fit(dataset(16, 8), epochs=1, verbose=0)
        updates.append(
            [w.numpy() - s for w, s in zip(classifier.trainable_variables, start, strict=True)]
        )
    decay_share = 0.1 * 0.05 * max(float(np.abs(w).max()) for w in start)
    assert decay_share > 1e-3  # the decay's part of an update is far above the tolerance
    for plain, scaled in zip(*updates, strict=True):
        np.testing.assert_allclose(scaled, plain, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("name", ["fastat", "free", "elle"])
def test_a_batch_with_non_finite_pixels_is_skipped_counted_and_leaves_no_trace(name):
    """A batch with one NaN pixel: no optimizer step, no momentum, batch-norm statistics,
    Free-AT's δ and ELLE-A's λ and E_lin statistic as they were, the count logged; the next good
    batch trains as usual."""
    classifier = tiny_classifier()
    method = methods.create(name, eps=8 / 255, **({"replays": 2} if name == "free" else {}))
    method.build((8, *SHAPE))
    trainer = AdversarialTrainer(classifier, method, jit_compile=False)
    trainer.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
    x, y = next(iter(dataset(8, 8)))
    trainer.fit(tf.data.Dataset.from_tensors((x, y)), verbose=0)

    def state():
        variables = classifier.variables + trainer.optimizer.variables
        variables += list(method.variables().values())
        return [v.numpy().copy() for v in variables]

    before = state()
    bad = x.numpy().copy()
    bad[3, 1, 2, 0] = np.nan
    history = trainer.fit(tf.data.Dataset.from_tensors((bad, y)), verbose=0)
    for a, b in zip(before, state(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(trainer.nonfinite_batches.numpy()) == method.replays
    assert history.history["nonfinite_batches"] == [float(method.replays)]

    trainer.fit(tf.data.Dataset.from_tensors((x, y)), verbose=0)
    after = state()
    assert all(np.isfinite(a).all() for a in after)
    assert any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("method", ["fastat", "fastbat"])
def test_fit_traces_the_step_and_the_gradient_once(method, monkeypatch):
    """Two epochs of fit trace train_step and the method's gradient once each: the optimizer is
    built before the first trace, which would otherwise create its variables and be traced
    again."""
    traced = {"train_step": 0, "gradients": 0}
    step, gradients = AdversarialTrainer.train_step, AdversarialTrainer._method_gradients

    def count(name, function):
        def counted(*args, **kwargs):
            traced[name] += 1
            return function(*args, **kwargs)

        return counted

    monkeypatch.setattr(AdversarialTrainer, "train_step", count("train_step", step))
    monkeypatch.setattr(AdversarialTrainer, "_method_gradients", count("gradients", gradients))
    trainer = AdversarialTrainer(
        tiny_classifier(), methods.create(method, eps=8 / 255), jit_compile=False
    )
    trainer.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9))
    history = trainer.fit(dataset(), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert int(trainer.optimizer.iterations) == 8
    assert traced == {"train_step": 1, "gradients": 1}


def written_state(trainer: AdversarialTrainer) -> list[tuple[str, np.ndarray]]:
    """Every value a batch can write: weights, moving statistics, optimizer slots and
    counters, method state."""
    variables = trainer.classifier.variables + trainer.optimizer.variables
    variables += list(trainer.method.variables().values())
    return [(v.path, v.numpy().copy()) for v in variables]


def assert_all_finite(trainer: AdversarialTrainer) -> None:
    bad = [name for name, value in written_state(trainer) if not np.isfinite(value).all()]
    assert not bad, f"non-finite values in {bad}"


def test_fastbat_at_a_learning_rate_of_1e6_writes_no_non_finite_value():
    """The small CNN at lr 1e6, batches of 3: within a few steps a batch gives a finite loss
    but infinite moving variances (found on Fashion-MNIST as a user would run it). That batch
    and those after it are skipped and counted; nothing non-finite is written anywhere."""
    from fbat_tf import models

    keras.utils.set_random_seed(0)
    classifier = models.build(
        "small_cnn", num_classes=10, input_shape=(28, 28, 1), mean=0.3, std=0.3, width=4
    )
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (15, 28, 28, 1)).astype(np.float32)
    y = rng.integers(0, 10, 15).astype(np.int32)
    trainer = AdversarialTrainer(
        classifier, methods.create("fastbat", eps=8 / 255), jit_compile=False
    )
    trainer.compile(optimizer=keras.optimizers.SGD(1e6, momentum=0.9))
    history = trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(3), epochs=1, verbose=0)
    assert_all_finite(trainer)
    skipped = int(trainer.nonfinite_batches.numpy())
    assert skipped >= 1
    assert history.history["nonfinite_batches"] == [float(skipped)]
    assert int(trainer.optimizer.iterations.numpy()) + skipped == 5
    assert np.isfinite(float(trainer.last_finite_loss.numpy()))


def test_a_finite_loss_with_infinite_moving_variance_is_skipped():
    """Convolution outputs near 1e20 overflow the batch variance: batch norm then outputs
    zeros (a finite loss, log 3) and its moving variance would become infinite."""
    classifier = tiny_classifier()
    kernel = classifier.layers[0].kernel
    kernel.assign(tf.fill(kernel.shape, 1e20))
    x, y = next(iter(dataset(8, 8)))
    # Independently: the loss of the batch is finite, its batch variance is not.
    hidden = classifier.layers[0](x)
    assert not np.isfinite(tf.math.reduce_variance(hidden, axis=[0, 1, 2]).numpy()).all()
    logits = classifier(x, training=False)
    assert np.isfinite(logits.numpy()).all()
    trainer = AdversarialTrainer(classifier, methods.create("standard"), jit_compile=False)
    trainer.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9))
    trainer.optimizer.build(classifier.trainable_variables)
    before = written_state(trainer)
    trainer.fit(tf.data.Dataset.from_tensors((x, y)), verbose=0)
    for (name, a), (_, b) in zip(before, written_state(trainer), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert int(trainer.nonfinite_batches.numpy()) == 1


class SqrtRelu(keras.layers.Layer):
    """sqrt(relu(·)): finite outputs, an infinite derivative at 0, so NaN gradients (0·∞)
    wherever relu cuts."""

    def call(self, inputs):
        return tf.sqrt(tf.nn.relu(inputs))


def test_nan_gradients_under_a_finite_loss_are_skipped():
    keras.utils.set_random_seed(0)
    classifier = keras.Sequential(
        [
            keras.Input(SHAPE),
            keras.layers.Conv2D(4, 3, padding="same"),
            SqrtRelu(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(3),
        ]
    )
    batches = dataset(16, 8)
    # Independently: the first batch's loss is finite, its weight gradients are not.
    x, y = next(iter(batches))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(y, classifier(x), from_logits=True)
        )
    grads = tape.gradient(loss, classifier.trainable_variables)
    assert np.isfinite(loss.numpy())
    assert not all(np.isfinite(g.numpy()).all() for g in grads)

    trainer = AdversarialTrainer(classifier, methods.create("standard"), jit_compile=False)
    trainer.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9))
    trainer.optimizer.build(classifier.trainable_variables)
    before = written_state(trainer)
    history = trainer.fit(batches, epochs=1, verbose=0)
    for (name, a), (_, b) in zip(before, written_state(trainer), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=name)
    assert int(trainer.nonfinite_batches.numpy()) == 2
    assert history.history["nonfinite_batches"] == [2.0]


def test_an_epoch_s_metrics_are_over_its_applied_batches_and_nan_when_none_was():
    """An epoch of one good and one NaN batch reports the good batch's loss (computed here
    independently); an epoch of NaN batches reports NaN, not 0, and its skip count."""
    classifier = tiny_classifier()
    x, y = next(iter(dataset(8, 8)))
    nan = np.full_like(x.numpy(), np.nan)
    expected = tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(
            y, tiny_classifier()(x, training=True), from_logits=True
        )
    )
    trainer = AdversarialTrainer(classifier, methods.create("standard"), jit_compile=False)
    trainer.compile(optimizer=keras.optimizers.SGD(0.01))
    mixed = tf.data.Dataset.from_tensor_slices((np.stack([x, nan]), np.stack([y, y])))
    history = trainer.fit(mixed, epochs=1, verbose=0)
    np.testing.assert_allclose(history.history["loss"], [float(expected)], rtol=1e-5)
    assert history.history["nonfinite_batches"] == [1.0]

    skipped = tf.data.Dataset.from_tensor_slices((np.stack([nan, nan]), np.stack([y, y])))
    history = trainer.fit(skipped, epochs=1, verbose=0)
    assert np.isnan(history.history["loss"][0]) and np.isnan(history.history["adv_accuracy"][0])
    assert history.history["nonfinite_batches"] == [2.0]


@pytest.mark.parametrize("name", ["fastat", "fastbat"])
def test_the_loss_scale_comes_down_when_the_attack_pass_overflows(name):
    """Under mixed_float16 at an initial scale of 2^28 the float16 attack pass overflows (δ is
    NaN): those batches are skipped and each halves the scale, as the optimizer does for its
    own non-finite gradients, until steps are taken."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    trainer = AdversarialTrainer(
        tiny_classifier(), methods.create(name, eps=8 / 255), jit_compile=False
    )
    optimizer = keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.01), initial_scale=2.0**28
    )
    trainer.compile(optimizer=optimizer)
    trainer.fit(dataset(128, 8), epochs=1, verbose=0)
    skipped, steps = int(trainer.nonfinite_batches.numpy()), int(optimizer.iterations.numpy())
    assert skipped + steps == 16
    assert steps > 0
    # Each skip halved the scale; no growth in 16 steps (dynamic_growth_steps is 2000).
    assert float(optimizer.dynamic_scale.numpy()) == 2.0 ** (28 - skipped)
    assert_all_finite(trainer)
