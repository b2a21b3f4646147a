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
and under a lock: several sweep.py processes may share the directory. Each run's numbers are a
`TuningRun`, each candidate's a `Candidate`, a unit's pick a `Pick`: tuning_file.py's records,
which read and write tuning.json; the report's section (`report_section`) is a `Section` of
`UnitSection`s built from them, read by attribute (study/tuning_report.py). tuning.json is
authoritative once written: a later start keeps its picks, and refuses a definition whose
candidates or seeds for a picked unit differ from those it was picked among (delete tuning.json
to tune again). A final cell of a tuned unit is `pending` until its pick exists; then its flags
carry the pick's (its name does not change).

Interior optima (a group's "extend" and "released"): tuning_groups.py.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from fbat_tf import catalog, methods
from fbat_tf.records import RunRecord
from fbat_tf.records.config import FINAL_TEST_FIELDS
from fbat_tf.run import Run
from fbat_tf.sweeps import claims, tuning_file
from fbat_tf.sweeps.cells import Cell
from fbat_tf.sweeps.definition import Definition, grid_cells
from fbat_tf.sweeps.errors import DefinitionError
from fbat_tf.sweeps.tuning_file import (  # noqa: F401 (tuning.json and its records)
    FILE,
    Candidate,
    Pick,
    TuningRun,
    path,
)
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


def _run(cell: Cell, sweep_dir: str) -> TuningRun:
    """What a tuning run says for the pick: its selected epoch's validation robust accuracy
    (0 for a diverged run, marked), or None while it has not finished."""
    run_dir = os.path.join(sweep_dir, cell.name)
    record = RunRecord.read(Run(run_dir).results_path)
    if record is None or record.status not in ("complete", "diverged"):
        return TuningRun(cell.seed, run_dir, None, "new" if record is None else record.status)
    selected = record.selected_epoch()
    value = None if selected is None else selected.val_robust_accuracy
    recorded = value if value is not None and math.isfinite(value) else None
    return TuningRun(
        cell.seed,
        run_dir,
        # A diverged run counts 0 (as does a run no epoch of which passed validation).
        0.0 if record.is_diverged or recorded is None else recorded,
        record.status,
        selected_epoch=None if selected is None else selected.epoch,
        overfitting_epochs=tuple(e.epoch for e in record.history if e.overfitting),
        diverged=record.is_diverged,
        recorded_val_robust_accuracy=recorded if record.is_diverged else None,
    )


def candidates(definition: Definition, unit: Unit, sweep_dir: str) -> list[Candidate]:
    """Each candidate of the unit with its runs' numbers so far, their mean (once all finished)
    and its passes per step."""
    grid = {cell.name: cell for cell in grid_cells(definition)}
    listed = {canonical(c) for c in unit.group.candidates}
    found = []
    for candidate, mine in _by_candidate(definition, unit, grid):
        runs = tuple(_run(cell, sweep_dir) for cell in mine)
        values = [run.val_robust_accuracy for run in runs]
        finished = all(v is not None for v in values)
        found.append(
            Candidate(
                label=label(candidate),
                flags=dict(candidate),
                passes_per_step=passes_per_step(mine[0]),
                runs=runs,
                mean=statistics.fmean(values) if finished else None,
                origin=unit.group.origin(candidate),
                added=canonical(candidate) not in listed,
            )
        )
    return found


def decide(found: Sequence[Candidate]) -> tuple[int, str]:
    """The index of the pick among finished candidates (RULE) and in words why it won."""
    order = sorted(
        range(len(found)),
        key=lambda i: (-round(found[i].mean, 12), found[i].passes_per_step, i),
    )
    best = order[0]
    tied = [i for i in order[1:] if round(found[i].mean, 12) == round(found[best].mean, 12)]
    if not tied:
        return best, "the highest mean"
    if all(found[i].passes_per_step > found[best].passes_per_step for i in tied):
        return best, f"a tie on the mean with {found[tied[0]].label}: fewer passes per step"
    return best, f"a tie on the mean and passes with {found[tied[0]].label}: listed first"


def _identity(unit: Unit) -> dict[str, Any]:
    """What tuning.json's pick and the report's section both say of a unit, besides its runs."""
    return {
        "unit": unit.key,
        "method": unit.group.method,
        "variant": unit.variant,
        "eps": unit.eps,
        "match": unit.group.match,
        "source": unit.group.source,
    }


def pick(definition: Definition, unit: Unit, sweep_dir: str) -> Pick | None:
    """The unit's entry of tuning.json, or None while any of its runs has not finished or its
    grid still grows (`grow`)."""
    found = candidates(definition, unit, sweep_dir)
    if not all(c.finished for c in found):
        return None
    best, why = decide(found)
    added, where = edges(unit.group, found, best)
    if added:
        return None
    return Pick(
        **_identity(unit),
        seeds=tuple(definition.tuning.seeds),
        cells=tuple(unit.cells),
        candidates=tuple(found),
        pick=found[best].label,
        flags=found[best].flags,
        decided_by=why,
        edges=where,
    )


def grow(definition: Definition, unit: Unit, sweep_dir: str) -> list[dict[str, Any]]:
    """The candidates the unit's grid gains now (`edges`), once every run so far finished."""
    found = candidates(definition, unit, sweep_dir)
    finished = all(c.finished for c in found) and unit.group.extend
    return edges(unit.group, found, decide(found)[0])[0] if finished else []


def refresh(definition: Definition, sweep_dir: str) -> None:
    """Set `definition.picks` from tuning.json; DefinitionError naming the file where a unit
    was picked among other candidates or seeds than the definition lists now."""
    tuning = definition.tuning
    if tuning is None:
        return
    found = tuning_file.read(sweep_dir)
    definition.extensions = {
        unit.key: list(found.extensions[unit.key])
        for unit in tuning.units
        if unit.key in found.extensions
    }
    picks = {}
    for unit in tuning.units:
        entry = found.picks.get(unit.key)
        if entry is None:
            continue
        before = [canonical(c.flags) for c in entry.candidates]
        now = [canonical(c) for c in unit_candidates(definition, unit)]
        if before != now or list(entry.seeds) != list(tuning.seeds):
            was = ", ".join(c.label for c in entry.candidates)
            raise DefinitionError(
                f"{path(sweep_dir)} picked {unit.key}'s flags among other candidates or seeds "
                f"({was}; seeds {list(entry.seeds)}) than the definition lists now "
                f"({', '.join(label(c) for c in unit.group.candidates)}; seeds "
                f"{list(tuning.seeds)}): its pick stands unless you delete {path(sweep_dir)}"
            )
        picks[unit.key] = dict(entry.flags)
    definition.picks = picks


def settle(definition: Definition, sweep_dir: str, only: str | None = None) -> list[Pick]:
    """Write the pick of every unit (or of the unit `only`) whose tuning runs have all finished
    and that has none yet into tuning.json (atomically, under a lock), and refresh
    `definition.picks`. Returns the new picks."""
    tuning = definition.tuning
    if tuning is None:
        return []
    new, grown = [], False
    with tuning_file.locked(sweep_dir):
        kept = tuning_file.read(sweep_dir)
        refresh_extensions(definition, kept)
        for unit in tuning.units:
            if unit.key in kept.picks or only not in (None, unit.key):
                continue
            added = grow(definition, unit, sweep_dir)
            if added:  # where its best sits at its grid's edge: no pick yet
                kept.extensions.setdefault(unit.key, []).extend(added)
                refresh_extensions(definition, kept)
                grown = True
                print(f"tuning {unit.key}: best at its grid's edge; added {added_words(added)}")
                continue
            entry = pick(definition, unit, sweep_dir)
            if entry is not None:
                kept.picks[unit.key] = entry
                new.append(entry)
        if new or grown:
            tuning_file.write(sweep_dir, kept, RULE)
    refresh(definition, sweep_dir)
    return new


def refresh_extensions(definition: Definition, kept: tuning_file.TuningFile) -> None:
    definition.extensions = {k: list(v) for k, v in kept.extensions.items()}


def describe_pick(entry: Pick) -> str:
    """One line for a new pick."""
    chosen = next(c for c in entry.candidates if c.label == entry.pick)
    seeds = ", ".join(str(s) for s in entry.seeds)
    return (
        f"tuning {entry.unit}: picked {entry.pick} (mean validation robust accuracy "
        f"{100 * chosen.mean:.1f}% over seeds {seeds}; {entry.decided_by})"
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
        if _run(run, sweep_dir).val_robust_accuracy is not None or run.name in names:
            continue
        if claims.owner(sweep_dir, run.name) is None:
            return f"its tuning run {run.name} is run by no process (give it to --only)"
    return None


# ------------------------------------------------------------------------------ the report


@dataclasses.dataclass(frozen=True)
class UnitSection:
    """A unit in the report's Tuning section: what it tunes, every candidate with its numbers,
    and its pick as tuning.json holds it (`pick`, `flags` and `decided_by` None while its runs
    are left), with where the pick sits on each flag its grid extends (`edges`, in this
    revision's words; None without a pick, or for one written before picks recorded them)."""

    unit: str
    method: str
    variant: str
    eps: float
    match: dict[str, Any]
    source: str
    cells: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    pick: str | None
    flags: dict[str, Any] | None
    decided_by: str | None
    edges: dict[str, str] | None

    def to_dict(self) -> dict[str, Any]:
        """As sweep.json holds it."""
        found = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        found["cells"] = list(self.cells)
        found["candidates"] = [c.to_dict() for c in self.candidates]
        return found


@dataclasses.dataclass(frozen=True)
class Section:
    """The Tuning section of sweep.json: the rule, the tuning seeds, the picks' file, the units."""

    rule: str
    seeds: tuple[int, ...]
    file: str
    units: tuple[UnitSection, ...]

    def to_dict(self) -> dict[str, Any]:
        """As sweep.json holds it."""
        units = [unit.to_dict() for unit in self.units]
        return {"rule": self.rule, "seeds": list(self.seeds), "file": self.file, "units": units}


def report_section(definition: Definition, sweep_dir: str) -> Section | None:
    """The Tuning section of sweep.json: per unit every candidate with its source, per-seed and
    mean validation robust accuracy and passes per step, and the pick (tuning.json's, which
    stands once written; none while runs are left)."""
    tuning = definition.tuning
    if tuning is None:
        return None
    kept = tuning_file.read(sweep_dir).picks
    units = []
    for unit in tuning.units:
        entry = kept.get(unit.key)
        units.append(
            UnitSection(
                **_identity(unit),
                cells=tuple(unit.cells),
                candidates=(
                    tuple(candidates(definition, unit, sweep_dir))
                    if entry is None
                    else entry.candidates
                ),
                pick=None if entry is None else entry.pick,
                flags=None if entry is None else entry.flags,
                decided_by=None if entry is None else entry.decided_by,
                edges=None if entry is None else edge_words(unit.group, entry),
            )
        )
    return Section(RULE, tuple(tuning.seeds), FILE, tuple(units))
