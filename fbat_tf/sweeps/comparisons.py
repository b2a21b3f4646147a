"""Paired comparisons of a sweep's variants over seeds (sweeps/paired.py), with what weakens
each one (other revisions, uncommitted code, runs of one seed that did not start alike)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fbat_tf.sweeps import paired, readings


def _by_seed(cells: Sequence[dict[str, Any]], name: str) -> dict[int, float]:
    """Robust accuracy of evaluation `name` at each cell's own ε, by seed."""
    values = {}
    for cell in cells:
        value = cell.get(name, {}).get("robust_accuracy", {}).get(f"{cell['eps']:g}")
        if value is not None:
            values[cell["seed"]] = value
    return values


def _pair_marks(
    a: Sequence[dict], b: Sequence[dict], seeds: Sequence[int], report: dict, name: str
) -> list[str]:
    """What weakens or qualifies a paired comparison: its cells ran different revisions or
    uncommitted code, or two runs of one seed started from different weights or data (their
    fingerprints); and a cell's number that is the masking check's (sweeps/masking.py)."""
    cells_a, cells_b = ({c["seed"]: c for c in cells} for cells in (a, b))
    by_seed = [(cells_a[s], cells_b[s]) for s in seeds]
    cells = [cell for pair in by_seed for cell in pair]
    marks = []
    if len({r for c in cells for r in c.get("code", {}).get("revisions", [])}) > 1:
        marks.append("different revisions")
    if any(c.get("code", {}).get("dirty") for c in cells):
        marks.append("uncommitted or unrecorded code †")
    prints = [
        (x.get("train", {}).get("pairing"), y.get("train", {}).get("pairing")) for x, y in by_seed
    ]
    if any(x and y and x != y for x, y in prints):
        marks.append("not paired")
    if readings.checked(cells, report, name):
        marks.append(readings.CHECKED)
    return marks


def comparison(report: dict[str, Any], eps: float, a: str, b: str) -> dict[str, Any] | None:
    """Variant `a` against `b` at ε, paired over seeds on the last evaluation (paired.compare),
    with its marks; None where either has no cell."""
    groups = readings.groups(report["cells"])
    cells_a, cells_b = groups.get((a, eps)), groups.get((b, eps))
    if not cells_a or not cells_b:
        return None
    evaluation = readings.evaluations(report)[-1]
    name = evaluation["name"]
    found = paired.compare(
        _by_seed(cells_a, name),
        _by_seed(cells_b, name),
        report.get("margin", paired.MARGIN),
        resolution=100.0 / evaluation["examples"] if evaluation.get("examples") else 0.0,
    )
    found.update(
        eps=eps,
        a=a,
        b=b,
        marks=_pair_marks(cells_a, cells_b, found["seeds"], report, name),
        says=paired.describe(found, a, b),
    )
    return found


def listed_comparisons(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The definition's comparisons, at every ε where both variants ran."""
    found = []
    for a, b in report.get("comparisons", []):
        for eps in report["eps_values"]:
            pair = comparison(report, eps, a, b)
            if pair is not None:
                found.append(pair)
    return found


def interval_words(found: dict[str, Any] | None) -> str:
    if not found or found["interval"] is None:
        if not found or found["mean"] is None:
            return "–"
        return f"{paired.signed_points(found['mean'])} (one seed)"
    low, high = (paired.signed_points(value) for value in found["interval"])
    return f"{paired.signed_points(found['mean'])} [{low}, {high}]"


def margin_words(report: dict[str, Any]) -> str:
    return f"±{report.get('margin', paired.MARGIN):g} point"


def comparison_table(report: dict[str, Any]) -> list[str]:
    """The definition's comparisons, paired over seeds."""
    found = listed_comparisons(report)
    if not found:
        return []
    lines = [
        f"## Paired comparisons ({readings.evaluations(report)[-1]['label']})",
        "",
        "A − B: the mean over seeds of the paired difference of robust accuracy (points), with "
        "its 95 % interval; verdict: A or B ahead where the interval excludes 0, equivalent "
        f"within {margin_words(report)} by two one-sided tests at 5 %, else undecided; one "
        "seed decides nothing, and the spread of the differences is taken as at least one step "
        "of the accuracy (100/test points; sweeps/paired.py).",
        "",
        "| ε (/255) | A | B | seeds | A − B [95 % interval] | verdict | marks |",
        "|---|---|---|---|---|---|---|",
    ]
    for pair in found:
        lines.append(
            f"| {pair['eps']:g} | {pair['a']} | {pair['b']} | {len(pair['seeds'])} | "
            f"{interval_words(pair)} | {pair['says']} | {', '.join(pair['marks']) or '–'} |"
        )
    return lines
