"""A sweep's tuning stage: each tuned method (and variant) at each tuned ε trains every candidate
setting on tuning seeds of its own, the candidate with the best validation robust accuracy is
picked, and the grid's final cells of that variant and ε run with the pick's flags. The test
split is never read to choose: tuning runs train and validate only (train.py --nofinal_test)
and are never evaluated.

The definition's optional "tuning" block:

    "tuning": {
      "seeds": [100, 101, 102],              # distinct from every final cell's seed
      "groups": [
        {"method": "nfgsm", "eps": [48, 76],
         "source": "de Jorge et al. 2022, Sec. 4 and its released train.py (--unif)",
         "candidates": [{"nfgsm_noise": 2}, {"nfgsm_noise": 1}, {"nfgsm_noise": 3}]},
        {"method": "fastbat", "match": {"ig": "none"}, "eps": [48],
         "source": "Zhang et al. 2022, Sec. 5 (lambda)",
         "candidates": [{"lambda_inv": 2500}, {"lambda_inv": 5000}]}]}

A group tunes the grid's cells of `method` at each ε of `eps`; `match` narrows them to the cells
whose grid values are these (grid keys besides method, ε and seed). Each variant the group
matches (cells differing only by seed) is tuned on its own: a unit, named like its cells without
the seed ("fastbat-ig_none-eps48"). A candidate sets train.py flags in train.py's units: the
method's own options, or the optimizer's (OPTIMIZER_FLAGS); never a grid key. `source` says
where the candidates come from and is shown in the report.

A unit's tuning cells are `<sweep_dir>/tuning/<unit>-<candidate label>-seed<s>/`, one train.py
run per candidate and tuning seed, with the final cells' flags (their final-test flags aside),
the candidate's, the tuning seed and --nofinal_test. Once every one of them finished (complete,
or diverged), `settle` writes the unit's pick into `<sweep_dir>/tuning.json` (RULE), atomically
and under a lock: several sweep.py processes may share the directory. tuning.json is
authoritative once written: a later start keeps its picks, and refuses a definition whose
candidates or seeds for a picked unit differ from those it was picked among (delete tuning.json
to tune again). A final cell of a tuned unit is `pending` until its pick exists; then its flags
carry the pick's (its name does not change).

Interior optima (a group's "extend" and "released"): tuning_groups.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from fbat_tf import catalog, methods
from fbat_tf.records import RunRecord, files, write_json_atomic
from fbat_tf.records.config import FINAL_TEST_FIELDS
from fbat_tf.run import Run
from fbat_tf.sweeps import claims
from fbat_tf.sweeps.cells import Cell
from fbat_tf.sweeps.definition import Definition, grid_cells
from fbat_tf.sweeps.errors import DefinitionError
from fbat_tf.sweeps.tuning_groups import (  # noqa: F401 (the stage's names, in one place)
    OPTIMIZER_FLAGS,
    Extension,
    Group,
    Tuning,
    Unit,
    added_words,
    canonical,
    edge_words,
    edges,
    label,
    method_flags,
    parse,
    with_picks,
)

DIRECTORY = "tuning"
FILE = "tuning.json"
RULE = (
    "per unit (method variant and ε), the candidate with the highest mean over the tuning seeds "
    "of its runs' validation robust accuracy at the selected epoch (a diverged run counts 0); "
    "equal means go to the candidate with fewer passes through the model per optimizer step, "
    "then to the one listed first. Tuning runs train and validate only: the test split is "
    "never read."
)


def cell_name(unit: Unit, candidate: Mapping[str, Any], seed: int) -> str:
    return f"{DIRECTORY}/{unit.key}-{label(candidate)}-seed{seed}"


def tuning_cells(definition: Definition, unit: Unit | None = None) -> list[Cell]:
    """The tuning runs (of one unit, or all), unit by unit, candidate by candidate, seed by
    seed: the final cells' flags without their final test, the candidate's, the tuning seed."""
    tuning = definition.tuning
    if tuning is None:
        return []
    grid = {cell.name: cell for cell in grid_cells(definition)}
    return [
        cell
        for each in (tuning.units if unit is None else (unit,))
        for _, cells in _by_candidate(definition, each, grid)
        for cell in cells
    ]


def unit_candidates(definition: Definition, unit: Unit) -> list[dict[str, Any]]:
    """The unit's candidates: its group's, then those tuning.json added (`extensions`)."""
    return [*unit.group.candidates, *definition.extensions.get(unit.key, [])]


def _by_candidate(
    definition: Definition, unit: Unit, grid: Mapping[str, Cell]
) -> list[tuple[dict[str, Any], list[Cell]]]:
    """Each candidate of the unit with its tuning runs, seed by seed."""
    base = grid[unit.cells[0]]
    skip = {"seed", *FINAL_TEST_FIELDS}
    flags = {k: v for k, v in base.flags.items() if k not in skip}
    return [
        (
            candidate,
            [
                Cell(
                    cell_name(unit, candidate, seed),
                    {**flags, **candidate, "seed": seed, "final_test": False},
                    base.grid_keys,
                    stage="tuning",
                    unit=unit.key,
                )
                for seed in definition.tuning.seeds
            ],
        )
        for candidate in unit_candidates(definition, unit)
    ]


def passes_per_step(cell: Cell) -> int:
    """Passes through the model of one optimizer step of the cell's run."""
    return catalog.total_passes(methods.passes(cell.method, cell.config.method_options))


# ------------------------------------------------------------------------------ the pick


def _run(cell: Cell, sweep_dir: str) -> dict[str, Any]:
    """What a tuning run says for the pick: its selected epoch's validation robust accuracy
    (0 for a diverged run, marked), or None while it has not finished."""
    run_dir = os.path.join(sweep_dir, cell.name)
    found = {"seed": cell.seed, "run_dir": run_dir, "val_robust_accuracy": None}
    record = RunRecord.read(Run(run_dir).results_path)
    if record is None or record.status not in ("complete", "diverged"):
        return {**found, "state": "new" if record is None else record.status}
    selected = record.selected_epoch()
    value = None if selected is None else selected.val_robust_accuracy
    recorded = value if value is not None and math.isfinite(value) else None
    found.update(
        state=record.status,
        selected_epoch=None if selected is None else selected.epoch,
        overfitting_epochs=[e.epoch for e in record.history if e.overfitting],
        diverged=record.is_diverged,
        # A diverged run counts 0 (as does a run no epoch of which passed validation).
        val_robust_accuracy=0.0 if record.is_diverged or recorded is None else recorded,
    )
    if record.is_diverged:
        found["recorded_val_robust_accuracy"] = recorded
    return found


def candidates(definition: Definition, unit: Unit, sweep_dir: str) -> list[dict[str, Any]]:
    """Each candidate of the unit with its runs' numbers so far, their mean (once all finished)
    and its passes per step."""
    grid = {cell.name: cell for cell in grid_cells(definition)}
    listed = {canonical(c) for c in unit.group.candidates}
    found = []
    for candidate, mine in _by_candidate(definition, unit, grid):
        runs = [_run(cell, sweep_dir) for cell in mine]
        values = [r["val_robust_accuracy"] for r in runs]
        finished = all(v is not None for v in values)
        found.append(
            {
                "label": label(candidate),
                "flags": dict(candidate),
                "origin": unit.group.origin(candidate),
                "added": canonical(candidate) not in listed,
                "passes_per_step": passes_per_step(mine[0]),
                "runs": runs,
                "mean": statistics.fmean(values) if finished else None,
                "finished": finished,
            }
        )
    return found


def decide(found: Sequence[Mapping[str, Any]]) -> tuple[int, str]:
    """The index of the pick among finished candidates (RULE) and in words why it won."""
    order = sorted(
        range(len(found)),
        key=lambda i: (-round(found[i]["mean"], 12), found[i]["passes_per_step"], i),
    )
    best = order[0]
    tied = [i for i in order[1:] if round(found[i]["mean"], 12) == round(found[best]["mean"], 12)]
    if not tied:
        return best, "the highest mean"
    if all(found[i]["passes_per_step"] > found[best]["passes_per_step"] for i in tied):
        return best, f"a tie on the mean with {found[tied[0]]['label']}: fewer passes per step"
    return best, f"a tie on the mean and passes with {found[tied[0]]['label']}: listed first"


def pick(definition: Definition, unit: Unit, sweep_dir: str) -> dict[str, Any] | None:
    """The unit's entry of tuning.json, or None while any of its runs has not finished or its
    grid still grows (`grow`)."""
    found = candidates(definition, unit, sweep_dir)
    if not all(c["finished"] for c in found):
        return None
    best, why = decide(found)
    added, where = edges(unit.group, found, best)
    if added:
        return None
    return {
        "method": unit.group.method,
        "variant": unit.variant,
        "eps": unit.eps,
        "match": unit.group.match,
        "source": unit.group.source,
        "seeds": list(definition.tuning.seeds),
        "cells": list(unit.cells),
        "candidates": [{k: v for k, v in c.items() if k != "finished"} for c in found],
        "pick": found[best]["label"],
        "flags": found[best]["flags"],
        "decided_by": why,
        "edges": where,
    }


def grow(definition: Definition, unit: Unit, sweep_dir: str) -> list[dict[str, Any]]:
    """The candidates the unit's grid gains now (`edges`), once every run so far finished."""
    found = candidates(definition, unit, sweep_dir)
    finished = all(c["finished"] for c in found) and unit.group.extend
    return edges(unit.group, found, decide(found)[0])[0] if finished else []


def path(sweep_dir: str) -> str:
    return os.path.join(sweep_dir, FILE)


def _read(sweep_dir: str) -> dict[str, Any]:
    try:
        with open(path(sweep_dir)) as f:
            found = json.load(f)
    except FileNotFoundError:
        return {"rule": RULE, "picks": {}, "extensions": {}}
    except json.JSONDecodeError as error:
        raise DefinitionError(f"{path(sweep_dir)} is not readable JSON ({error})") from None
    if not isinstance(found, dict) or not isinstance(found.get("picks"), dict):
        raise DefinitionError(f"{path(sweep_dir)} is not a sweep's tuning picks (no 'picks')")
    for unit, entry in found["picks"].items():
        problem = _pick_problem(entry)
        if problem:
            raise DefinitionError(
                f"{path(sweep_dir)}: the pick of {unit} {problem} (sweep.py writes an object "
                f"with its flags, candidates and seeds): delete {path(sweep_dir)} and run the "
                "same command again, which picks again from the tuning runs"
            )
    extensions = found.setdefault("extensions", {})
    if not isinstance(extensions, dict) or not all(
        isinstance(v, list) and all(isinstance(c, dict) for c in v) for v in extensions.values()
    ):
        raise DefinitionError(
            f"{path(sweep_dir)}: 'extensions' must map units to lists of candidate flags"
        )
    return found


def _pick_problem(entry: Any) -> str | None:
    """What is wrong with a unit's entry of tuning.json as read (`pick`'s shape), or None."""
    if not isinstance(entry, dict):
        return f"is {entry!r}"
    if not isinstance(entry.get("flags"), dict):
        return "has no 'flags' object"
    if not isinstance(entry.get("pick"), str) or not isinstance(entry.get("decided_by"), str):
        return "has no 'pick' or 'decided_by' text"
    if not isinstance(entry.get("seeds"), list):
        return "has no list of 'seeds'"
    found = entry.get("candidates")
    if not isinstance(found, list) or not all(
        isinstance(c, dict)
        and isinstance(c.get("label"), str)
        and isinstance(c.get("flags"), dict)
        and isinstance(c.get("runs"), list)
        and all(isinstance(r, dict) for r in c.get("runs"))
        for c in found
    ):
        return "has 'candidates' that are not objects with a label, flags and runs"
    if entry.get("pick") not in [c.get("label") for c in found]:
        return f"picks {entry.get('pick')!r}, none of its candidates"
    return None


@contextlib.contextmanager
def _locked(sweep_dir: str) -> Iterator[None]:
    import fcntl

    os.makedirs(sweep_dir, exist_ok=True)
    with files.open_own(f"{path(sweep_dir)}.lock", "a") as handle:  # never through a link
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def refresh(definition: Definition, sweep_dir: str) -> None:
    """Set `definition.picks` from tuning.json; DefinitionError naming the file where a unit
    was picked among other candidates or seeds than the definition lists now."""
    tuning = definition.tuning
    if tuning is None:
        return
    read = _read(sweep_dir)
    kept = read["picks"]
    definition.extensions = {
        unit.key: list(read["extensions"][unit.key])
        for unit in tuning.units
        if unit.key in read["extensions"]
    }
    picks = {}
    for unit in tuning.units:
        entry = kept.get(unit.key)
        if entry is None:
            continue
        before = [canonical(c["flags"]) for c in entry.get("candidates", [])]
        now = [canonical(c) for c in unit_candidates(definition, unit)]
        if before != now or list(entry.get("seeds", [])) != list(tuning.seeds):
            was = ", ".join(c["label"] for c in entry.get("candidates", []))
            raise DefinitionError(
                f"{path(sweep_dir)} picked {unit.key}'s flags among other candidates or seeds "
                f"({was}; seeds {entry.get('seeds')}) than the definition lists now "
                f"({', '.join(label(c) for c in unit.group.candidates)}; seeds "
                f"{list(tuning.seeds)}): its pick stands unless you delete {path(sweep_dir)}"
            )
        picks[unit.key] = dict(entry["flags"])
    definition.picks = picks


def settle(definition: Definition, sweep_dir: str, only: str | None = None) -> list[dict[str, Any]]:
    """Write the pick of every unit (or of the unit `only`) whose tuning runs have all finished
    and that has none yet into tuning.json (atomically, under a lock), and refresh
    `definition.picks`. Returns the new picks."""
    tuning = definition.tuning
    if tuning is None:
        return []
    new, grown = [], False
    with _locked(sweep_dir):
        kept = _read(sweep_dir)
        refresh_extensions(definition, kept)
        for unit in tuning.units:
            if unit.key in kept["picks"] or only not in (None, unit.key):
                continue
            added = grow(definition, unit, sweep_dir)
            if added:  # where its best sits at its grid's edge: no pick yet
                kept["extensions"].setdefault(unit.key, []).extend(added)
                refresh_extensions(definition, kept)
                grown = True
                print(f"tuning {unit.key}: best at its grid's edge; added {added_words(added)}")
                continue
            entry = pick(definition, unit, sweep_dir)
            if entry is not None:
                kept["picks"][unit.key] = entry
                new.append({"unit": unit.key, **entry})
        if new or grown:
            kept["rule"] = RULE
            write_json_atomic(path(sweep_dir), kept)
    refresh(definition, sweep_dir)
    return new


def refresh_extensions(definition: Definition, kept: Mapping[str, Any]) -> None:
    definition.extensions = {k: list(v) for k, v in kept["extensions"].items()}


def describe_pick(entry: Mapping[str, Any]) -> str:
    """One line for a new pick."""
    chosen = next(c for c in entry["candidates"] if c["label"] == entry["pick"])
    seeds = ", ".join(str(s) for s in entry["seeds"])
    return (
        f"tuning {entry['unit']}: picked {entry['pick']} (mean validation robust accuracy "
        f"{100 * chosen['mean']:.1f}% over seeds {seeds}; {entry['decided_by']})"
    )


def blocked(
    definition: Definition,
    cell: Cell,
    sweep_dir: str,
    failed: Sequence[str],
    queued: Sequence[Cell],
) -> str | None:
    """Why a pending final cell cannot get its pick in this run, or None: a tuning run of its
    unit failed here (`failed`: names), or is unfinished, not `queued` here, and claimed by no
    live process."""
    runs = tuning_cells(definition, definition.tuning.unit(cell.unit))
    lost = [run.name for run in runs if run.name in failed]
    if lost:
        return f"its tuning run {lost[0]} failed"
    names = {c.name for c in queued}
    for run in runs:
        if _run(run, sweep_dir)["val_robust_accuracy"] is not None or run.name in names:
            continue
        if claims.owner(sweep_dir, run.name) is None:
            return f"its tuning run {run.name} is run by no process (give it to --only)"
    return None


# ------------------------------------------------------------------------------ the report


def report_section(definition: Definition, sweep_dir: str) -> dict[str, Any] | None:
    """The Tuning section of sweep.json: per unit every candidate with its source, per-seed and
    mean validation robust accuracy and passes per step, and the pick (tuning.json's, which
    stands once written; none while runs are left)."""
    tuning = definition.tuning
    if tuning is None:
        return None
    kept = _read(sweep_dir)["picks"]
    units = []
    for unit in tuning.units:
        entry = kept.get(unit.key)
        if entry is None:
            found = candidates(definition, unit, sweep_dir)
            entry = {
                "candidates": [{k: v for k, v in c.items() if k != "finished"} for c in found],
                "edges": None,
                "pick": None,
                "flags": None,
                "decided_by": None,
            }
        units.append(
            {
                "unit": unit.key,
                "method": unit.group.method,
                "variant": unit.variant,
                "eps": unit.eps,
                "match": unit.group.match,
                "source": unit.group.source,
                "cells": list(unit.cells),
                **{k: entry[k] for k in ("candidates", "pick", "flags", "decided_by")},
                "edges": edge_words(unit.group, entry),
            }
        )
    return {"rule": RULE, "seeds": list(tuning.seeds), "file": FILE, "units": units}
