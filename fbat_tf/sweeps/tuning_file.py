"""A sweep's tuning.json as records: each unit's pick (`Pick`) with every candidate it was picked
among (`Candidate`) and what each of their runs said (`TuningRun`), and the candidates the
units' grids gained (`extensions`), read and written under a lock, as the tuning stage
(tuning.py) writes them.

    found = read(sweep_dir)                       # TuningFile; {} picks where no file is
    entry = found.picks["fastat-eps48"]           # Pick
    entry.pick, entry.flags, entry.candidates[0].mean, entry.candidates[0].runs[0].seed
    with locked(sweep_dir):                       # several sweep.py processes share a directory
        found = read(sweep_dir)
        ...
        write(sweep_dir, found, rule)             # atomically

Each record's `to_dict` gives the file's keys in the order the stage wrote them, a candidate's
origin and added and a pick's edges only where set (a file written before the stage recorded
them has none), and `from_dict` reads them back: a file read and written again is the same
file. `read` refuses, in one DefinitionError naming the file, a pick of any other shape (one
that would not be written back as it was read).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

from fbat_tf.records import files, write_json_atomic
from fbat_tf.sweeps.errors import DefinitionError

FILE = "tuning.json"


@dataclasses.dataclass(frozen=True)
class TuningRun:
    """What a tuning run says for the pick: its selected epoch's validation robust accuracy (0
    for a diverged run, which keeps its own number beside it), or None while it has not
    finished; `state` is "new" or its record's status."""

    seed: int
    run_dir: str
    val_robust_accuracy: float | None
    state: str
    # Once it finished (complete or diverged); `diverged` is None before.
    selected_epoch: int | None = None
    overfitting_epochs: tuple[int, ...] = ()
    diverged: bool | None = None
    recorded_val_robust_accuracy: float | None = None  # a diverged run's own number

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "seed": self.seed,
            "run_dir": self.run_dir,
            "val_robust_accuracy": self.val_robust_accuracy,
            "state": self.state,
        }
        if self.diverged is not None:
            found["selected_epoch"] = self.selected_epoch
            found["overfitting_epochs"] = list(self.overfitting_epochs)
            found["diverged"] = self.diverged
        if self.diverged:
            found["recorded_val_robust_accuracy"] = self.recorded_val_robust_accuracy
        return found

    @classmethod
    def from_dict(cls, found: Mapping[str, Any]) -> TuningRun:
        return cls(
            found.get("seed"),
            found.get("run_dir"),
            found.get("val_robust_accuracy"),
            found.get("state"),
            found.get("selected_epoch"),
            tuple(found.get("overfitting_epochs", ())),
            found.get("diverged"),
            found.get("recorded_val_robust_accuracy"),
        )


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A candidate of a tuning unit: its flags (its `label` in its runs' names), passes through
    the model per optimizer step, its runs seed by seed and their mean (None until all of them
    finished); whether an author released it or it is extrapolated (`origin`) and whether the
    unit's grid gained it (`added`), None in a file written before candidates were marked."""

    label: str
    flags: dict[str, Any]
    passes_per_step: int
    runs: tuple[TuningRun, ...]
    mean: float | None
    origin: str | None = None  # "released" or "extrapolated"
    added: bool | None = None

    @property
    def finished(self) -> bool:
        """Whether every run of it finished (complete, or diverged and counted 0)."""
        return all(run.val_robust_accuracy is not None for run in self.runs)

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"label": self.label, "flags": self.flags}
        if self.origin is not None:
            found["origin"] = self.origin
        if self.added is not None:
            found["added"] = self.added
        found["passes_per_step"] = self.passes_per_step
        found["runs"] = [run.to_dict() for run in self.runs]
        found["mean"] = self.mean
        return found

    @classmethod
    def from_dict(cls, found: Mapping[str, Any]) -> Candidate:
        return cls(
            found.get("label"),
            found.get("flags"),
            found.get("passes_per_step"),
            tuple(TuningRun.from_dict(run) for run in found.get("runs", ())),
            found.get("mean"),
            found.get("origin"),
            found.get("added"),
        )


@dataclasses.dataclass(frozen=True)
class Pick:
    """A unit's pick, as tuning.json holds it under the unit's key (`unit`): the unit (its
    method, variant, ε, match, source and final cells), the tuning seeds, every candidate, the
    label of the one picked, its flags, why it won, and where it sits on each flag its grid
    extends (`edges`; None in a file written before picks recorded them)."""

    unit: str  # its key in the file's "picks", not written inside it
    method: str
    variant: str
    eps: float
    match: dict[str, Any]
    source: str
    seeds: tuple[int, ...]
    cells: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    pick: str
    flags: dict[str, Any]
    decided_by: str
    edges: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "method": self.method,
            "variant": self.variant,
            "eps": self.eps,
            "match": self.match,
            "source": self.source,
            "seeds": list(self.seeds),
            "cells": list(self.cells),
            "candidates": [c.to_dict() for c in self.candidates],
            "pick": self.pick,
            "flags": self.flags,
            "decided_by": self.decided_by,
        }
        if self.edges is not None:
            found["edges"] = self.edges
        return found

    @classmethod
    def from_dict(cls, unit: str, found: Mapping[str, Any]) -> Pick:
        return cls(
            unit,
            found.get("method"),
            found.get("variant"),
            found.get("eps"),
            found.get("match"),
            found.get("source"),
            tuple(found.get("seeds", ())),
            tuple(found.get("cells", ())),
            tuple(Candidate.from_dict(c) for c in found.get("candidates", ())),
            found.get("pick"),
            found.get("flags"),
            found.get("decided_by"),
            found.get("edges"),
        )


@dataclasses.dataclass
class TuningFile:
    """tuning.json as read: the picks by unit, and the candidates each unit's grid gained
    (`extensions`: candidate flags by unit), which the stage adds to before writing it."""

    picks: dict[str, Pick]
    extensions: dict[str, list[dict[str, Any]]]


def path(sweep_dir: str) -> str:
    return os.path.join(sweep_dir, FILE)


def read(sweep_dir: str) -> TuningFile:
    """The sweep's tuning.json (no picks where there is none); DefinitionError naming the file
    where it is not one the stage writes."""
    try:
        with open(path(sweep_dir)) as f:
            found = json.load(f)
    except FileNotFoundError:
        return TuningFile({}, {})
    except json.JSONDecodeError as error:
        raise DefinitionError(f"{path(sweep_dir)} is not readable JSON ({error})") from None
    if not isinstance(found, dict) or not isinstance(found.get("picks"), dict):
        raise DefinitionError(f"{path(sweep_dir)} is not a sweep's tuning picks (no 'picks')")
    picks = {}
    for unit, entry in found["picks"].items():
        problem = _pick_problem(entry)
        if problem is None:
            picks[unit] = Pick.from_dict(unit, entry)
            problem = _unlike(picks[unit].to_dict(), entry)
        if problem:
            raise DefinitionError(
                f"{path(sweep_dir)}: the pick of {unit} {problem} (sweep.py writes an object "
                f"with its flags, candidates and seeds): delete {path(sweep_dir)} and run the "
                "same command again, which picks again from the tuning runs"
            )
    extensions = found.get("extensions", {})
    if not isinstance(extensions, dict) or not all(
        isinstance(v, list) and all(isinstance(c, dict) for c in v) for v in extensions.values()
    ):
        raise DefinitionError(
            f"{path(sweep_dir)}: 'extensions' must map units to lists of candidate flags"
        )
    return TuningFile(picks, extensions)


def _pick_problem(entry: Any) -> str | None:
    """What is wrong with a unit's entry of tuning.json as read (`Pick.to_dict`'s shape), or
    None."""
    if not isinstance(entry, dict):
        return f"is {entry!r}"
    if not isinstance(entry.get("flags"), dict):
        return "has no 'flags' object"
    if not isinstance(entry.get("pick"), str) or not isinstance(entry.get("decided_by"), str):
        return "has no 'pick' or 'decided_by' text"
    if not isinstance(entry.get("seeds"), list):
        return "has no list of 'seeds'"
    if not isinstance(entry.get("cells"), list):
        return "has no list of 'cells'"
    found = entry.get("candidates")
    if not isinstance(found, list) or not all(
        isinstance(c, dict)
        and isinstance(c.get("label"), str)
        and isinstance(c.get("flags"), dict)
        and isinstance(c.get("runs"), list)
        and all(
            isinstance(r, dict) and isinstance(r.get("overfitting_epochs", []), list)
            for r in c.get("runs")
        )
        for c in found
    ):
        return "has 'candidates' that are not objects with a label, flags and runs"
    if entry.get("pick") not in [c.get("label") for c in found]:
        return f"picks {entry.get('pick')!r}, none of its candidates"
    return None


def _unlike(written: Any, found: Any, where: str = "") -> str | None:
    """Where `found` (as read) holds other keys than `written` (the record read from it, as it
    would be written): the first key one has and the other lacks ('candidates[1].mean'), or
    None."""
    if isinstance(written, dict) and isinstance(found, dict):
        for key in [*written, *found]:
            if key not in found:
                return f"has no '{where}{key}'"
            if key not in written:
                return f"has '{where}{key}', which sweep.py does not write"
            problem = _unlike(written[key], found[key], f"{where}{key}.")
            if problem:
                return problem
    elif isinstance(written, list) and isinstance(found, list):
        for i, (mine, theirs) in enumerate(zip(written, found, strict=True)):
            problem = _unlike(mine, theirs, f"{where.removesuffix('.')}[{i}].")
            if problem:
                return problem
    return None


@contextlib.contextmanager
def locked(sweep_dir: str) -> Iterator[None]:
    """The sweep's tuning.json to this process alone while it reads and writes it."""
    import fcntl

    os.makedirs(sweep_dir, exist_ok=True)
    with files.open_own(f"{path(sweep_dir)}.lock", "a") as handle:  # never through a link
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write(sweep_dir: str, found: TuningFile, rule: str) -> None:
    """tuning.json, atomically: the rule the picks were made by, the picks and the extensions."""
    picks = {unit: entry.to_dict() for unit, entry in found.picks.items()}
    write_json_atomic(
        path(sweep_dir), {"rule": rule, "picks": picks, "extensions": found.extensions}
    )
