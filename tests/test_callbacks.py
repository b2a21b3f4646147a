"""The robust-validation callback: best-weights selection and the catastrophic-overfitting
guard, driven by attacks whose effect is known in closed form on a linear model."""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from fbat_tf import schedules
from fbat_tf.callbacks import (
    Divergence,
    EpochTiming,
    Progress,
    RobustValidation,
    StopAfterBatches,
    TensorBoard,
)
from fbat_tf.records import write_json_atomic
from tests.helpers import linear_model

EPS = 0.3


def corner_attack(model, x, y):
    """The exact worst case of a linear two-class model in the ε-ball ∩ box."""
    kernel = model.layers[0].kernel
    towards = tf.transpose(tf.gather(kernel, 1 - y, axis=1) - tf.gather(kernel, y, axis=1))
    return tf.clip_by_value(x + EPS * tf.sign(towards), 0.0, 1.0)


class SwitchableAttack:
    """No perturbation until `strong` is set, then the exact worst case."""

    def __init__(self):
        self.strong = False

    def __call__(self, model, x, y, seed):
        return (corner_attack(model, x, y) if self.strong else x), {}


def test_guard_fires_on_a_robust_accuracy_collapse_and_best_weights_are_kept(tmp_path):
    model = linear_model(10)
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (64, 10)).astype(np.float32)
    y = model(x).numpy().argmax(1).astype(np.int32)  # clean accuracy 1
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    worst = model(corner_attack(model, x, y)).numpy().argmax(1)
    robust_under_attack = float(np.mean(worst == y))
    assert robust_under_attack < 0.8  # the collapse is larger than the 20-point threshold

    attack = SwitchableAttack()
    best = str(tmp_path / "best.weights.h5")
    callback = RobustValidation(
        dataset, attack, EPS, model, best_path=best, stop_on_overfitting=True
    )
    callback.set_model(model)
    logs: dict = {}
    callback.on_epoch_end(0, logs)
    assert logs["val_robust_accuracy"] == 1.0 and logs["val_overfitting"] == 0.0
    assert logs["val_best"] == 1.0
    saved = [w.copy() for w in model.get_weights()]

    model.layers[0].set_weights([w * 1.5 for w in saved])  # a later epoch's weights
    attack.strong = True
    callback.on_epoch_end(1, logs)
    expected = float(np.mean(model(corner_attack(model, x, y)).numpy().argmax(1) == y))
    assert logs["val_robust_accuracy"] == expected
    assert logs["val_overfitting"] == 1.0 and model.stop_training
    assert logs["val_best"] == 0.0 and logs["val_best_robust_accuracy"] == 1.0

    restored = linear_model(10)
    restored.load_weights(best)
    for a, b in zip(restored.get_weights(), saved, strict=True):
        np.testing.assert_array_equal(a, b)


def test_guard_only_warns_without_stop_on_overfitting(caplog):
    model = linear_model(10)
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 1, (32, 10)).astype(np.float32)
    y = model(x).numpy().argmax(1).astype(np.int32)
    attack = SwitchableAttack()
    callback = RobustValidation(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(16), attack, EPS, model
    )
    callback.set_model(model)
    model.stop_training = False
    logs: dict = {}
    callback.on_epoch_end(0, logs)
    attack.strong = True
    with caplog.at_level(logging.WARNING):
        callback.on_epoch_end(1, logs)
    assert logs["val_overfitting"] == 1.0 and not model.stop_training
    assert "catastrophic overfitting suspected" in caplog.text


class FixedBatchOnlyAttack:
    """The exact worst case on the examples of one batch, no perturbation elsewhere."""

    def __init__(self, batch_x):
        self.batch_x = batch_x
        self.strong = False

    def __call__(self, model, x, y, seed):
        same = x.shape == self.batch_x.shape and np.array_equal(np.asarray(x), self.batch_x)
        return (corner_attack(model, x, y) if self.strong and same else x), {}


def test_guard_fires_when_only_the_fixed_batch_collapses(caplog):
    # The whole-set drop stays under the 20-point threshold; the first (fixed) batch collapses
    # while its clean accuracy holds: the fixed-batch clause alone must fire.
    model = linear_model(10)
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (80, 10)).astype(np.float32)
    y = model(x).numpy().argmax(1).astype(np.int32)
    first = x[:16]
    worst = model(corner_attack(model, first, y[:16])).numpy().argmax(1)
    fixed_robust = float(np.mean(worst == y[:16]))
    assert fixed_robust < 0.8 and (1 - fixed_robust) * 16 / 80 < 0.2
    attack = FixedBatchOnlyAttack(first)
    callback = RobustValidation(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(16), attack, EPS, model
    )
    callback.set_model(model)
    logs: dict = {}
    callback.on_epoch_end(0, logs)
    assert logs["val_overfitting"] == 0.0
    attack.strong = True
    with caplog.at_level(logging.WARNING):
        callback.on_epoch_end(1, logs)
    assert logs["val_robust_accuracy"] > 1.0 - 0.2  # the whole-set clause alone would not fire
    assert logs["val_overfitting"] == 1.0
    assert "catastrophic overfitting suspected" in caplog.text


def test_epoch_timing_logs_the_schedule_s_rate_also_behind_loss_scaling():
    """The logged learning rate is the schedule's at the optimizer's step count, with a plain
    optimizer and with the LossScaleOptimizer that mixed_float16 puts around it."""
    schedule = schedules.Cyclic(lr_max=0.2, total_steps=100)
    x = np.ones((25, 2), np.float32)
    for wrap in (False, True):
        optimizer = keras.optimizers.SGD(schedule)
        if wrap:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
        history = model.fit(x, x[:, :1], batch_size=1, callbacks=[EpochTiming(1)], verbose=0)
        assert int(optimizer.iterations) == 25
        np.testing.assert_allclose(history.history["learning_rate"], [0.1], rtol=1e-6)


def no_attack(model, x, y, seed):
    """A single-step attack that finds nothing: what a gradient-masking model shows FGSM."""
    return x, {}


def test_guard_fires_from_the_first_epoch_when_the_single_step_attack_is_masked(caplog):
    # A model that never had a robust best to fall from: the multi-step attack breaks it from
    # the first epoch, while the single-step one leaves it as accurate as on clean inputs.
    model = linear_model(10)
    rng = np.random.default_rng(4)
    x = rng.uniform(0, 1, (64, 10)).astype(np.float32)
    y = model(x).numpy().argmax(1).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    worst = float(np.mean(model(corner_attack(model, x, y)).numpy().argmax(1) == y))
    assert worst < 1.0 - 0.3  # the gap to the clean accuracy exceeds the masking threshold

    strong = SwitchableAttack()
    strong.strong = True
    masked = RobustValidation(dataset, strong, EPS, model, single_step=no_attack)
    masked.set_model(model)
    logs: dict = {}
    with caplog.at_level(logging.WARNING):
        masked.on_epoch_end(0, logs)
    assert logs["val_robust_accuracy"] == worst and logs["val_fgsm_accuracy"] == 1.0
    assert logs["val_overfitting"] == 1.0
    assert "catastrophic overfitting suspected" in caplog.text

    # The default single-step attack, FGSM from x, is the exact worst case of a linear
    # two-class model: it finds what the multi-step attack finds, and the guard stays quiet.
    honest = RobustValidation(dataset, strong, EPS, model)
    honest.set_model(model)
    logs = {}
    honest.on_epoch_end(0, logs)
    assert logs["val_fgsm_accuracy"] == worst and logs["val_robust_accuracy"] == worst
    assert logs["val_overfitting"] == 0.0


def test_an_epoch_cut_short_shows_the_batches_that_ran(capsys):
    """Free-AT's last epoch stops after the batches its step budget allows: its line says 3/5,
    not 5/5."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((5, 2), np.float32)
    callbacks = [StopAfterBatches(3, 5), Progress()]
    model.fit(x, x[:, :1], batch_size=1, epochs=1, verbose=2, callbacks=callbacks)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("3/5 - "), line


def test_json_has_null_where_a_number_is_not_finite(tmp_path):
    path = str(tmp_path / "r.json")
    write_json_atomic(path, {"loss": float("nan"), "x": [1.0, np.float32("inf")], "n": 2})
    with open(path) as f:
        text = f.read()
    assert json.loads(text) == {"loss": None, "x": [1.0, None], "n": 2}
    assert "NaN" not in text and "Infinity" not in text


def _steps(directory: str) -> dict[str, list[int]]:
    steps: dict[str, list[int]] = {}
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    return steps


class Poison(keras.callbacks.Callback):
    """Puts a NaN into every epoch's logs, as an epoch whose batches were all skipped has."""

    def on_epoch_end(self, epoch, logs=None):
        logs["skipped_loss"] = float("nan")


def test_tensorboard_axes_go_on_after_a_resume_and_skip_non_finite_values(tmp_path):
    """Batch curves are numbered from the batches a resumed run had already trained; epoch
    curves by epoch; a non-finite value is left out, the others written."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((3, 2), np.float32)
    board = TensorBoard(str(tmp_path), update_freq=1, write_graph=False, first_batch=6)
    model.fit(
        x, x[:, :1], batch_size=1, epochs=3, initial_epoch=2, verbose=0, callbacks=[Poison(), board]
    )
    steps = _steps(str(tmp_path / "train"))
    assert steps["batch_loss"] == [7, 8, 9]
    assert steps["epoch_loss"] == [2]
    assert "epoch_skipped_loss" not in steps


class FakeTrainer(keras.Model):
    last_finite_loss = tf.Variable(3.5)


def test_divergence_stops_past_the_skip_limit_and_on_non_finite_validation():
    model = FakeTrainer()
    guard = Divergence(steps_per_epoch=8, max_skipped_fraction=0.25)
    guard.set_model(model)
    model.stop_training = False
    guard.on_epoch_begin(0)
    for batch, skipped in enumerate([0, 1, 2, 2, 2, 2, 2, 2]):  # at most 2 of 8 allowed
        guard.on_train_batch_end(batch, {"nonfinite_batches": float(skipped)})
    assert not model.stop_training
    guard.on_epoch_end(0, {"nonfinite_batches": 2.0})
    assert guard.outcome is None
    guard.on_epoch_begin(1)
    guard.on_train_batch_end(0, {"nonfinite_batches": 1.0})
    guard.on_train_batch_end(1, {"nonfinite_batches": 2.0})
    guard.on_train_batch_end(2, {"nonfinite_batches": 3.0})
    assert model.stop_training
    guard.on_epoch_end(1, {"nonfinite_batches": 3.0})
    assert dataclasses.asdict(guard.outcome) == {
        "epoch": 2,
        "reason": "skipped_batches",
        "nonfinite_batches": 3,
        "steps": 3,
        "max_skipped_fraction": 0.25,
        "val_nonfinite_examples": 0,
        "last_finite_loss": 3.5,
    }

    # A last epoch cut short (Free-AT's, say): the limit is over the steps it ran. Two batches
    # of 8 replays each, every one skipped, in an epoch planned for 16 batches.
    model.stop_training = False
    free = Divergence(steps_per_epoch=16, max_skipped_fraction=0.25, replays=8)
    free.set_model(model)
    free.on_epoch_begin(2)
    free.on_train_batch_end(0, {"nonfinite_batches": 8.0})
    free.on_train_batch_end(1, {"nonfinite_batches": 16.0})
    assert not model.stop_training  # 16 of the 128 planned: the epoch could still recover
    free.on_epoch_end(2, {"nonfinite_batches": 16.0})
    assert free.outcome.reason == "skipped_batches"
    assert (free.outcome.nonfinite_batches, free.outcome.steps) == (16, 16)

    validation = Divergence(steps_per_epoch=8)
    validation.set_model(model)
    validation.on_epoch_begin(0)
    validation.on_train_batch_end(0, {"nonfinite_batches": 0.0})
    validation.on_epoch_end(0, {"nonfinite_batches": 0.0, "val_nonfinite_examples": 5.0})
    assert validation.outcome.reason == "validation"
    assert validation.outcome.val_nonfinite_examples == 5
    assert math.isclose(validation.outcome.last_finite_loss, 3.5)


def test_the_epoch_line_shows_the_numbers_that_matter_and_trouble_only_when_there_is_some():
    from fbat_tf.callbacks import Progress

    logs = {
        "loss": 1.0,
        "adv_accuracy": 0.5,
        "val_robust_accuracy": 0.4,
        "images_per_second": 900.0,
        "learning_rate": 0.1,
        "nonfinite_batches": 0.0,
        "val_overfitting": 0.0,
    }
    shown = Progress()._shown(logs)
    assert shown == {"loss": 1.0, "adv_accuracy": 0.5, "val_robust_accuracy": 0.4}
    shown = Progress()._shown({**logs, "nonfinite_batches": 2.0, "val_overfitting": 1.0})
    assert shown["nonfinite_batches"] == 2.0 and shown["val_overfitting"] == 1.0


def test_the_epoch_line_names_seconds_as_seconds_and_standard_accuracy_as_clean():
    """`epoch_time: 50.6810` beside Keras' `61s` had no unit (it is the training part of the
    epoch), and standard training showed `adv_accuracy` for batches that are clean; results.json
    keeps both names."""
    from fbat_tf import methods
    from fbat_tf.callbacks import Progress
    from fbat_tf.log_names import shown_names

    logs = {"loss": 1.0, "adv_accuracy": 0.5, "epoch_time": 50.681}
    adversarial = shown_names(methods.create("fastat", eps=8 / 255).adversarial)
    assert Progress(adversarial)._shown(logs) == {
        "loss": 1.0,
        "adv_accuracy": 0.5,
        "train_seconds": 50.681,
    }
    clean = shown_names(methods.create("standard").adversarial)
    assert Progress(clean)._shown(logs) == {"loss": 1.0, "accuracy": 0.5, "train_seconds": 50.681}
    assert [methods.create(name, eps=8 / 255).adversarial for name in ("pgd", "free", "nfgsm")] == [
        True
    ] * 3


def test_validation_with_square_counts_robust_only_what_survives_pgd_and_square():
    """A model whose input gradient is zero (its score passes through stop_gradient) shows PGD
    nothing to climb: PGD-10 alone counts every point robust. Its score rises with the image's
    mean, which Square's search, reading only outputs, climbs: with Square after PGD a point
    counts robust only where both leave it, here none, and PGD's own figure is kept beside."""
    from fbat_tf.evaluation import validation_attack

    eps = 0.1
    inputs = keras.Input((5, 5, 1))
    # The mean without its gradient, plus 0 × the mean, so that the gradient exists and is 0.
    mean = keras.layers.Lambda(
        lambda x: (
            tf.stop_gradient(tf.reduce_mean(x, axis=(1, 2))) + 0.0 * tf.reduce_mean(x, axis=(1, 2))
        )
    )(inputs)
    # Class 1 wins once the mean passes 0.885 (reachable: 0.85 + ε = 0.95), class 0 below;
    # a random start moves the mean by 0.035 about once in a thousand.
    logits = keras.layers.Lambda(lambda m: tf.concat([tf.zeros_like(m), 40.0 * (m - 0.885)], 1))(
        mean
    )
    model = keras.Model(inputs, logits)
    x = np.full((16, 5, 5, 1), 0.85, np.float32)
    y = np.zeros(16, np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    results = {}
    for queries in (0, 200):
        attack = validation_attack(eps, "linf", 10, 1, queries, jit_compile=False)
        callback = RobustValidation(dataset, attack, eps, model)
        callback.set_model(model)
        logs: dict = {}
        callback.on_epoch_end(0, logs)
        results[queries] = logs
    assert results[0]["val_clean_accuracy"] == 1.0
    assert results[0]["val_robust_accuracy"] == 1.0 and "val_pgd_accuracy" not in results[0]
    assert results[200]["val_pgd_accuracy"] == 1.0  # the same PGD-10, masked
    assert results[200]["val_robust_accuracy"] == 0.0  # Square broke every point


def test_the_best_weights_are_written_in_a_folder_of_their_own_never_through_a_link(tmp_path):
    """h5py opens its file by name: the weights were written to a fixed, predictable name
    beside best.weights.h5, through any link planted there. They are now written in a folder
    made for them and renamed into place; a link at best.weights.h5 is refused."""
    from fbat_tf.callbacks import save_weights
    from fbat_tf.records import files

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    outside = tmp_path / "outside"
    outside.write_bytes(b"someone else's file")
    path = tmp_path / "best.weights.h5"
    (tmp_path / "best.weights.h5.tmp.weights.h5").symlink_to(outside)  # the old name
    save_weights(model, str(path))
    assert outside.read_bytes() == b"someone else's file"
    assert sorted(os.listdir(tmp_path)) == [
        "best.weights.h5",
        "best.weights.h5.tmp.weights.h5",
        "outside",
    ]
    os.remove(path)
    path.symlink_to(outside)
    with pytest.raises(files.LinkRefused):
        save_weights(model, str(path))
    assert outside.read_bytes() == b"someone else's file"
