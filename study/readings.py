"""The report's view of a sweep's cells: grouping by variant and ε, and the numbers read from
them (robust and clean accuracy per evaluation, training figures), shared by its sections."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from fbat_tf import catalog
from fbat_tf.records import CellResult, TrainSummary, eps_key, units
from fbat_tf.sweeps import masking
from study.cells import Report


def eps_heading(report: Report) -> str:
    """The ε column's heading for the report's cells: "ε (/255)", or "ε (L2, pixels)" for a
    sweep whose cells train under --norm=l2 (their budgets in pixel units)."""
    return units.heading(_norms(report))


def eps_text(report: Report, eps: float) -> str:
    """A budget of the report's cells as a person reads it: "8/255", or "1.5 (L2)"."""
    norms = _norms(report)
    norm = "l2" if norms == {"l2"} else "linf"
    return units.shown(units.to_pixels(eps, norm), norm)


def l2_units(report: Report) -> str:
    """For a sweep whose cells train under L2, a sentence saying the unit its bare budgets are
    in (an L∞ sweep's are in 1/255, as the paper gives them, and say nothing)."""
    if _norms(report) != {"l2"}:
        return ""
    return f" Every ε in {units.unit_name('l2')}."


def _norms(report: Report) -> set[str]:
    return {cell.norm for cell in report.cells}


def groups(cells: Sequence[CellResult]) -> dict[tuple[str, float], list[CellResult]]:
    """Cells by (variant, ε), seeds together: the variants in grid order, each one's ε rising
    (a later grid entry may add budgets to a variant listed earlier)."""
    groups: dict[tuple[str, float], list[CellResult]] = {}
    for cell in cells:
        groups.setdefault((cell.variant, cell.eps), []).append(cell)
    order = list(dict.fromkeys(variant for variant, _ in groups))
    return dict(sorted(groups.items(), key=lambda item: (order.index(item[0][0]), item[0][1])))


def numbers(found: Iterable[Any]) -> list[float]:
    """The values that are numbers, as floats (None and the like left out)."""
    return [float(value) for value in found if isinstance(value, (int, float))]


def trained(cells: Sequence[CellResult], read: Callable[[TrainSummary], Any]) -> list[float]:
    """What `read` gives of each trained cell's training summary, where it is a number:
    trained(cells, lambda train: train.seconds_per_epoch)."""
    return numbers(read(cell.train) for cell in cells if cell.train is not None)


def cell_passes(cell: CellResult) -> float | None:
    """Passes through the model of the run's optimizer steps (DESIGN.md §3.6); None for a run
    that recorded none (one still training)."""
    if cell.train is None:
        return None
    steps, per_step = cell.train.optimizer_steps, cell.train.passes
    return None if not steps or not per_step else steps * catalog.total_passes(per_step)


def priced(cells: Sequence[CellResult]) -> list[CellResult]:
    """The cells whose runs' passes are known (cell_passes)."""
    return [cell for cell in cells if cell_passes(cell) is not None]


def label(variant: str, cells: Sequence[CellResult]) -> str:
    """The variant with the method's title, where its runs recorded one."""
    titles = list(dict.fromkeys(c.title for c in cells if c.title))
    return f"{variant} ({', '.join(titles)})" if titles else variant


def percent(values: Sequence[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * statistics.fmean(values):.1f} ± {100 * statistics.stdev(values):.1f}"


def number(values: Sequence[float], digits: int = 1) -> str:
    return f"{statistics.fmean(values):.{digits}f}" if values else "–"


def attacked(cells: Sequence[CellResult], name: str, eps: float | None = None) -> list[float]:
    """Robust accuracies of evaluation `name` at ε (default: each cell's own), as fractions."""
    values = []
    for cell in cells:
        evaluation = cell.evaluation(name)
        value = None if evaluation is None else evaluation.robust(cell.eps if eps is None else eps)
        if value is not None:
            values.append(value)
    return values


def checked(
    cells: Sequence[CellResult], report: Report, name: str, eps: float | None = None
) -> list[CellResult]:
    """The cells whose robust accuracy of evaluation `name` at ε (default: each cell's own) is
    the masking check's combined one (sweeps/masking.py)."""
    check = report.masking_check
    if check is None or check.of.name != name:
        return []
    return [cell for cell in cells if masking.is_checked(cell, name, eps)]


def check_mark(
    cells: Sequence[CellResult], report: Report, name: str, eps: float | None = None
) -> str:
    """ " ‡" where a checked number enters the cells' figure, else ""."""
    return f" {masking.MARK}" if checked(cells, report, name, eps) else ""


CHECKED = f"masking check {masking.MARK}"


def masked(cells: Sequence[CellResult], eps: float | None = None) -> list[CellResult]:
    """The cells the masking check found masked at ε (default: each cell's own): black-box
    attacks broke more than its threshold of points the white-box parts left robust."""
    found = []
    for cell in cells:
        entry = (cell.masking_check or {}).get(cell.eps if eps is None else eps)
        if entry is not None and entry.masked:
            found.append(cell)
    return found


def masked_words(cells: Sequence[CellResult], eps: float | None = None) -> str | None:
    """ "masked §: fastat in 3 of 5 runs, pgd in 1 of 5" for the cells' variants, or None."""
    parts = []
    for variant in dict.fromkeys(cell.variant for cell in cells):
        mine = [cell for cell in cells if cell.variant == variant]
        hit = masked(mine, eps)
        if hit:
            parts.append(f"{variant} in {len(hit)} of {len(mine)} runs")
    return f"masked {masking.MASKED_MARK}: {', '.join(parts)}" if parts else None


# A cell whose evaluation an indicator of attack failure or a reference check touched (as
# evaluate.py marks such a number).
INDICATED_MARK = "¶"


def indicated(cells: Sequence[CellResult], eps: float | None = None) -> dict[str, list[str]]:
    """The cells (by name) whose evaluations at ε (default: each cell's own) an indicator or a
    reference check fired on, with what fired, each name once."""
    found: dict[str, list[str]] = {}
    for cell in cells:
        at = eps_key(cell.eps if eps is None else eps)
        names = [n for e in cell.evaluations.values() for n in e.indicated.get(at, ())]
        if names:
            found[cell.name] = list(dict.fromkeys(names))
    return found


def indicated_words(cells: Sequence[CellResult], eps: float | None = None) -> str | None:
    """ "indicators ¶: elle in 2 of 5 runs (zero gradients)" for the cells' variants, or None."""
    hit = indicated(cells, eps)
    parts = []
    for variant in dict.fromkeys(cell.variant for cell in cells):
        mine = [cell for cell in cells if cell.variant == variant]
        names = [n for cell in mine for n in hit.get(cell.name, ())]
        touched = [cell for cell in mine if cell.name in hit]
        if touched:
            what = ", ".join(n.replace("_", " ") for n in dict.fromkeys(names))
            parts.append(f"{variant} in {len(touched)} of {len(mine)} runs ({what})")
    return f"indicators {INDICATED_MARK}: {'; '.join(parts)}" if parts else None


def clean(cells: Sequence[CellResult], report: Report) -> list[float]:
    """Clean accuracy from the cells' first evaluation (the one with the most examples when
    the definition says so first)."""
    first = report.evaluations[0].name
    found = (cell.evaluation(first) for cell in cells)
    return numbers(evaluation.clean_accuracy for evaluation in found if evaluation is not None)


def overridden(report: Report) -> list[str]:
    """A warning line for a sweep whose cells ran with --override, or nothing."""
    if not report.overrides:
        return []
    words = ",".join(f"{key}={value}" for key, value in report.overrides.items())
    return [
        f"**Not comparable with the definition or the paper:** every cell ran with "
        f"`--override={words}`.",
        "",
    ]
