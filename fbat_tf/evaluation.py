"""One evaluation run: clean accuracy and robust accuracy per attack and ε, with timing.

classifier, config = classifiers.load_classifier("runs/fmnist")   # the run's selected weights
test = data.load("fashion_mnist", "test", max_examples=1000)
results = evaluate(classifier, test, pgd_attacks([8 / 255], steps=50, restarts=10))
results["robust_accuracy"]["pgd@8"]                      # RA under PGD-50-10 at 8/255

strategy = distribute.create_strategy("mirrored")        # each batch split over the local GPUs
with strategy.scope():
    classifier, config = classifiers.load_classifier("runs/fmnist")
results = evaluate(classifier, test, pgd_attacks([8 / 255]), strategy=strategy)

transfer_robust_accuracy(source, target, PGD(8 / 255), test, eps=8 / 255)   # crafted on source
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from fbat_tf.attacks.base import Attack, Breakdown
from fbat_tf.attacks.losses import correct, cross_entropy
from fbat_tf.attacks.pgd import PGD
from fbat_tf.constraints import check_in_ball

# Inputs pooled for an attack that batches itself (AutoAttack) before it runs over them.
POOL_BYTES = 1 << 30


class NonFiniteError(ValueError):
    """An example whose input or logits are not finite, met by `evaluate`: it can be counted
    neither right nor wrong (argmax of NaN is arbitrary), so the evaluation stops there.
    `examples` is how many examples of the batch have non-finite logits."""

    def __init__(self, message: str, examples: int):
        super().__init__(message)
        self.examples = examples


def _nonfinite_rows(values: tf.Tensor) -> tf.Tensor:
    """How many examples (rows) of a batch hold a NaN or an infinity, as float32."""
    flat = tf.reshape(tf.cast(values, tf.float32), [tf.shape(values)[0], -1])
    finite = tf.reduce_all(tf.math.is_finite(flat), axis=1)
    return tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.float32))


class TransferAttack(Attack):
    """Adversarial examples crafted on a source model, whatever model they are then fed to."""

    def __init__(self, source: Callable, attack: Attack):
        self.source = source
        self.attack = attack
        self.eps = attack.eps

    def __call__(self, model, x: tf.Tensor, y: tf.Tensor, seed) -> tuple[tf.Tensor, Breakdown]:
        return self.attack(self.source, x, y, seed)


def transfer_pgd(
    eps: float, steps: int = 50, restarts: int = 10, *, source: Callable
) -> TransferAttack:
    """PGD-K-R crafted on `source` (the registry's "transfer")."""
    return TransferAttack(source, PGD(eps, steps, restarts))


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

    Every adversarial batch is checked to lie in C before it counts. An example whose clean
    input, clean logits, adversarial point or adversarial logits are not finite raises
    NonFiniteError, naming how many, before its batch is attacked or counted. `progress` shows a bar
    over the batches with the running accuracies. For an attack with parts (AutoAttack),
    "per_attack" gives the accuracy after each part and "per_attack_seconds" the time each took.
    "per_batch" holds each global batch's own "examples", "clean_accuracy" and
    "robust_accuracy" (e.g. the fixed first batch the overfitting guard watches).

    Global batch b is attacked with the seed [seed, b·R + r] on replica r of R, so the numbers
    are a function of the arguments alone (the same at every call, e.g. every epoch's
    validation), and on one device batch b gets [seed, b].

    An attack that batches itself (AutoAttack, `batches_itself`) is instead given the batches
    of a pool (all of them, up to POOL_BYTES of inputs) in one call per replica, with the
    seed [seed, b·R + r] of the pool's first batch b and the replica's batch size: each of its
    parts then attacks the examples still robust across the pool, a batch at a time, as the
    reference re-batches its survivors before every attack. Its "per_batch" counts are kept.

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
            "nonfinite_inputs": _nonfinite_rows(x),
            "nonfinite_logits": _nonfinite_rows(logits),
        }

    def part_counts(breakdown: dict) -> dict[str, tf.Tensor]:
        """An ensemble's examples robust after each part, and the time each took."""
        counts = {}
        for part, mask in breakdown.get("robust", {}).items():
            counts[f"robust/{part}"] = tf.constant(mask.sum(), tf.float32)
        for part, spent in breakdown.get("seconds", {}).items():
            counts[f"seconds/{part}"] = tf.constant(spent, tf.float32)
        return counts

    def robust_counts(eps: float, attack: Attack, index: list, x: tf.Tensor, y: tf.Tensor):
        """An attack on this replica's shards of the global batches in `index`, [(batch b,
        shard size per local replica)], given joined: the robust count of each batch, and an
        ensemble's counts per part. Seeded as batch b's first of them."""
        replica = int(tf.distribute.get_replica_context().replica_id_in_sync_group)
        local = len(index[0][1])  # this worker's replicas
        shards = [sizes[replica % local] for _, sizes in index]
        # The largest shard of this worker: the batch per replica (1 where all are empty).
        size = max(1, *(max(sizes) for _, sizes in index))
        seed_ = tf.constant([seed, index[0][0] * replicas + replica], tf.int32)
        if getattr(attack, "batches_itself", False):
            progress_ = progress and replicas == 1
            x_adv, breakdown = attack(classifier, x, y, seed_, batch_size=size, progress=progress_)
        else:
            x_adv, breakdown = attack(classifier, x, y, seed_)
        nonfinite = int(_nonfinite_rows(x_adv))
        if nonfinite:
            raise NonFiniteError(
                f"the attack's points are not finite for {nonfinite} examples (NaN or infinite "
                "input gradients of the model there)",
                nonfinite,
            )
        check_in_ball(x_adv, x, eps)
        logits = [
            classifier(x_adv[i : i + size], training=False) for i in range(0, int(x.shape[0]), size)
        ]
        nonfinite = sum(int(_nonfinite_rows(v)) for v in logits)
        if nonfinite:
            raise NonFiniteError(
                f"{nonfinite} adversarial examples give non-finite logits (NaN or infinite)",
                nonfinite,
            )
        hits = [correct(v, y[i * size : (i + 1) * size]) for i, v in enumerate(logits)]
        hits = tf.concat(hits, 0) if hits else tf.zeros([0])
        robust = tf.math.segment_sum(hits, tf.repeat(tf.range(len(shards)), shards))
        robust = tf.pad(robust, [[0, len(shards) - robust.shape[0]]])  # empty last shards
        return {"robust": robust, **part_counts(breakdown)}

    def summed(fn: Callable, *args) -> dict[str, Any]:
        per_replica = strategy.run(fn, args=args)
        reduced = {
            key: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None).numpy()
            for key, value in per_replica.items()
        }
        return {key: float(v) if v.ndim == 0 else v.astype(float) for key, v in reduced.items()}

    def run_attack(name: str, index: list, x, y) -> None:
        """Attack `name` on the global batches in `index`; x and y hold them joined."""
        eps, attack = attacks[name]
        start = time.perf_counter()
        counts = summed(functools.partial(robust_counts, eps, attack, index), x, y)
        seconds[name] += time.perf_counter() - start
        for (batch, _), hits in zip(index, counts.pop("robust"), strict=True):
            per_batch[batch]["robust_accuracy"][name] = hits / max(per_batch[batch]["examples"], 1)
            robust[name] += hits
            covered[name] += per_batch[batch]["examples"]
        for key, value in counts.items():
            kind, part = key.split("/", 1)
            per_part = parts[kind].setdefault(name, {})
            per_part[part] = per_part.get(part, 0.0) + value

    def run_pooled() -> None:
        """Each attack that batches itself, once over every batch in the pool."""
        local = len(pool[0][1])  # this worker's replicas

        def joined(values: list[list[tf.Tensor]]):
            per_replica = [tf.concat([v[i] for v in values], 0) for i in range(local)]
            return strategy.experimental_distribute_values_from_function(
                lambda context: per_replica[context.replica_id_in_sync_group % local]
            )

        x, y = joined([xs for _, xs, _ in pool]), joined([ys for _, _, ys in pool])
        index = [(batch, [int(v.shape[0]) for v in xs]) for batch, xs, _ in pool]
        for name in pooled:
            run_attack(name, index, x, y)
        pool.clear()

    clean = loss = total = 0.0
    robust = dict.fromkeys(attacks, 0.0)
    seconds = dict.fromkeys(attacks, 0.0)
    parts: dict[str, dict[str, dict[str, float]]] = {"robust": {}, "seconds": {}}
    per_batch = []
    # An attack that batches itself (AutoAttack) is given the batches of a pool of up to
    # POOL_BYTES of inputs at once: each of its parts then runs over the survivors of all of
    # them, in calls of one batch each, as the reference does over its whole set.
    pooled = {n: v for n, v in attacks.items() if getattr(v[1], "batches_itself", False)}
    covered = dict.fromkeys(attacks, 0)  # examples each attack has counted so far
    pool: list[tuple[int, list[tf.Tensor], list[tf.Tensor]]] = []
    # Workers split the batches of the one pipeline (not its files), so that together they see
    # exactly the examples one device would: the first N, say.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batched = strategy.experimental_distribute_dataset(dataset.with_options(options))
    for batch, (x, y) in enumerate(batched):
        counts = summed(clean_counts, x, y)
        if counts["nonfinite_logits"] or counts["nonfinite_inputs"]:
            raise NonFiniteError(
                f"batch {batch}: {counts['nonfinite_logits']:.0f} of {counts['examples']:.0f} "
                "examples give non-finite logits (NaN or infinite) on clean inputs, "
                f"{counts['nonfinite_inputs']:.0f} have non-finite pixels",
                int(counts["nonfinite_logits"]),
            )
        clean += counts["correct"]
        loss += counts["loss"]
        total += counts["examples"]
        examples = max(counts["examples"], 1.0)  # a global batch holds examples; never 0
        this_batch = {
            "examples": int(counts["examples"]),
            "clean_accuracy": counts["correct"] / examples,
            "robust_accuracy": dict.fromkeys(attacks),
        }
        per_batch.append(this_batch)
        xs, ys = strategy.experimental_local_results(x), strategy.experimental_local_results(y)
        for name in attacks:
            if name not in pooled:
                run_attack(name, [(batch, [int(v.shape[0]) for v in xs])], x, y)
        if pooled:
            pool.append((batch, xs, ys))
            if sum(v.shape.num_elements() * v.dtype.size for _, xs, _ in pool for v in xs) >= (
                POOL_BYTES
            ):
                run_pooled()
        if bar is not None:
            running = [("clean", clean / total)]
            running += [(name, robust[name] / n) for name, n in covered.items() if n]
            bar.add(1, values=running)
    if pool:
        run_pooled()
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
        "per_batch": per_batch,
        "time_s": seconds,
        "replicas": replicas,
    }


def transfer_robust_accuracy(
    source_model: keras.Model,
    target_model: keras.Model,
    attack: Attack,
    dataset: tf.data.Dataset,
    eps: float,
    seed: int = 0,
) -> float:
    """Accuracy of `target_model` on the points `attack` crafts against `source_model`.

    `evaluate` with a TransferAttack: every crafted batch is checked to lie in C (radius `eps`)
    before it counts, and batch b is attacked with the seed [seed, b].
    """
    transfer = {"transfer": (eps, TransferAttack(source_model, attack))}
    return evaluate(target_model, dataset, transfer, seed=seed)["robust_accuracy"]["transfer"]
