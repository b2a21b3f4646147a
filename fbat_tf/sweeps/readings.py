"""The report's view of a sweep's cells: grouping by variant and ε, and the numbers read from
them (robust and clean accuracy per evaluation, training figures), shared by its sections."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from fbat_tf.records import units
from fbat_tf.sweeps import masking


def eps_heading(report: dict[str, Any]) -> str:
    """The ε column's heading for the report's cells: "ε (/255)", or "ε (L2, pixels)" for a
    sweep whose cells train under --norm=l2 (their budgets in pixel units)."""
    return units.heading(_norms(report))


def eps_text(report: dict[str, Any], eps: float) -> str:
    """A budget of the report's cells as a person reads it: "8/255", or "1.5 (L2)"."""
    norms = _norms(report)
    norm = "l2" if norms == {"l2"} else "linf"
    return units.shown(units.to_pixels(eps, norm), norm)


def _norms(report: dict[str, Any]) -> set[str]:
    return {cell.get("flags", {}).get("norm", "linf") for cell in report.get("cells", [])}


def groups(cells: Sequence[dict[str, Any]]) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """Cells by (variant, ε), seeds together: the variants in grid order, each one's ε rising
    (a later grid entry may add budgets to a variant listed earlier)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["variant"], cell["eps"]), []).append(cell)
    order = list(dict.fromkeys(variant for variant, _ in groups))
    return dict(sorted(groups.items(), key=lambda item: (order.index(item[0][0]), item[0][1])))


def values(cells: Sequence[dict[str, Any]], *path: str) -> list[float]:
    values = []
    for cell in cells:
        value: Any = cell
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            values.append(float(value))
    return values


def label(variant: str, cells: Sequence[dict[str, Any]]) -> str:
    """The variant with the method's title, where its runs recorded one."""
    titles = list(dict.fromkeys(c["title"] for c in cells if c.get("title")))
    return f"{variant} ({', '.join(titles)})" if titles else variant


def percent(values: Sequence[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * statistics.fmean(values):.1f} ± {100 * statistics.stdev(values):.1f}"


def number(values: Sequence[float], digits: int = 1) -> str:
    return f"{statistics.fmean(values):.{digits}f}" if values else "–"


def evaluations(report: dict[str, Any]) -> list[dict[str, Any]]:
    return report["evaluation"]["attacks"]


def attacked(cells: Sequence[dict[str, Any]], name: str, eps: float | None = None) -> list[float]:
    """Robust accuracies of evaluation `name` at ε (default: each cell's own), as fractions."""
    values = []
    for cell in cells:
        key = f"{cell['eps'] if eps is None else eps:g}"
        value = cell.get(name, {}).get("robust_accuracy", {}).get(key)
        if value is not None:
            values.append(value)
    return values


def checked(
    cells: Sequence[dict[str, Any]], report: dict[str, Any], name: str, eps: float | None = None
) -> list[dict[str, Any]]:
    """The cells whose robust accuracy of evaluation `name` at ε (default: each cell's own) is
    the masking check's combined one (sweeps/masking.py)."""
    check = report.get("masking_check")
    if not check or check["of"] != name:
        return []
    return [cell for cell in cells if masking.is_checked(cell, name, eps)]


def check_mark(
    cells: Sequence[dict[str, Any]], report: dict[str, Any], name: str, eps: float | None = None
) -> str:
    """ " ‡" where a checked number enters the cells' figure, else ""."""
    return f" {masking.MARK}" if checked(cells, report, name, eps) else ""


CHECKED = f"masking check {masking.MARK}"


def clean(cells: Sequence[dict[str, Any]], report: dict[str, Any]) -> list[float]:
    """Clean accuracy from the cells' first evaluation (the one with the most examples when
    the definition says so first)."""
    first = evaluations(report)[0]["name"]
    return values(cells, first, "clean_accuracy")


def overridden(report: dict[str, Any]) -> list[str]:
    """A warning line for a sweep whose cells ran with --override, or nothing."""
    overrides = report.get("overrides") or {}
    if not overrides:
        return []
    words = ",".join(f"{key}={value}" for key, value in overrides.items())
    return [
        f"**Not comparable with the definition or the paper:** every cell ran with "
        f"`--override={words}`.",
        "",
    ]
