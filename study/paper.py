"""The paper's published numbers beside what a sweep measured, row by row (`PaperRow`, which
sweep.json holds as "paper_vs_measured")."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from fbat_tf.records import CellResult
from fbat_tf.sweeps import masking
from study import readings
from study.cells import Report

PAPER_METRICS = (("clean", "clean"), ("pgd", "PGD"), ("autoattack", "AA"))


def measured_metric(
    cells: Sequence[CellResult],
    metric: str,
    report: Report,
    attacked_eps: float | None = None,
) -> list[float]:
    """The cells' values of a paper metric, in percent (seconds for seconds_per_epoch): clean,
    seconds_per_epoch, or the name of an evaluation, at each cell's ε or at `attacked_eps`."""
    if metric == "clean":
        return [100 * v for v in readings.clean(cells, report)]
    if metric == "seconds_per_epoch":
        return readings.trained(cells, lambda train: train.seconds_per_epoch)
    if any(e.name == metric for e in report.evaluations):
        return [100 * v for v in readings.attacked(cells, metric, attacked_eps)]
    return []


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return not isinstance(a, bool) and not isinstance(b, bool) and math.isclose(a, b)
    return a == b


def _defaults(paper: dict[str, Any], eps: float) -> dict[str, Any]:
    """The paper's settings where a row names none (its "defaults"; a value may depend on ε,
    {"8": 5000, "16": 2500})."""
    found = {}
    for key, value in paper.get("defaults", {}).items():
        if isinstance(value, dict):
            value = value.get(f"{eps:g}")
        if value is not None:
            found[key] = value
    return found


def matching_cells(report: Report, entry: dict[str, Any]) -> list[CellResult]:
    """The cells a published row speaks of: its method and training ε, and the row's setting
    (its flags over the paper's defaults) equal to the cell's (its flags over the same
    defaults, which are train.py's): Fast-BAT cells at 1/λ = 2000 are not the paper's 2500."""
    paper = report.paper
    matched = []
    for cell in report.cells:
        if cell.method != entry["method"] or not _same(cell.eps, float(entry["eps"])):
            continue
        defaults = _defaults(paper, cell.eps)
        setting = {**defaults, **entry.get("flags", {})}
        flags = {**defaults, **cell.flags}
        if all(key in flags and _same(flags[key], value) for key, value in setting.items()):
            matched.append(cell)
    return matched


def _of_setting(report: Report, entry: dict[str, Any]) -> bool:
    """Whether the sweep runs the row's setting: every flag the row names is set to the row's
    value by some cell (a CIFAR-10 sweep lists no CIFAR-100 row; a row whose method the grid
    lacks shows "not run")."""
    cells = report.cells
    # A null flag is a setting the paper leaves unknown (Table 8's c): no cell can be it.
    return all(
        value is not None and any(_same(cell.flags.get(key), value) for cell in cells)
        for key, value in entry.get("flags", {}).items()
    )


def _in_stds(difference: float | None, *stds: float | None) -> float | None:
    """The difference in units of the larger std (None without a std)."""
    larger = max((s for s in stds if s), default=None)
    return None if difference is None or not larger else difference / larger


@dataclasses.dataclass(frozen=True)
class PaperRow:
    """One published number beside what the cells of its setting measured (`paper_rows`)."""

    table: str  # the paper's table, as the paper-numbers file names it
    method: str
    eps: float  # the training ε, and the ε attacked at, as the file gives them
    attacked_eps: float
    metric: str  # clean, seconds_per_epoch or an evaluation's name
    paper_mean: float
    paper_std: float | None
    measured_mean: float | None  # None: no cell of the setting gave a number
    measured_std: float | None  # None: fewer than two numbers
    measured_runs: tuple[str, ...]  # the runs that gave a number, of the cells of the setting
    setting_runs: int
    checked_runs: tuple[str, ...]  # runs whose number is the masking check's
    difference: float | None  # measured − paper
    difference_in_std: float | None  # in units of the larger of the two stds
    flags: dict[str, Any]  # the flags the paper's row fixes

    def to_dict(self) -> dict[str, Any]:
        """As sweep.json holds it (its "paper_vs_measured")."""
        found = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        runs = {"measured_runs": list(self.measured_runs), "checked_runs": list(self.checked_runs)}
        return {**found, **runs}


def paper_rows(report: Report) -> list[PaperRow]:
    """Paper against measured, per published number, beside the cells of its setting."""
    rows = []
    for entry in report.paper["rows"]:
        if entry.get("implemented", True) is False or not _of_setting(report, entry):
            continue
        cells = matching_cells(report, entry)
        for metric, _ in (*PAPER_METRICS, ("seconds_per_epoch", "s/epoch")):
            if metric not in entry:
                continue
            mean, std = entry[metric]
            attacked_eps = entry.get("attacked_eps")  # None: each cell's own ε
            measured = measured_metric(cells, metric, report, attacked_eps)
            value = statistics.fmean(measured) if measured else None
            spread = statistics.stdev(measured) if len(measured) > 1 else None
            difference = None if value is None else value - mean
            rows.append(
                PaperRow(
                    table=entry["table"],
                    method=entry["method"],
                    eps=entry["eps"],
                    attacked_eps=entry.get("attacked_eps", entry["eps"]),
                    metric=metric,
                    paper_mean=mean,
                    paper_std=std,
                    measured_mean=value,
                    measured_std=spread,
                    measured_runs=tuple(
                        c.run_dir
                        for c in cells
                        if measured_metric([c], metric, report, attacked_eps)
                    ),
                    setting_runs=len(cells),
                    # Runs whose number is the masking check's (sweeps/masking.py).
                    checked_runs=tuple(
                        c.run_dir for c in readings.checked(cells, report, metric, attacked_eps)
                    ),
                    difference=difference,
                    difference_in_std=_in_stds(difference, std, spread),
                    flags=entry.get("flags", {}),
                )
            )
    return rows


def paper_table(report: Report) -> list[str]:
    lines = [
        f"## Paper against measured ({report.paper.get('source', 'paper')})",
        "",
        *readings.overridden(report),
        "Accuracies in %, time in seconds per epoch; paper: mean ± the std that table prints; "
        "measured: mean ± sample std over the seeds run (n of the cells of the setting); "
        "difference = measured − paper, and in units of "
        "the larger of the two stds. Setting: the flags the paper's row fixes, which the cells "
        "match.",
        "",
        "| table | method | setting | trained at ε | attacked at ε | metric | paper | measured "
        "| difference | in stds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in paper_rows(report):
        paper = f"{row.paper_mean:.2f}" + (
            f" ± {row.paper_std:.2f}" if row.paper_std is not None else ""
        )
        stds = "–"
        if row.measured_mean is None:
            measured = difference = "not run"
        else:
            measured = f"{row.measured_mean:.2f}" + (
                f" ± {row.measured_std:.2f}" if row.measured_std is not None else ""
            )
            measured += f" (n = {len(row.measured_runs)} of {row.setting_runs})"
            if row.checked_runs:
                measured += f" {masking.MARK}"
            difference = f"{row.difference:+.2f}"
            if row.difference_in_std is not None:
                stds = f"{row.difference_in_std:+.1f}"
        setting = " ".join(
            f"{k}={v}" for k, v in row.flags.items() if k not in ("dataset", "model")
        )
        lines.append(
            f"| {row.table} | {row.method} | {setting or '–'} | {row.eps:g} | "
            f"{row.attacked_eps:g} | {row.metric} | {paper} | {measured} | {difference} | "
            f"{stds} |"
        )
    return lines
