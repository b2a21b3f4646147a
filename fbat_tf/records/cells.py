"""A sweep's cell as its report holds it: CellResult, with its training's summary, each of
its evaluations' and its masking check, every number with the file it came from. sweep.json's
"cells" are their to_dict(); from_dict reads them back.

    cell = CellResult.from_dict(saved)              # ValueError naming the part amiss
    cell.name, cell.eps, cell.state, cell.train.selected_epoch
    cell.evaluation("autoattack").robust(8)         # None where it holds no number at ε = 8
    cell.to_dict() == saved                         # the same keys, in the same order

ε keys these records as a number, in its flag units (8.0 for 8/255; 0.5 for an L2 budget of
0.5), to the 6 significant digits results name it by (f"{eps:g}", eps_key); sweep.json writes
it as that text ("8").
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fbat_tf.records.config import TrainConfig
from fbat_tf.records.parts import by_eps, eps_key, parts_of, texts

# The training logs of a method's own that a cell's summary averages, where the run wrote them
# (Fast-BAT's implicit term).
METHOD_LOGS = ("ig_norm_ratio", "inactive_fraction")


@dataclasses.dataclass(frozen=True)
class TrainSummary:
    """What the report says of a cell's training run, from its record (`source`)."""

    source: str
    status: str
    epochs: int | None
    epochs_run: int
    selected_epoch: int | None
    val_clean_accuracy: list[float | None]
    val_robust_accuracy: list[float | None]
    # FGSM accuracy, logged by runs since the guard compares it with PGD's.
    val_fgsm_accuracy: list[float | None]
    overfitting_epochs: list[int]
    seconds_per_epoch: float | None
    train_seconds: float
    optimizer_steps: int | None
    code: dict[str, Any] | None
    # What prices the run's steps, and its passes through the model per optimizer step.
    cost_variant: str
    passes: dict[str, int]
    # Fingerprints of the initial weights and the first training batch (runs since they were
    # recorded): runs paired by seed share them.
    pairing: dict[str, str] | None
    # The mean over epochs of the METHOD_LOGS the run wrote (`method_logs`), else None.
    ig_norm_ratio: float | None = None
    inactive_fraction: float | None = None
    method_logs: tuple[str, ...] = ()
    # PGD's own validation accuracy by epoch, where validation ran a black-box part after it
    # (val_robust_accuracy is then the two combined); None, and not written, where it did not.
    val_pgd_accuracy: list[float | None] | None = None

    @classmethod
    def from_dict(cls, payload: Any) -> TrainSummary:
        optional = (*METHOD_LOGS, "val_pgd_accuracy")
        names = [
            f.name for f in dataclasses.fields(cls) if f.name not in (*optional, "method_logs")
        ]
        values = parts_of(payload, names, "train", optional)
        logs = tuple(name for name in METHOD_LOGS if name in payload)
        return cls(**values, method_logs=logs)

    def to_dict(self) -> dict[str, Any]:
        payload = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name not in (*METHOD_LOGS, "method_logs", "val_pgd_accuracy")
        }
        if self.val_pgd_accuracy is not None:
            payload["val_pgd_accuracy"] = self.val_pgd_accuracy
        if "ig_norm_ratio" in self.method_logs:
            payload["ig_norm_ratio"] = self.ig_norm_ratio
        if "inactive_fraction" in self.method_logs:
            payload["inactive_fraction"] = self.inactive_fraction
        return payload


@dataclasses.dataclass(frozen=True)
class Outcomes:
    """Which evaluated points an attack at one ε left right ("1" or "0" a point, in order), on
    which split: from the file its robust accuracy came from."""

    points: str
    split: str | None

    @classmethod
    def from_dict(cls, payload: Any) -> Outcomes:
        return cls(**parts_of(payload, ("points", "split"), "outcomes"))

    def to_dict(self) -> dict[str, Any]:
        return {"points": self.points, "split": self.split}


@dataclasses.dataclass(frozen=True)
class EvaluationSummary:
    """What one evaluation's files say of a cell: robust accuracy by ε with the file each
    number came from, seconds by ε, and an ensemble's accuracy after each part and their
    seconds; numbers that are no accuracy apart (`unusable`: why, by ε); where the masking
    check ran, the checked accuracies in `robust_accuracy` (sweeps/masking.py)."""

    source: str
    label: str
    examples: int
    clean_accuracy: float
    robust_accuracy: dict[float, float]
    sources: dict[float, str]
    time_s: dict[float, float | None]
    per_part: dict[float, dict[str, float]]
    part_seconds: dict[float, dict[str, float]]
    code: dict[str, Any] | None
    unusable: dict[float, str] = dataclasses.field(default_factory=dict)
    outcomes: dict[float, Outcomes] = dataclasses.field(default_factory=dict)
    # The accuracies before the masking check replaced those at `checked`.
    unchecked_robust_accuracy: dict[float, float] | None = None
    checked: tuple[float, ...] = ()
    # The indicators of attack failure and the reference's checks that fired on the attack at
    # each ε (records/indicators.py), by name; only the ε where one fired.
    indicated: dict[float, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # The revisions that computed the indicators, or a check of them, after the evaluation
    # (records.Indicators.later); none where the evaluation computed its own.
    indicators_later: tuple[str, ...] = ()

    def robust(self, eps: float) -> float | None:
        """The robust accuracy at ε, or None where there is none (or none usable)."""
        return self.robust_accuracy.get(eps_key(eps))

    def outcome(self, eps: float) -> Outcomes | None:
        return self.outcomes.get(eps_key(eps))

    def is_checked(self, eps: float) -> bool:
        """Whether the accuracy at ε is the masking check's."""
        return eps_key(eps) in self.checked

    @classmethod
    def from_dict(cls, payload: Any, name: str = "evaluation") -> EvaluationSummary:
        optional = (
            *("unusable", "outcomes", "unchecked_robust_accuracy", "checked", "indicated"),
            "indicators_later",
        )
        values = parts_of(payload, _EVALUATION_PARTS, name, optional)
        values["indicators_later"] = tuple(values["indicators_later"] or ())
        indicated = by_eps(values["indicated"] or {}, f"{name}.indicated")
        values["indicated"] = {eps: tuple(names) for eps, names in indicated.items()}
        for part in ("robust_accuracy", "sources", "time_s", "per_part", "part_seconds"):
            values[part] = by_eps(values[part], f"{name}.{part}")
        values["unusable"] = by_eps(values["unusable"] or {}, f"{name}.unusable")
        outcomes = by_eps(values["outcomes"] or {}, f"{name}.outcomes")
        values["outcomes"] = {eps: Outcomes.from_dict(found) for eps, found in outcomes.items()}
        if (values["checked"] is None) != (values["unchecked_robust_accuracy"] is None):
            raise ValueError(f"{name} holds one of checked and unchecked_robust_accuracy")
        if values["checked"] is not None:
            unchecked = values["unchecked_robust_accuracy"]
            values["unchecked_robust_accuracy"] = by_eps(unchecked, f"{name}.unchecked")
            values["checked"] = tuple(by_eps(dict.fromkeys(values["checked"]), f"{name}.checked"))
        else:
            values["checked"] = ()
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "source": self.source,
            "label": self.label,
            "examples": self.examples,
            "clean_accuracy": self.clean_accuracy,
            "robust_accuracy": texts(self.robust_accuracy),
        }
        if self.unusable:
            payload["unusable"] = texts(self.unusable)
        payload.update(
            sources=texts(self.sources),
            time_s=texts(self.time_s),
            per_part=texts(self.per_part),
            part_seconds=texts(self.part_seconds),
            code=self.code,
        )
        if self.outcomes:
            payload["outcomes"] = {f"{e:g}": found.to_dict() for e, found in self.outcomes.items()}
        if self.checked:
            payload["unchecked_robust_accuracy"] = texts(self.unchecked_robust_accuracy or {})
            payload["checked"] = [f"{eps:g}" for eps in self.checked]
        if self.indicated:
            payload["indicated"] = {f"{e:g}": list(names) for e, names in self.indicated.items()}
        if self.indicators_later:
            payload["indicators_later"] = list(self.indicators_later)
        return payload


_EVALUATION_PARTS = (
    "source",
    "label",
    "examples",
    "clean_accuracy",
    "robust_accuracy",
    "sources",
    "time_s",
    "per_part",
    "part_seconds",
    "code",
)

CHECKED, PENDING, NOT_TRIGGERED = "checked", "pending", "not triggered"


@dataclasses.dataclass(frozen=True)
class MaskingEntry:
    """The masking check at one ε of a cell's AutoAttack: the gap (points; None without
    Square last) and whether it triggered; where it did, "pending" until the stronger attack
    (`label`) ran, then "checked" with its accuracy and the two combined, and how."""

    triggered: bool
    gap: float | None
    threshold: float
    autoattack: float
    source: str
    state: str  # CHECKED, PENDING or NOT_TRIGGERED
    label: str | None = None
    strong: float | None = None
    strong_source: str | None = None
    combined: float | None = None
    combined_by: str | None = None
    code: dict[str, Any] | None = None
    # The points that survived both attacks, where both files held per-point outcomes.
    combined_outcomes: str | None = None
    # What black-box attacks broke beyond the white-box parts (points), whether that is more
    # than the threshold (the cell masked at that ε; None where it cannot be told), and on how
    # many of the points the stronger attack ran.
    residual: float | None = None
    masked: bool | None = None
    checked_examples: int | None = None

    @classmethod
    def from_dict(cls, payload: Any) -> MaskingEntry:
        head = ("triggered", "gap", "threshold", "autoattack", "source", "state")
        state = payload.get("state") if isinstance(payload, dict) else None
        more = {
            CHECKED: ("label", "strong", "strong_source", "combined", "combined_by", "code"),
            PENDING: ("label", "strong", "combined"),
            NOT_TRIGGERED: (),
        }
        if state not in more:
            raise ValueError(f"masking_check entry {payload!r} has no state of {list(more)}")
        optional = (
            ("combined_outcomes", "residual", "masked", "checked_examples")
            if state == CHECKED
            else ()
        )
        return cls(**parts_of(payload, (*head, *more[state]), "masking_check entry", optional))

    def to_dict(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "triggered": self.triggered,
            "gap": self.gap,
            "threshold": self.threshold,
            "autoattack": self.autoattack,
            "source": self.source,
        }
        if self.state == NOT_TRIGGERED:
            return {**payload, "state": self.state}
        payload["label"] = self.label
        if self.state == PENDING:
            return {**payload, "state": self.state, "strong": None, "combined": None}
        if self.combined_outcomes is not None:
            payload["combined_outcomes"] = self.combined_outcomes
        for key in ("residual", "masked", "checked_examples"):
            if getattr(self, key) is not None:
                payload[key] = getattr(self, key)
        return {
            **payload,
            "state": self.state,
            "strong": self.strong,
            "strong_source": self.strong_source,
            "combined": self.combined,
            "combined_by": self.combined_by,
            "code": self.code,
        }


@dataclasses.dataclass(frozen=True)
class CellTuning:
    """The tuning unit whose pick a cell's flags carry; `pending`: no pick yet."""

    unit: str
    pending: bool


@dataclasses.dataclass(frozen=True)
class CellCode:
    """Which code made a cell's numbers: the revisions of its training and evaluations (None:
    not a git checkout) and whether any of them ran from uncommitted changes."""

    revisions: tuple[str | None, ...]
    dirty: bool


@dataclasses.dataclass(frozen=True)
class CellResult:
    """Everything the report says of one cell: its identity and flags, its state, the commands
    that make its numbers, and once trained, its training, each evaluation by its name (in the
    definition's order) and the masking check by ε."""

    name: str
    run_dir: str
    method: str
    variant: str
    options: dict[str, Any]
    flags: dict[str, Any]
    eps: float
    seed: int
    state: str
    tuning: CellTuning | None
    commands: dict[str, str]
    code: CellCode
    train: TrainSummary | None = None
    # How the run named its method ("first-order Fast-BAT"); runs before titles have none.
    title: str | None = None
    evaluations: dict[str, EvaluationSummary] = dataclasses.field(default_factory=dict)
    masking_check: dict[float, MaskingEntry] | None = None

    @property
    def norm(self) -> str:
        """The norm it trains under: its --norm flag, else train.py's default."""
        return self.flags.get("norm", TrainConfig.norm)

    def evaluation(self, name: str) -> EvaluationSummary | None:
        """The evaluation of that name, or None where it has not run."""
        return self.evaluations.get(name)

    @classmethod
    def from_dict(cls, payload: Any) -> CellResult:
        if not isinstance(payload, dict):
            raise ValueError(f"a cell is {payload!r}, not an object")
        where = f"cell {payload.get('name')}"
        # Every other part is an evaluation, under its name.
        named = [name for name in payload if name not in (*_IDENTITY, *_RAN)]
        values = parts_of(
            {k: v for k, v in payload.items() if k not in named}, _IDENTITY, where, _RAN
        )
        try:
            values["tuning"] = None if values["tuning"] is None else CellTuning(**values["tuning"])
            values["code"] = CellCode(tuple(values["code"]["revisions"]), values["code"]["dirty"])
        except (TypeError, KeyError):
            raise ValueError(f"{where}: tuning or code of another shape") from None
        if ("train" in payload) != ("title" in payload):
            raise ValueError(f"{where} holds one of train and title")
        if values["train"] is not None:
            values["train"] = TrainSummary.from_dict(values["train"])
        if values["masking_check"] is not None:
            checks = by_eps(values["masking_check"], f"{where}.masking_check")
            values["masking_check"] = {e: MaskingEntry.from_dict(c) for e, c in checks.items()}
        evaluations = {
            name: EvaluationSummary.from_dict(payload[name], f"{where}.{name}") for name in named
        }
        return cls(**values, evaluations=evaluations)

    def to_dict(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "name": self.name,
            "run_dir": self.run_dir,
            "method": self.method,
            "variant": self.variant,
            "options": self.options,
            "flags": self.flags,
            "eps": self.eps,
            "seed": self.seed,
            "state": self.state,
            "tuning": None if self.tuning is None else dataclasses.asdict(self.tuning),
            "commands": self.commands,
        }
        if self.train is not None:
            payload["train"] = self.train.to_dict()
            payload["title"] = self.title
            for name, found in self.evaluations.items():
                payload[name] = found.to_dict()
            if self.masking_check is not None:
                payload["masking_check"] = {
                    f"{eps:g}": entry.to_dict() for eps, entry in self.masking_check.items()
                }
        payload["code"] = {"revisions": list(self.code.revisions), "dirty": self.code.dirty}
        return payload


_IDENTITY = (
    "name",
    "run_dir",
    "method",
    "variant",
    "options",
    "flags",
    "eps",
    "seed",
    "state",
    "tuning",
    "commands",
    "code",
)
_RAN = ("train", "title", "masking_check")


def report_cells(path: str) -> list[str] | None:
    """The names of the cells a sweep's report (sweep.json at `path`) lists: the run
    directories the sweep recorded as its own, beside the report. None where there is no
    such file or it is not a sweep's report (not JSON, no list of named cells)."""
    import json

    try:
        with open(path) as f:
            payload = json.load(f)
    except (OSError, ValueError):
        return None
    cells = payload.get("cells") if isinstance(payload, dict) else None
    if not isinstance(cells, list) or not all(
        isinstance(cell, dict) and isinstance(cell.get("name"), str) for cell in cells
    ):
        return None
    return [cell["name"] for cell in cells]
