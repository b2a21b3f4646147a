"""One evaluation run: clean accuracy and robust accuracy per attack and ε, with timing.

classifier = load_classifier("runs/fmnist")              # the run's best checkpoint
test = data.load("fashion_mnist", "test", max_examples=1000)
results = evaluate(classifier, test, eps_values=[8 / 255], pgd_steps=50, pgd_restarts=10)
results["robust"]["8"]["pgd"]                            # RA under PGD-50-10 at 8/255
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from fbat_tf import data, models
from fbat_tf.attacks.losses import correct, cross_entropy
from fbat_tf.attacks.pgd import PGD


def load_classifier(workdir: str, weights: str = "best") -> tuple[keras.Model, dict[str, Any]]:
    """Rebuild a training run's classifier from its results.json and load its weights.

    `weights`: "best" (best validation robust accuracy) or a path to a .weights.h5 file.
    """
    results_path = os.path.join(workdir, "results.json")
    if not os.path.exists(results_path):
        raise FileNotFoundError(f"{workdir} holds no results.json: not a training run directory")
    with open(results_path) as f:
        config = json.load(f)["config"]
    info = data.info(config["dataset"])
    classifier = models.build(
        config["model"],
        num_classes=info.num_classes,
        input_shape=info.image_shape,
        mean=info.mean,
        std=info.std,
        activation=config["activation"],
        width=config["width"],
    )
    path = os.path.join(workdir, "checkpoints", "best.weights.h5") if weights == "best" else weights
    if not os.path.exists(path):
        raise FileNotFoundError(f"no weights at {path}")
    classifier.load_weights(path)
    return classifier, config


Attack = Callable[[keras.Model, tf.Tensor, tf.Tensor], tf.Tensor]


def check_in_ball(x_adv: tf.Tensor, x: tf.Tensor, eps: float, tol: float = 1e-6) -> None:
    """Raise if ‖x_adv − x‖∞ > ε + tol or x_adv leaves [0, 1]: such a batch must not count."""
    distance = float(tf.reduce_max(tf.abs(tf.cast(x_adv, tf.float32) - tf.cast(x, tf.float32))))
    low, high = float(tf.reduce_min(x_adv)), float(tf.reduce_max(x_adv))
    if distance > eps + tol or low < -tol or high > 1 + tol:
        raise AssertionError(
            f"adversarial batch outside C: ‖δ‖∞ = {distance:.3g} (ε = {eps:.3g}), "
            f"range [{low:.3g}, {high:.3g}]"
        )


def pgd_attacks(
    eps_values: Sequence[float],
    steps: int = 50,
    restarts: int = 10,
    seed: int = 0,
    jit_compile: bool = False,
) -> dict[str, tuple[float, Attack]]:
    """PGD-K-R at each ε (pixel units), named "pgd@<ε in 1/255>"."""
    return {
        f"pgd@{eps * 255:g}": (eps, PGD(eps, steps, restarts, seed=seed, jit_compile=jit_compile))
        for eps in eps_values
    }


def evaluate(
    classifier: keras.Model,
    dataset: tf.data.Dataset,
    attacks: Mapping[str, tuple[float, Attack]],
) -> dict[str, Any]:
    """Clean loss and accuracy, and robust accuracy and time of each named (ε, attack).

    Every adversarial batch is checked to lie in C before it counts.
    """
    clean = loss = total = 0.0
    robust = dict.fromkeys(attacks, 0.0)
    seconds = dict.fromkeys(attacks, 0.0)
    for x, y in dataset:
        logits = classifier(x, training=False)
        clean += float(tf.reduce_sum(correct(logits, y)))
        loss += float(tf.reduce_sum(cross_entropy(logits, y)))
        total += int(x.shape[0])
        for name, (eps, attack) in attacks.items():
            start = time.perf_counter()
            x_adv = attack(classifier, x, y)
            check_in_ball(x_adv, x, eps)
            robust[name] += float(tf.reduce_sum(correct(classifier(x_adv, training=False), y)))
            seconds[name] += time.perf_counter() - start
    if total == 0:
        raise ValueError("evaluation got an empty dataset")
    return {
        "examples": int(total),
        "clean_accuracy": clean / total,
        "loss": loss / total,
        "robust_accuracy": {name: value / total for name, value in robust.items()},
        "time_s": seconds,
    }
