"""A training run's record: results.json as RunRecord, its Epochs, its method and how it
ended."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any

from fbat_tf.records import upgrade
from fbat_tf.records.config import TrainConfig, config_from_dict
from fbat_tf.records.evaluations import EvaluationResult
from fbat_tf.records.files import read_json, write_json_atomic


@dataclasses.dataclass
class Epoch:
    """One finished epoch: its number (from 1) and the logs Keras and the callbacks gave it
    (training loss and accuracy, validation's accuracies, whatever a method logs)."""

    epoch: int
    logs: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def get(self, name: str) -> float | None:
        """A log by name (a method's own, such as "ig_norm_ratio"); None where absent."""
        return self.logs.get(name)

    @property
    def val_robust_accuracy(self) -> float | None:
        return self.logs.get("val_robust_accuracy")

    @property
    def val_clean_accuracy(self) -> float | None:
        return self.logs.get("val_clean_accuracy")

    @property
    def val_fgsm_accuracy(self) -> float | None:
        return self.logs.get("val_fgsm_accuracy")

    @property
    def val_pgd_accuracy(self) -> float | None:
        """PGD's own validation accuracy where a black-box part followed it (the criterion,
        val_robust_accuracy, is then the two combined); None where validation was PGD alone."""
        return self.logs.get("val_pgd_accuracy")

    @property
    def seconds(self) -> float | None:
        return self.logs.get("epoch_time")

    @property
    def overfitting(self) -> bool:
        """Whether the catastrophic-overfitting guard fired in this epoch."""
        return (self.logs.get("val_overfitting") or 0) > 0

    @property
    def marked_best(self) -> bool:
        """Whether validation saved this epoch's weights as the best so far."""
        return bool(self.logs.get("val_best"))

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, **self.logs}


_STATUSES = ("running", "complete", "diverged")

# What to do about a record train.py did not write so.
# What a refused record's message ends with: what to do about it.
RESTORE = "; restore the file train.py wrote, or train again in a new --workdir"
_RESTORE = RESTORE


def _listed(value: Any, name: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{name} is {value!r}, not a list")
    return value


def _epoch(entry: Any) -> Epoch:
    """One entry of a record's history: an object with a whole epoch number."""
    if not isinstance(entry, dict) or not isinstance(entry.get("epoch"), int):
        raise ValueError(f"history holds {entry!r}, not an epoch's object with its number")
    logs = {k: v for k, v in entry.items() if k != "epoch"}
    for name, value in logs.items():  # Keras' logs and the callbacks' are numbers (NaN: null)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"history's epoch {entry['epoch']} {name} is {value!r}, not a number")
    return Epoch(entry["epoch"], logs)


@dataclasses.dataclass(frozen=True)
class MethodRecord:
    """The method a run trained with, as it recorded it (results.json's "method"): its name,
    title, the variant its steps are priced by (bench/step_time.py's names) and its passes
    through the model per optimizer step, and the rest of its config as written (ε in pixel
    units, the norm, its options). Runs from before a part was recorded lack it (None) as
    written; fbat_tf/upgrade.py reads them with it, derived from the config."""

    name: str | None = None
    title: str | None = None
    cost_variant: str | None = None
    passes: dict[str, int] | None = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> MethodRecord:
        """The method of a record's "method" object; ValueError naming the part of another
        type."""
        for name in ("name", "title", "cost_variant"):
            if not isinstance(payload.get(name), str | None):
                raise ValueError(f"method.{name} is {payload[name]!r}, not a name")
        if not isinstance(payload.get("passes"), dict | None):
            raise ValueError(f"method.passes is {payload['passes']!r}, not an object")
        typed = {f.name for f in dataclasses.fields(cls)} - {"config"}
        return cls(
            **{name: payload.get(name) for name in typed},
            config={k: v for k, v in payload.items() if k not in typed},
        )

    def to_dict(self) -> dict[str, Any]:
        """As runs write it: name, title and cost variant, the config, the passes last (a part
        not recorded is left out)."""
        head = {"name": self.name, "title": self.title, "cost_variant": self.cost_variant}
        payload = {key: value for key, value in head.items() if value is not None}
        payload.update(self.config)
        if self.passes is not None:
            payload["passes"] = self.passes
        return payload


@dataclasses.dataclass
class DivergenceOutcome:
    """Why a run stopped as diverged (callbacks.Divergence)."""

    epoch: int  # from 1
    reason: str  # "skipped_batches" or "validation"
    nonfinite_batches: int
    steps: int
    max_skipped_fraction: float
    val_nonfinite_examples: int
    last_finite_loss: float | None


@dataclasses.dataclass
class RunRecord:
    """results.json of a training run."""

    config: TrainConfig
    status: str = "running"  # "complete" once tested, "diverged" when it stopped so
    history: list[Epoch] = dataclasses.field(default_factory=list)
    # train.py's test of the selected model (training.evaluate_test); None before it ran.
    final: EvaluationResult | None = None
    # The method's name, title, cost variant, passes per step and the rest of its config.
    method: MethodRecord | None = None
    code: dict[str, Any] | None = None  # provenance.code(): revision, dirty
    # Fingerprints of the initial weights and the first training batch: runs of one seed
    # share them whatever the method.
    pairing: dict[str, str] | None = None
    split: dict[str, Any] | None = None  # where validation came from, and the held-out seed
    dataset: str | None = None
    model: str | None = None
    device: str | None = None
    tf32: bool | None = None
    machine: dict[str, Any] | None = None
    replicas: int | None = None
    steps_per_epoch: int | None = None
    epochs: int | None = None
    total_steps: int | None = None
    optimizer_steps: int | None = None
    divergence: DivergenceOutcome | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    # -------------------------------------------------------------------------- reading

    @classmethod
    def from_dict(cls, payload: dict[str, Any]) -> RunRecord:
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        config_fields = {f.name for f in dataclasses.fields(TrainConfig)}
        saved = dict(payload.get("config") or {})
        config = config_from_dict(saved)
        values = {k: v for k, v in payload.items() if k in known and k != "config"}
        epochs = [_epoch(h) for h in _listed(payload.get("history"), "history")]
        values["history"] = upgrade.history(epochs)
        for name in ("method", "code", "pairing", "split", "machine"):
            if not isinstance(values.get(name), dict | None):
                raise ValueError(f"{name} is {values[name]!r}, not an object")
        if values.get("status", "running") not in _STATUSES:
            raise ValueError(f"status is {values['status']!r}, not one of {', '.join(_STATUSES)}")
        if values.get("method") is not None:
            values["method"] = MethodRecord.from_dict(values["method"])
        if payload.get("divergence") is not None:
            values["divergence"] = DivergenceOutcome(**payload["divergence"])
        elif values.get("status") == "diverged":
            raise ValueError(
                "status is diverged, but the record says nothing of why (no divergence)"
            )
        if payload.get("final") is not None:
            values["final"] = EvaluationResult.from_dict(
                upgrade.final_test(payload["final"], config)
            )
        extra = {k: v for k, v in payload.items() if k not in known}
        retired = {k: v for k, v in saved.items() if k not in config_fields}
        if retired:  # config fields since retired: written back as they were
            extra["config"] = retired
        return cls(config=config, extra=extra, **values)

    @classmethod
    def load(cls, path: str) -> RunRecord:
        """The record at `path`: FileNotFoundError where there is none, ValueError naming the
        file where it is not a run's record (a part missing or of another type) or its final
        evaluation's outcomes disagree with its accuracies."""
        try:
            payload = read_json(path, "a training run's record", "config")
        except ValueError as error:
            raise ValueError(f"{error}{_RESTORE}") from None
        try:
            return cls.from_dict(payload)
        except ValueError as error:
            raise ValueError(f"{path}: {error}{_RESTORE}") from None
        except (TypeError, KeyError, AttributeError) as error:
            # A part of another shape than a run writes (a hand edit, another program's file).
            raise ValueError(
                f"{path} is not a training run's record as fbat-tf writes it "
                f"({type(error).__name__}: {error}){_RESTORE}"
            ) from None

    @classmethod
    def read(cls, path: str) -> RunRecord | None:
        """The record at `path`, or None where it is absent or not (yet) a readable record."""
        try:
            return cls.load(path)
        except (FileNotFoundError, ValueError):
            return None

    # -------------------------------------------------------------------------- writing

    def to_dict(self) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "extra":
                continue
            if field.name == "config":
                value = {**dataclasses.asdict(value), **self.extra.get("config", {})}
            elif field.name == "history":
                value = [epoch.to_dict() for epoch in value]
            elif field.name == "divergence":
                value = None if value is None else dataclasses.asdict(value)
            elif field.name in ("final", "method"):
                value = None if value is None else value.to_dict()
            if value is None and field.name not in ("status", "config", "history"):
                continue  # a part the run has not reached, or did not record
            payload[field.name] = value
        payload.update({k: v for k, v in self.extra.items() if k != "config"})
        return payload

    def save(self, path: str) -> None:
        write_json_atomic(path, self.to_dict())

    # -------------------------------------------------------------------------- questions

    def selected_epoch(self) -> Epoch | None:
        """The epoch whose weights best.weights.h5 holds: the last one validation marked best
        (none where validation never gave a number, as in a run that diverged at once). A run
        from before validation marked it is read with the marks (records/upgrade.py)."""
        marked = [epoch for epoch in self.history if epoch.marked_best]
        return marked[-1] if marked else None

    def mean_log(self, name: str) -> float | None:
        """The mean over epochs of a log (None where no epoch logged it)."""
        values = [
            e.get(name)
            for e in self.history
            if isinstance(e.get(name), numbers.Real) and math.isfinite(e.get(name))
        ]
        return sum(values) / len(values) if values else None

    @property
    def is_complete(self) -> bool:
        return self.status == "complete"

    @property
    def is_diverged(self) -> bool:
        return self.status == "diverged"

    def keep_epochs_until(self, last: int) -> None:
        """Forget the epochs after `last` (a resumed run trains them again)."""
        self.history = [epoch for epoch in self.history if epoch.epoch <= last]

    def record_epoch(self, epoch: Epoch) -> None:
        """Add a finished epoch, in place of any earlier record of the same or a later one."""
        self.keep_epochs_until(epoch.epoch - 1)
        self.history.append(epoch)
