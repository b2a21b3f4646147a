"""What an evaluation adds up as it goes: counts per global batch and attack, and each example's
outcome placed at its position in the dataset, whatever the strategy's order of replicas.

    dataset = positioned(dataset)                 # batches (x, y, position of each example)
    tally = Tally(attacks)
    tally.add_clean(batch, counts)                # counts summed over replicas (evaluation.py)
    tally.add_outcomes(start, placed_outcomes(span, counts))
    result = tally.result(replicas)               # an EvaluationResult, its outcomes checked
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from fbat_tf.records import AttackResult, BatchResult, EvaluationResult, units


class NonFiniteError(ValueError):
    """An example whose input or logits are not finite, met by `evaluate`: it can be counted
    neither right nor wrong (argmax of NaN is arbitrary), so the evaluation stops there.
    `examples` is how many examples of the batch have non-finite logits."""

    def __init__(self, message: str, examples: int):
        super().__init__(message)
        self.examples = examples


class Tally:
    """Running sums of an evaluation, and its result."""

    def __init__(
        self,
        attacks: Mapping[tuple[str, float], Any],
        labels: Mapping[tuple[str, float], str] | None = None,
    ):
        self.clean = self.loss = self.total = 0.0
        self.labels = dict(labels or {})  # what `running` calls an attack, if not its key
        # Each attack's norm: an attack of the user's own need not say it, and is then L∞.
        self.norms = {name: getattr(attack, "norm", "linf") for name, attack in attacks.items()}
        self.robust = dict.fromkeys(attacks, 0.0)
        self.covered = dict.fromkeys(attacks, 0.0)  # examples each attack has counted so far
        self.seconds = dict.fromkeys(attacks, 0.0)
        self.parts: dict[str, dict[str, dict[str, float]]] = {"robust": {}, "seconds": {}}
        self.per_batch: list[BatchResult] = []
        self.starts: list[int] = []  # the position of each global batch's first example
        # Per key of EvaluationResult.outcomes, each global batch's (or pool's) outcomes, in
        # order: (position of the first, bool per example).
        self.outcomes: dict[str, list[tuple[int, np.ndarray]]] = {"clean": []}

    def span(self, index: list) -> tuple[int, int]:
        """The positions [start, stop) of the examples of the consecutive global batches in
        `index` (see _Pool.take)."""
        first, last = index[0][0], index[-1][0]
        if [batch for batch, _ in index] != list(range(first, last + 1)):
            raise AssertionError(f"a pool holds batches {[b for b, _ in index]}, not a run")
        return self.starts[first], self.starts[last] + self.per_batch[last].examples

    def add_clean(self, batch: int, counts: dict[str, float]) -> None:
        if counts["nonfinite_logits"] or counts["nonfinite_inputs"]:
            raise NonFiniteError(
                f"batch {batch}: {counts['nonfinite_logits']:.0f} of {counts['examples']:.0f} "
                "examples give non-finite logits (NaN or infinite) on clean inputs, "
                f"{counts['nonfinite_inputs']:.0f} have non-finite pixels",
                int(counts["nonfinite_logits"]),
            )
        self.starts.append(int(self.total))
        self.clean += counts["correct"]
        self.loss += counts["loss"]
        self.total += counts["examples"]
        # a global batch holds examples; never 0
        accuracy = counts["correct"] / max(counts["examples"], 1.0)
        self.per_batch.append(BatchResult(int(counts["examples"]), accuracy))

    def add_outcomes(self, start: int, outcomes: dict[str, np.ndarray], name=None) -> None:
        """The outcomes of the examples from position `start` on: "clean", or attack `name`'s
        ("hits") and its parts'."""
        for kind, hits in outcomes.items():
            if name is None:
                key = kind
            else:
                key = self.named(name).key
                key = key if kind == "hits" else f"{key}/{kind}"
            self.outcomes.setdefault(key, []).append((start, hits))

    def add_robust(
        self, name: tuple[str, float], index: list, counts: dict[str, Any], seconds: float
    ) -> None:
        """The counts of attack `name` over the global batches in `index` (see _Pool.take)."""
        self.seconds[name] += seconds
        for (batch, _), hits in zip(index, counts.pop("robust"), strict=True):
            this_batch = self.per_batch[batch]
            accuracy = hits / max(this_batch.examples, 1)
            this_batch.robust.append(self.named(name, accuracy))
            self.robust[name] += hits
            self.covered[name] += this_batch.examples
        for key, value in counts.items():
            kind, part = key.split("/", 1)
            per_part = self.parts[kind].setdefault(name, {})
            per_part[part] = per_part.get(part, 0.0) + value

    def named(
        self, name: tuple[str, float], robust_accuracy: float | None = None, *values: Any
    ) -> AttackResult:
        """The AttackResult of attack `name` (its name and ε in pixel units) with the other
        fields `robust_accuracy` and `values`, ε in its norm's flag units (records/units.py)."""
        attack, eps = name
        norm = self.norms[name]
        return AttackResult(
            attack, units.in_flag_units(eps, norm), robust_accuracy, *values, norm=norm
        )

    def running(self) -> list[tuple[str, float]]:
        """What a progress bar shows: clean accuracy, and each attack's robust accuracy so far,
        by its label where given ("PGD-20-1"), else by its key ("pgd@8")."""
        counted = [
            (self.labels.get(name) or self.named(name).key, self.robust[name] / n)
            for name, n in self.covered.items()
            if n
        ]
        return [("clean", self.clean / self.total), *counted]

    def result(self, replicas: int) -> EvaluationResult:
        if self.total == 0:
            raise ValueError("evaluation got an empty dataset")
        total = self.total
        robust = [
            self.named(
                name,
                count / total,
                self.seconds[name],
                {part: n / total for part, n in self.parts["robust"].get(name, {}).items()},
                self.parts["seconds"].get(name, {}),
            )
            for name, count in self.robust.items()
        ]
        result = EvaluationResult(
            int(total),
            self.clean / total,
            self.loss / total,
            robust,
            self.per_batch,
            replicas,
            outcomes={key: self._joined(key, pieces) for key, pieces in self.outcomes.items()},
        )
        try:
            result.check_outcomes()
        except ValueError as error:
            raise AssertionError(
                f"the evaluation's outcomes and counts disagree: {error}"
            ) from None
        return result

    def _joined(self, key: str, pieces: list[tuple[int, np.ndarray]]) -> str:
        """The outcomes of `key` as EvaluationResult keeps them: one "0" or "1" a position."""
        at = 0
        for start, hits in pieces:
            if start != at:
                raise AssertionError(f"outcomes of {key} from {start} follow those up to {at}")
            at += hits.size
        if at != self.total:
            raise AssertionError(f"outcomes of {key} for {at} of {self.total:.0f} examples")
        joined = np.concatenate([hits for _, hits in pieces]).astype(np.uint8) + ord("0")
        return joined.tobytes().decode("ascii")


def placed(span: tuple[int, int], positions: tf.Tensor, outcomes: dict[str, tf.Tensor]):
    """This replica's outcomes (per example, 1.0 right) scattered to their positions in the
    dataset, less span[0], over span[1] - span[0] places: summed over replicas, each place holds
    its example's, once, as "placed/<key>"; "placed" counts the examples placed at each.
    Where each example lies is what the data pipeline says (positioned), not the order in which
    a strategy splits a batch over replicas or workers."""
    start, stop = span
    where = tf.expand_dims(tf.cast(positions, tf.int64) - start, 1)
    ones = tf.ones(tf.shape(positions), tf.float32)
    placed = {"placed": tf.scatter_nd(where, ones, [stop - start])}
    for key, hits in outcomes.items():
        placed[f"placed/{key}"] = tf.scatter_nd(where, tf.cast(hits, tf.float32), [stop - start])
    return placed


def placed_outcomes(span: tuple[int, int], counts: dict[str, Any]) -> dict[str, np.ndarray]:
    """The summed placed outcomes in `counts` (taken out of it), as bool per example of `span`;
    AssertionError unless each example was placed exactly once."""
    placed = counts.pop("placed")
    if placed.shape != (span[1] - span[0],) or not np.all(placed == 1):
        missing = np.flatnonzero(placed != 1)
        raise AssertionError(
            f"examples {span[0]}..{span[1] - 1}: positions {(missing + span[0]).tolist()[:10]} "
            "were not evaluated exactly once"
        )
    keys = [key for key in counts if key.startswith("placed/")]
    return {key.removeprefix("placed/"): counts.pop(key) > 0.5 for key in keys}


def positioned(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The batches (x, y) of `dataset` with the position of each example in it: (x, y, i)."""

    def add(start: tf.Tensor, batch: tuple) -> tuple[tf.Tensor, tuple]:
        x, y = batch
        size = tf.shape(x, out_type=tf.int64)[0]
        return start + size, (x, y, start + tf.range(size))

    return dataset.scan(tf.constant(0, tf.int64), add)
