"""An evaluation's result: evaluate.py's JSON, and train.py's test of a run's selected model."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fbat_tf.records import units
from fbat_tf.records.files import read_json, write_json_atomic
from fbat_tf.records.indicators import Indicators


@dataclasses.dataclass
class AttackResult:
    """One attack at one ε, over an evaluation's examples or one batch of them."""

    attack: str  # the name it was evaluated under: the registry's ("pgd", "autoattack")
    eps: float  # in the units of its norm's flag (records/units.py): 1/255 for L∞
    # None where the attack could not run (EvaluationResult.not_applicable says why).
    robust_accuracy: float | None
    seconds: float | None = None
    # An ensemble's robust accuracy after each of its parts ("clean" first), and their seconds.
    parts: dict[str, float] = dataclasses.field(default_factory=dict)
    part_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    norm: str = "linf"

    @property
    def key(self) -> str:
        """ "pgd@8" (L∞), "pgd@l2:0.5" (L2)."""
        return units.key(self.attack, self.eps, self.norm)


def _attacked(key: str, *values: Any) -> AttackResult:
    """The AttackResult named `key` (units.key) with the other fields `values`."""
    attack, eps, norm = units.split_key(key)
    return AttackResult(attack, eps, *values, norm=norm)


class _Attacked:
    """Robust accuracy by attack and ε, for an evaluation and for each of its batches."""

    robust: list[AttackResult]

    def attacked(
        self, attack: str, eps: float | None = None, norm: str | None = None
    ) -> AttackResult:
        """The result of `attack` at `eps` (in its norm's flag units: 1/255 for L∞; None: its
        only ε) under `norm` (None: any). KeyError if absent."""
        found = [
            r
            for r in self.robust
            if r.attack == attack and eps in (None, r.eps) and norm in (None, r.norm)
        ]
        if len(found) != 1:
            have = [r.key for r in self.robust]
            wanted = "?" if eps is None else units.key("", eps, norm or "linf")[1:]
            raise KeyError(f"{attack}@{wanted} among {have}")
        return found[0]

    def get(
        self, attack: str, eps: float | None = None, norm: str | None = None
    ) -> AttackResult | None:
        """The result of `attack` at `eps` under `norm`, as `attacked` finds it, or None."""
        try:
            return self.attacked(attack, eps, norm)
        except KeyError:
            return None

    def robust_accuracy(
        self, attack: str, eps: float | None = None, norm: str | None = None
    ) -> float:
        return self.attacked(attack, eps, norm).robust_accuracy


@dataclasses.dataclass
class BatchResult(_Attacked):
    """One global batch of an evaluation."""

    examples: int
    clean_accuracy: float
    robust: list[AttackResult] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        robust = {r.key: r.robust_accuracy for r in self.robust}
        return {
            "examples": self.examples,
            "clean_accuracy": self.clean_accuracy,
            "robust_accuracy": robust,
        }


# How an evaluation counted an example robust. STANDARD: right both clean and at the attack's
# point (attacks.losses.robust_hits; Madry et al., AutoAttack, RobustBench), what every
# evaluation writes. ATTACKED_ONLY: right at the attack's point alone, what evaluations wrote
# before (a point wrong clean that the attack moved back to its label counted robust; AutoAttack
# and its parts always started from the clean pass, so only the other attacks' numbers differ).
# A record without the field is of the older rule; fbat_tf/rescore.py re-scores those that keep
# per-point outcomes.
STANDARD = "clean and attacked"
ATTACKED_ONLY = "attacked only"


@dataclasses.dataclass
class EvaluationResult(_Attacked):
    """What one evaluation found (evaluation.evaluate): evaluate.py's JSON and train.py's test
    of the selected model (RunRecord.final), one schema. `extra` holds how it was made (model
    path, split, the attacks' options, seed, device, ...) as written."""

    examples: int
    clean_accuracy: float
    loss: float | None = None
    robust: list[AttackResult] = dataclasses.field(default_factory=list)
    per_batch: list[BatchResult] = dataclasses.field(default_factory=list)
    replicas: int | None = None
    dataset: str | None = None
    device: str | None = None  # what it ran on (device.describe())
    code: dict[str, Any] | None = None  # provenance.code() of the evaluating code
    # Per evaluated point, in evaluation order, whether the model was right: "1" or "0", one
    # character a point, under "clean", each AttackResult.key and "<key>/<part>" for each part
    # of an ensemble but "clean" (its outcome after that part, cumulative). Empty in records
    # from before they were kept.
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    # How it counted an example robust: STANDARD or ATTACKED_ONLY (above), as written; None
    # for a file that does not say (`scored_by`: ATTACKED_ONLY), written back without it.
    robust_definition: str | None = STANDARD
    # Why an attack (its key: robust accuracy None) or an ensemble's part ("<key>/<part>": not
    # among its parts) did not run: the gradient attacks on a model without input gradients.
    not_applicable: dict[str, str] = dataclasses.field(default_factory=dict)
    # The indicators of attack failure and the reference AutoAttack's checks (DESIGN.md §4.5);
    # None where they were not computed (train.py's test, records from before them).
    indicators: Indicators | None = None

    @property
    def scored_by(self) -> str:
        """STANDARD or ATTACKED_ONLY: the rule its robust counts were made by."""
        return self.robust_definition or ATTACKED_ONLY

    # How it was made, as the writers recorded it in `extra` (`describe`); None where not.
    @property
    def split(self) -> str | None:
        """The split it evaluated: "test", "validation" or "train"."""
        return self.extra.get("split")

    @property
    def first_point(self) -> int | None:
        """The index in the split of its first evaluated point."""
        return self.extra.get("first_point")

    @property
    def seed(self) -> int | None:
        return self.extra.get("seed")

    @property
    def model_path(self) -> str | None:
        """The model evaluate.py attacked."""
        return self.extra.get("model_path")

    @property
    def aa_version(self) -> str | None:
        """AutoAttack's version ("standard"), where it ran."""
        return self.extra.get("aa_version")

    @property
    def clean_outcomes(self) -> str | None:
        """The clean pass's outcomes (one "1" or "0" a point), where kept."""
        return self.outcomes.get("clean")

    def outcome(self, key: str) -> np.ndarray:
        """Whether each evaluated point was classified correctly under `key` ("clean",
        "pgd@8", "autoattack@8/apgd-ce"), as bool [examples]; KeyError naming the keys held."""
        if key not in self.outcomes:
            raise KeyError(f"no outcomes for {key!r}; held: {sorted(self.outcomes)}")
        return np.frombuffer(self.outcomes[key].encode("ascii"), np.uint8) == ord("1")

    def accuracies(self) -> dict[str, float]:
        """Every accuracy an outcome string is kept for, by the outcome's key."""
        found = {"clean": self.clean_accuracy}
        for attacked in self.robust:
            if attacked.robust_accuracy is None:  # not applicable: no outcomes
                continue
            found[attacked.key] = attacked.robust_accuracy
            for part, value in attacked.parts.items():
                if part != "clean":  # the ensemble's clean pass: the evaluation's "clean"
                    found[f"{attacked.key}/{part}"] = value
        return found

    def check_outcomes(self) -> None:
        """ValueError (one line) unless the outcomes, where kept, are one string of "0" and "1"
        per accuracy, each `examples` long, whose share of "1" is that accuracy exactly, and
        over each batch of `per_batch` its accuracy there; and, where the robust definition is
        STANDARD, none robust where the clean pass is wrong."""
        if not self.outcomes:
            return
        accuracies = self.accuracies()
        if set(self.outcomes) != set(accuracies):
            lacking = sorted(set(accuracies) - set(self.outcomes))
            unknown = sorted(set(self.outcomes) - set(accuracies))
            raise ValueError(
                f"outcomes lack {lacking} and hold {unknown}, which no accuracy recorded names"
            )
        for key, accuracy in accuracies.items():
            held = self.outcomes[key]
            if not isinstance(held, str) or len(held) != self.examples or set(held) - {"0", "1"}:
                raise ValueError(
                    f"outcomes[{key!r}] is not a string of {self.examples} '0' and '1' "
                    f"characters, one per example"
                )
            right = held.count("1")
            if accuracy is None or right / len(held) != accuracy:
                raise ValueError(
                    f"outcomes[{key!r}] has {right} of {len(held)} examples right "
                    f"({right / len(held)!r}), but its recorded accuracy is {accuracy!r}"
                )
        start = 0
        for b, batch in enumerate(self.per_batch):
            stop = start + batch.examples
            here = {
                "clean": batch.clean_accuracy,
                **{r.key: r.robust_accuracy for r in batch.robust if r.robust_accuracy is not None},
            }
            for key, accuracy in here.items():
                right = self.outcomes[key][start:stop].count("1") if key in self.outcomes else None
                if right is not None and right / max(batch.examples, 1) != accuracy:
                    raise ValueError(
                        f"outcomes[{key!r}] has {right} of batch {b}'s {batch.examples} examples "
                        f"(from example {start}) right, but its recorded accuracy is {accuracy!r}"
                    )
            start = stop
        if self.per_batch and start != self.examples:
            raise ValueError(f"per_batch holds {start} examples, not {self.examples}")
        if self.scored_by == STANDARD:
            clean = self.outcome("clean")
            for key in self.outcomes:
                wrong_clean = int(np.sum(self.outcome(key) & ~clean))
                if wrong_clean:
                    raise ValueError(
                        f"outcomes[{key!r}] count {wrong_clean} examples robust that the clean "
                        f"pass got wrong, which robust_definition {STANDARD!r} does not allow"
                    )

    def describe(
        self,
        split: str,
        validation_from: str,
        points: dict[str, Any],
        attacks: list[str],
        options: dict[str, Any],
        seed: int,
        norm: str = "linf",
        **more: Any,
    ) -> None:
        """Record how the evaluation was made, under the keys every writer uses: the split and
        where validation examples come from, which of the split's points it evaluated
        (`data.points`: "first_point", and the held-out half's seed and fingerprint), the
        attacks by name and their options (each under its flag's name: `pgd_steps`, ...), the
        seed, the threat model (`norm`, and the units its ε are in: `eps_units`; a record
        without them is L∞ in 1/255), and anything the writer adds."""
        self.extra.update(
            split=split,
            validation_from=validation_from,
            **points,
            attacks=list(attacks),
            **options,
            seed=seed,
            norm=norm,
            eps_units=units.UNIT_NAMES[norm],
            **more,
        )

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> EvaluationResult:
        """The result `payload` holds; ValueError (one line) where its outcomes disagree with
        its accuracies (check_outcomes)."""
        parts, seconds = (
            payload.get(k) or {} for k in ("autoattack_per_attack", "autoattack_seconds")
        )
        times = payload.get("time_s") or {}
        robust = [
            _attacked(key, value, times.get(key), parts.get(key, {}), seconds.get(key, {}))
            for key, value in payload["robust_accuracy"].items()
        ]
        batches = [
            BatchResult(
                b["examples"],
                b["clean_accuracy"],
                [
                    _attacked(key, value)
                    for key, value in b["robust_accuracy"].items()
                    if value is not None
                ],
            )
            for b in payload.get("per_batch") or []
        ]
        numbers_ = ("examples", "clean_accuracy", "loss", "replicas", "dataset", "device", "code")
        written = (
            "robust_accuracy",
            "time_s",
            "per_batch",
            "autoattack_per_attack",
            "autoattack_seconds",
            "outcomes",
            "robust_definition",
            "not_applicable",
            "indicators",
            *numbers_,
        )
        result = cls(
            **{k: payload.get(k) for k in numbers_},
            robust=robust,
            per_batch=batches,
            outcomes=dict(payload.get("outcomes") or {}),
            extra={k: v for k, v in payload.items() if k not in written},
            robust_definition=payload.get("robust_definition"),
            not_applicable=dict(payload.get("not_applicable") or {}),
            indicators=Indicators.from_dict(payload.get("indicators")),
        )
        unexplained = [r.key for r in robust if r.robust_accuracy is None]
        unexplained = [key for key in unexplained if key not in result.not_applicable]
        if unexplained:
            raise ValueError(
                f"robust_accuracy of {unexplained} is null, and not_applicable does not say why"
            )
        result.check_outcomes()
        return result

    @classmethod
    def load(cls, path: str) -> EvaluationResult:
        """evaluate.py's JSON at `path`: FileNotFoundError where there is none, ValueError
        naming the file where it is not an evaluation's or its outcomes disagree with its
        accuracies."""
        payload = read_json(path, "an evaluation's result", "robust_accuracy")
        try:
            return cls.from_dict(payload)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    @classmethod
    def read(cls, path: str) -> EvaluationResult | None:
        """The result at `path`, or None where there is none."""
        try:
            return cls.load(path)
        except FileNotFoundError:
            return None

    def to_dict(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "examples": self.examples,
            "clean_accuracy": self.clean_accuracy,
            "loss": self.loss,
            "robust_accuracy": {r.key: r.robust_accuracy for r in self.robust},
            "time_s": {r.key: r.seconds for r in self.robust},
        }
        if self.robust_definition is not None:
            payload["robust_definition"] = self.robust_definition
        if self.per_batch:
            payload["per_batch"] = [batch.to_dict() for batch in self.per_batch]
        payload["replicas"] = self.replicas
        payload["dataset"] = self.dataset
        payload.update(self.extra)
        payload["autoattack_per_attack"] = {r.key: r.parts for r in self.robust if r.parts}
        payload["autoattack_seconds"] = {
            r.key: r.part_seconds for r in self.robust if r.part_seconds
        }
        if self.device is not None:
            payload["device"] = self.device
        if self.code is not None:
            payload["code"] = self.code
        if self.outcomes:
            payload["outcomes"] = dict(self.outcomes)
        if self.not_applicable:
            payload["not_applicable"] = dict(self.not_applicable)
        if self.indicators is not None:
            payload["indicators"] = self.indicators.to_dict()
        return payload

    def save(self, path: str) -> None:
        write_json_atomic(path, self.to_dict())
