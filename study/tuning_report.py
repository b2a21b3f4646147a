"""The tuning stage in a sweep's report: the flags each tuned row ran with (`tuned_note`), every
candidate's validation numbers and the pick (`tuning_table`), and the pick's validation number
beside its final cells' test numbers (`criterion_table`), which shows where the criterion
scored robustness the test's attacks removed. Each reads the report's tuning section as the
tuning stage's records (tuning.Section, UnitSection, Candidate, TuningRun), by attribute."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from fbat_tf.records import CellResult
from fbat_tf.records.config import TrainConfig
from fbat_tf.sweeps.cells import word
from fbat_tf.sweeps.tuning import TuningRun, UnitSection
from study import readings
from study.cells import Report


def _percent(value: float | None, run: TuningRun | None = None) -> str:
    if value is None:
        return "–"
    text = f"{100 * value:.1f}"
    return f"{text} (diverged)" if run is not None and run.diverged else text


def _units(report: Report) -> tuple[UnitSection, ...]:
    """The units of the report's tuning section (tuning.report_section); none without one."""
    section = report.tuning
    return () if section is None else section.units


def tuned_note(report: Report, variant: str, eps: float) -> str:
    """For the report's main table: the flags a variant's cells at ε ran with by their tuning
    pick (" [tuned: lr_max=0.1]"), or that the pick is pending; "" where none was tuned."""
    for unit in _units(report):
        if (unit.variant, unit.eps) == (variant, eps):
            if unit.pick is None:
                return " [tuning pending]"
            return f" [tuned: {', '.join(f'{k}={word(v)}' for k, v in unit.flags.items())}]"
    return ""


def tuning_table(report: Report) -> list[str]:
    """The Tuning section of sweep.md, or nothing."""
    section = report.tuning
    if section is None:
        return []
    seeds = section.seeds
    marked = any(c.origin is not None for unit in section.units for c in unit.candidates)
    lines = [
        "## Tuning",
        "",
        f"Candidates trained on tuning seeds {', '.join(map(str, seeds))} (none of them a final "
        "cell's seed) and compared by validation robust accuracy (%) at each run's selected "
        f"epoch, never by the test split; picked by this rule: {section.rule} The final "
        f"cells of each row ran with the pick's flags ({section.file}).",
        "",
        f"| method | {readings.eps_heading(report)} | candidate | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | passes/step | "
        + ("value | " if marked else "")
        + "pick | source |",
        "|---|---|---|"
        + "---|" * len(seeds)
        + "---|---|"
        + ("---|" if marked else "")
        + "---|---|",
    ]
    if marked:
        lines[4:4] = [
            "Value: an author's released setting, or extrapolated beyond what any author "
            "released (added: a candidate the grid gained because the pick sat at its edge). "
            "Beside each pick, where it sits on every flag the grid extends: interior, or the "
            "bound it met and why.",
            "",
        ]
    for unit in section.units:
        for i, candidate in enumerate(unit.candidates):
            by_seed = {run.seed: run for run in candidate.runs}
            values = [
                _percent(by_seed[s].val_robust_accuracy, by_seed[s]) if s in by_seed else "–"
                for s in seeds
            ]
            flags = ", ".join(f"{k}={word(v)}" for k, v in candidate.flags.items())
            chosen = unit.pick == candidate.label
            why = unit.decided_by
            if chosen and unit.edges:
                why += "; " + "; ".join(f"{k}: {v}" for k, v in unit.edges.items())
            mark = f"**picked** ({why})" if chosen else ""
            value = ""
            if marked:
                value = "–" if candidate.origin is None else candidate.origin
                value += ", added" if candidate.added else ""
                value += " | "
            if unit.pick is None and i == 0:
                mark = "pending"
            lines.append(
                f"| {unit.variant if i == 0 else ''} | {unit.eps:g} | "
                + (f"**{flags}**" if chosen else flags)
                + " | "
                + " | ".join(values)
                + f" | {_percent(candidate.mean)} | {candidate.passes_per_step} | {value}"
                + f"{mark} | "
                + f"{unit.source if i == 0 else ''} |"
            )
    return lines


def selected_validation(cell: CellResult) -> float | None:
    """A trained cell's validation robust accuracy at its selected epoch (the number the tuning
    stage ranks candidates by), or None (also where the record holds no number there: NaN)."""
    train = cell.train
    if train is None or train.selected_epoch is None:
        return None
    found = train.val_robust_accuracy[train.selected_epoch - 1]
    return found if found is not None and math.isfinite(found) else None


def selected_pgd(cell: CellResult) -> float | None:
    """PGD's own validation accuracy at a cell's selected epoch, where validation ran a
    black-box part after it (the tuned study's criterion, PGD-10 alone); None else."""
    train = cell.train
    if train is None or train.selected_epoch is None or train.val_pgd_accuracy is None:
        return None
    found = train.val_pgd_accuracy[train.selected_epoch - 1]
    return found if found is not None and math.isfinite(found) else None


def _validation_steps(cells: Sequence[CellResult]) -> int:
    """Validation PGD's steps, as the final cells' flags set them (train.py's default else)."""
    flags = cells[0].flags if cells else {}
    return flags.get("val_attack_steps", TrainConfig.val_attack_steps)


def _validation_words(cells: Sequence[CellResult]) -> str:
    """The validation attack, as the final cells' flags set it (train.py's defaults else)."""
    flags = cells[0].flags if cells else {}
    steps = _validation_steps(cells)
    restarts = flags.get("val_restarts", TrainConfig.val_restarts)
    examples = flags.get("val_examples", TrainConfig.val_examples)
    queries = flags.get("val_square_queries", TrainConfig.val_square_queries)
    again = f", {restarts} restarts" if restarts > 1 else ""
    then = f" then Square-{queries} on the points it left robust" if queries else ""
    return f"PGD-{steps}{again}{then} on {examples} validation images"


def criterion_table(report: Report) -> list[str]:
    """Per tuned row: the pick's mean validation robust accuracy over the tuning seeds, the same
    number on the final cells, their test robust accuracy by each evaluation, and validation
    minus the lowest test figure (both on the final cells); nothing for a sweep without tuning
    or before any pick."""
    units = [unit for unit in _units(report) if unit.pick is not None]
    if not units:
        return []
    evaluations = report.evaluations
    by_row = readings.groups(report.cells)
    finals = [c for unit in units for c in by_row.get((unit.variant, unit.eps), [])]
    # Where validation ran a black-box part after PGD, PGD's own figure is the criterion
    # without it: the gap under both.
    alone = any(selected_pgd(cell) is not None for cell in finals)
    steps = _validation_steps(finals)
    lines = [
        "## The tuning criterion against the test",
        "",
        f"Validation robust accuracy (%) at the selected epoch ({_validation_words(finals)}), "
        "the number the picks were made by: the pick's mean over the tuning seeds, and the mean "
        "over the final cells done; beside it their test accuracies and how far validation "
        "stands above the lowest of them, on the same cells. A wide gap shows the criterion "
        "scored robustness that the test's attacks removed (as gradient masking does), so that "
        "it may have favoured the setting that masks most; the picks stand as the rule made "
        "them. ‡: a masking-checked number (above)."
        + (
            f" The same gap under PGD-{steps} alone (the criterion without its black-box part, "
            "at the same selected epoch, scored by the standard definition) stands last."
            if alone
            else ""
        ),
        "",
        f"| method | {readings.eps_heading(report)} | pick | validation (tuning seeds) | "
        "validation (final cells) | "
        + " | ".join(f"test {e.label}" for e in evaluations)
        + " | validation − lowest test (points) |"
        + (
            f" PGD-{steps} alone (final cells) | PGD-{steps} alone − lowest test (points) |" * alone
        ),
        "|---|---|---|---|---|" + "---|" * len(evaluations) + "---|" + "---|---|" * alone,
    ]
    for unit in units:
        cells = [
            cell
            for cell in by_row.get((unit.variant, unit.eps), [])
            if cell.state == "done" and selected_validation(cell) is not None
        ]
        picked = next(c for c in unit.candidates if c.label == unit.pick)
        validation = [selected_validation(cell) for cell in cells]
        tests = [readings.attacked(cells, e.name) for e in evaluations]
        complete = [values for values in tests if len(values) == len(cells) and values]
        lowest = min(map(statistics.fmean, complete)) if complete else None
        gap = "–" if lowest is None else f"{100 * (statistics.fmean(validation) - lowest):+.1f}"
        pgd = [selected_pgd(cell) for cell in cells]
        pgd = [value for value in pgd if value is not None]
        pgd_gap = (
            f"{100 * (statistics.fmean(pgd) - lowest):+.1f}"
            if lowest is not None and len(pgd) == len(cells)
            else "–"
        )
        last = f" {readings.percent(pgd)} | {pgd_gap} |" if alone else ""
        flags = ", ".join(f"{k}={word(v)}" for k, v in unit.flags.items())
        lines.append(
            f"| {unit.variant} | {unit.eps:g} | {flags} | {_percent(picked.mean)} | "
            f"{readings.percent(validation)} ({len(cells)} cell{'s' * (len(cells) != 1)}) | "
            + " | ".join(
                readings.percent(values) + readings.check_mark(cells, report, e.name)
                for e, values in zip(evaluations, tests, strict=True)
            )
            + f" | {gap} |"
            + last
        )
    return lines
