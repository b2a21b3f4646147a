"""One evaluation run: clean accuracy and robust accuracy per attack and ε, with timing.

classifier, config = load_classifier("runs/fmnist")      # the run's best checkpoint
test = data.load("fashion_mnist", "test", max_examples=1000)
results = evaluate(classifier, test, pgd_attacks([8 / 255], steps=50, restarts=10))
results["robust_accuracy"]["pgd@8"]                      # RA under PGD-50-10 at 8/255

strategy = distribute.create_strategy("mirrored")        # each batch split over the local GPUs
with strategy.scope():
    classifier, config = load_classifier("runs/fmnist")
results = evaluate(classifier, test, pgd_attacks([8 / 255]), strategy=strategy)
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from fbat_tf.attacks.base import Attack, Breakdown
from fbat_tf.attacks.losses import correct, cross_entropy
from fbat_tf.attacks.pgd import PGD
from fbat_tf.constraints import check_in_ball
from fbat_tf.run import Run


def load_classifier(workdir: str, weights: str = "best") -> tuple[keras.Model, dict[str, Any]]:
    """A training run's classifier with its weights ("best", the selected checkpoint, or a
    .weights.h5 path), and the run's saved config."""
    run = Run(workdir)
    return run.build_classifier(weights), run.config()


class SavedModelClassifier:
    """An exported SavedModel's `serving_default` as a classifier: `model(x, training=False)`
    returns its logits, differentiably, so every attack runs against the served graph."""

    compute_dtype = "float32"  # exports compute in float32 whatever the training precision

    def __init__(self, path: str):
        self.loaded = tf.saved_model.load(path)
        self.signature = self.loaded.signatures["serving_default"]

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        return self.signature(images=tf.cast(x, tf.float32))["logits"]


class InferenceGraph:
    """A Keras classifier's inference pass (`training=False`) as one graph with its weights
    folded into constants: `graph(x)` gives the same logits, differentiably, and Grappler can
    fold the normalization layers into the convolutions (AutoAttack on the small CNN 14% faster
    on a CPU, bench/README.md). For a model whose weights no longer change.
    """

    def __init__(self, model: keras.Model):
        # A private TensorFlow module: TF 2 has no public way to fold variables into a graph's
        # constants. The public route, attacking the Keras model, is what --nofold_weights
        # runs; folding is kept for the speed-up measured in bench/README.md.
        from tensorflow.python.framework.convert_to_constants import (
            convert_variables_to_constants_v2,
        )

        spec = tf.TensorSpec([None, *model.input_shape[1:]], tf.float32)
        inference = tf.function(
            lambda x: model(x, training=False), autograph=False
        ).get_concrete_function(spec)
        self.function = convert_variables_to_constants_v2(inference)
        self.compute_dtype = model.compute_dtype

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        return self.function(tf.cast(x, tf.float32))[0]


class TransferAttack(Attack):
    """Adversarial examples crafted on a source model, whatever model they are then fed to."""

    def __init__(self, source: Callable, attack: Attack):
        self.source = source
        self.attack = attack
        self.eps = attack.eps

    def __call__(self, model, x: tf.Tensor, y: tf.Tensor, seed) -> tuple[tf.Tensor, Breakdown]:
        return self.attack(self.source, x, y, seed)


def load_model(path: str) -> tuple[Callable, dict[str, Any]]:
    """A classifier from a training run directory, a .keras file or a SavedModel directory,
    with what is known of it ({"dataset", "eps"} from the run or the model card, else {})."""
    if Run(path).is_run():
        classifier, config = load_classifier(path)
        return classifier, {"dataset": config["dataset"], "eps": config["eps"]}
    if os.path.exists(os.path.join(path, "saved_model.pb")):
        card_path = os.path.join(path, "assets.extra", "model_card.json")
        card = {}
        if os.path.exists(card_path):
            with open(card_path) as f:
                card = json.load(f)
        known = {"dataset": card["dataset"]} if card.get("dataset") else {}
        if isinstance(card.get("eps"), dict) and card["eps"].get("pixels") is not None:
            known["eps"] = card["eps"]["pixels"]
        return SavedModelClassifier(path), known
    if path.endswith(".keras") and os.path.isfile(path):
        return keras.models.load_model(path), {}
    raise FileNotFoundError(
        f"{path} is neither a training run directory (results.json), a SavedModel directory "
        "(saved_model.pb) nor a .keras file"
    )


def pgd_attacks(
    eps_values: Sequence[float],
    steps: int = 50,
    restarts: int = 10,
    jit_compile: bool = False,
) -> dict[str, tuple[float, Attack]]:
    """PGD-K-R at each ε (pixel units), named "pgd@<ε in 1/255>"."""
    return {
        f"pgd@{eps * 255:g}": (eps, PGD(eps, steps, restarts, jit_compile=jit_compile))
        for eps in eps_values
    }


def check_logits(classifier: Callable, x: tf.Tensor) -> None:
    """Raise ValueError for a classifier whose outputs look like probabilities: every row
    non-negative and summing to 1. The attacks' losses (cross-entropy, DLR, FAB's boundaries)
    take logits; on probabilities they compute something else, silently."""
    outputs = tf.cast(classifier(x, training=False), tf.float32)
    rows_sum_to_one = tf.reduce_all(tf.abs(tf.reduce_sum(outputs, -1) - 1.0) < 1e-3)
    if bool(tf.reduce_all(outputs >= 0.0)) and bool(rows_sum_to_one):
        raise ValueError(
            "the model's outputs are probabilities (every row is non-negative and sums to 1, as "
            "after a softmax), but the attacks need logits: evaluate the model without its final "
            "softmax, e.g. keras.Model(model.inputs, model.layers[-1].input) when the softmax "
            "is a layer of its own, or rebuild the last Dense layer with activation=None"
        )


def check_distributable(strategy: tf.distribute.Strategy) -> None:
    """Raise ValueError for a strategy whose replicas cannot run the attacks.

    The attacks mix graphs with Python and NumPy bookkeeping between them (subsets of the
    examples still robust, AutoAttack's masks), so a replica runs them eagerly,
    which a TPU replica cannot: there, evaluate on the host with the default strategy.
    """
    if isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
        raise ValueError(
            "evaluation cannot run its attacks inside a TPU replica (they run Python and NumPy "
            "between graph calls); evaluate with the default strategy"
        )


def evaluate(
    classifier: keras.Model,
    dataset: tf.data.Dataset,
    attacks: Mapping[str, tuple[float, Attack]],
    progress: bool = False,
    strategy: tf.distribute.Strategy | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Clean loss and accuracy, and robust accuracy and time of each named (ε, attack).

    Every adversarial batch is checked to lie in C before it counts. `progress` shows a bar
    over the batches with the running accuracies. For an attack with parts (AutoAttack),
    "per_attack" gives the accuracy after each part and "per_attack_seconds" the time each took.

    Global batch b is attacked with the seed [seed, b·R + r] on replica r of R, so the numbers
    are a function of the arguments alone (the same at every call, e.g. every epoch's
    validation), and on one device batch b gets [seed, b].

    `strategy` (default: the current one) splits each global batch of `dataset` over its
    replicas: each replica runs the clean pass and every attack on its shard, and the counts are
    summed over replicas (and workers), so that an attack that is deterministic per example gives
    the counts of one device. "time_s" is wall time, whatever the number of replicas;
    "per_attack_seconds" sums the replicas' (and workers') times. Load the classifier under
    `strategy.scope()`, so that each replica reads its own copy of the weights.
    """
    strategy = strategy or tf.distribute.get_strategy()
    check_distributable(strategy)
    batches = int(dataset.cardinality())
    bar = keras.utils.Progbar(batches if batches > 0 else None) if progress else None
    replicas = strategy.num_replicas_in_sync

    def clean_counts(x: tf.Tensor, y: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = classifier(x, training=False)
        return {
            "correct": tf.reduce_sum(correct(logits, y)),
            "loss": tf.reduce_sum(cross_entropy(logits, y)),
            "examples": tf.cast(tf.shape(x)[0], tf.float32),
        }

    def robust_counts(eps: float, attack: Attack, batch: int, x: tf.Tensor, y: tf.Tensor):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        index = batch * replicas + tf.cast(replica, tf.int32)
        x_adv, breakdown = attack(classifier, x, y, tf.stack([tf.constant(seed), index]))
        check_in_ball(x_adv, x, eps)
        counts = {"robust": tf.reduce_sum(correct(classifier(x_adv, training=False), y))}
        for part, mask in breakdown.get("robust", {}).items():
            counts[f"robust/{part}"] = tf.constant(mask.sum(), tf.float32)
        for part, spent in breakdown.get("seconds", {}).items():
            counts[f"seconds/{part}"] = tf.constant(spent, tf.float32)
        return counts

    def summed(fn: Callable, *args) -> dict[str, float]:
        per_replica = strategy.run(fn, args=args)
        return {
            key: float(strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None))
            for key, value in per_replica.items()
        }

    clean = loss = total = 0.0
    robust = dict.fromkeys(attacks, 0.0)
    seconds = dict.fromkeys(attacks, 0.0)
    parts: dict[str, dict[str, dict[str, float]]] = {"robust": {}, "seconds": {}}
    # Workers split the batches of the one pipeline (not its files), so that together they see
    # exactly the examples one device would: the first N, say.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batched = strategy.experimental_distribute_dataset(dataset.with_options(options))
    for batch, (x, y) in enumerate(batched):
        counts = summed(clean_counts, x, y)
        clean += counts["correct"]
        loss += counts["loss"]
        total += counts["examples"]
        for name, (eps, attack) in attacks.items():
            start = time.perf_counter()
            counts = summed(functools.partial(robust_counts, eps, attack, batch), x, y)
            seconds[name] += time.perf_counter() - start
            robust[name] += counts.pop("robust")
            for key, value in counts.items():
                kind, part = key.split("/", 1)
                per_part = parts[kind].setdefault(name, {})
                per_part[part] = per_part.get(part, 0.0) + value
        if bar is not None:
            running = [("clean", clean / total)]
            running += [(name, value / total) for name, value in robust.items()]
            bar.add(1, values=[(k, v) for k, v in running])
    if total == 0:
        raise ValueError("evaluation got an empty dataset")
    return {
        "examples": int(total),
        "clean_accuracy": clean / total,
        "loss": loss / total,
        "robust_accuracy": {name: value / total for name, value in robust.items()},
        "per_attack": {
            name: {part: count / total for part, count in counts.items()}
            for name, counts in parts["robust"].items()
        },
        "per_attack_seconds": parts["seconds"],
        "time_s": seconds,
        "replicas": replicas,
    }


def plot_robustness(results: dict[str, Any], path: str, labels: Mapping[str, str]) -> None:
    """Robust accuracy against ε, one line per attack, the clean accuracy at ε = 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, list[tuple[float, float]]] = {}
    for key, accuracy in results["robust_accuracy"].items():
        name, eps = key.split("@")
        curves.setdefault(name, [(0.0, results["clean_accuracy"])]).append((float(eps), accuracy))
    figure, axes = plt.subplots(figsize=(5, 3.5))
    for name, points in curves.items():
        eps, accuracy = zip(*sorted(points), strict=True)
        axes.plot(eps, [100 * a for a in accuracy], marker="o", label=labels.get(name, name))
    axes.set_xlabel("ε (1/255)")
    axes.set_ylabel("accuracy (%)")
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend()
    axes.set_title(f"{results.get('dataset', '')}: first {results['examples']} examples")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
