"""Paired comparisons of a sweep's variants over seeds, and over test images where the cells'
evaluations recorded which points they got right (study/paired.py), with what weakens each one
(other revisions, uncommitted code, runs of one seed that did not start alike, the images left
out). The definition's comparisons, at every ε, and each variant's comparison with the most
robust one at its ε are one family: Holm's correction applies to them together (`family`)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import NamedTuple

from fbat_tf.records import CellResult, Outcomes
from study import paired, readings
from study.cells import Report


def _by_seed(cells: Sequence[CellResult], name: str) -> dict[int, float]:
    """Robust accuracy of evaluation `name` at each cell's own ε, by seed."""
    values = {}
    for cell in cells:
        evaluation = cell.evaluation(name)
        value = None if evaluation is None else evaluation.robust(cell.eps)
        if value is not None:
            values[cell.seed] = value
    return values


def _outcomes_by_seed(
    cells: Sequence[CellResult], name: str, seeds: Sequence[int]
) -> dict[int, Outcomes] | None:
    """Each seed's recorded outcomes of evaluation `name` at the cell's own ε, or None where a
    cell has none."""
    found = {}
    for cell in cells:
        evaluation = cell.evaluation(name)
        record = None if evaluation is None else evaluation.outcome(cell.eps)
        if record is not None:
            found[cell.seed] = record
    return found if all(s in found for s in seeds) else None


def per_point_outcomes(
    cells_a: Sequence[CellResult],
    cells_b: Sequence[CellResult],
    name: str,
    accuracies: tuple[dict[int, float], dict[int, float]],
    seeds: Sequence[int],
) -> tuple[tuple[dict[int, str], dict[int, str]] | None, str | None]:
    """A's and B's per-point outcomes by seed, where every cell of both recorded them on the
    same points (one split, one length) and they give the accuracies the cells recorded; else
    None, and why where outcomes were recorded but cannot be used."""
    found = [_outcomes_by_seed(cells, name, seeds) for cells in (cells_a, cells_b)]
    if not seeds or found[0] is None or found[1] is None:
        return None, None
    records = [by_seed[s] for by_seed in found for s in seeds]
    if len({len(r.points) for r in records}) > 1 or len({r.split for r in records}) > 1:
        return None, "outcomes on different points"
    for by_seed, accuracy in zip(found, accuracies, strict=True):
        for seed in seeds:
            points = by_seed[seed].points
            if not set(points) <= {"0", "1"} or (
                abs(points.count("1") / len(points) - accuracy[seed]) > 0.5 / len(points)
            ):
                return None, "outcomes disagree with the accuracy"
    return (
        {s: found[0][s].points for s in seeds},
        {s: found[1][s].points for s in seeds},
    ), None


def _pairing(cell: CellResult) -> dict[str, str] | None:
    return None if cell.train is None else cell.train.pairing


def _pair_marks(
    a: Sequence[CellResult],
    b: Sequence[CellResult],
    seeds: Sequence[int],
    report: Report,
    name: str,
) -> list[str]:
    """What weakens or qualifies a paired comparison: its cells ran different revisions or
    uncommitted code, or two runs of one seed started from different weights or data (their
    fingerprints); a cell's number that is the masking check's (sweeps/masking.py), and cells
    the check found masked, by side; and runs
    of either side that diverged, whose seeds the comparison leaves out (it speaks only of the
    runs that trained, or of none)."""
    cells_a, cells_b = ({c.seed: c for c in cells} for cells in (a, b))
    by_seed = [(cells_a[s], cells_b[s]) for s in seeds]
    cells = [cell for pair in by_seed for cell in pair]
    marks = []
    if len({r for c in cells for r in c.code.revisions}) > 1:
        marks.append("different revisions")
    if any(c.code.dirty for c in cells):
        marks.append("uncommitted or unrecorded code †")
    prints = [(_pairing(x), _pairing(y)) for x, y in by_seed]
    if any(x and y and x != y for x, y in prints):
        marks.append("not paired")
    if readings.checked(cells, report, name):
        marks.append(readings.CHECKED)
    masked = readings.masked_words(cells)
    if masked:
        marks.append(masked)
    touched = readings.indicated_words(cells)
    if touched:
        marks.append(touched)
    for side in (a, b):
        trained = [cell for cell in side if cell.train is not None]
        diverged = [cell for cell in trained if cell.state == "diverged"]
        if diverged:
            marks.append(f"{side[0].variant} diverged in {len(diverged)} of {len(trained)} runs")
    return marks


def comparison(report: Report, eps: float, a: str, b: str) -> paired.Comparison | None:
    """Variant `a` against `b` at ε, paired over seeds on the last evaluation (paired.compare),
    and over its test points where every cell recorded them, with its marks ("seeds only" where
    not), uncorrected; None where either has no cell."""
    groups = readings.groups(report.cells)
    cells_a, cells_b = groups.get((a, eps)), groups.get((b, eps))
    if not cells_a or not cells_b:
        return None
    evaluation = report.evaluations[-1]
    name = evaluation.name
    accuracies = _by_seed(cells_a, name), _by_seed(cells_b, name)
    seeds = sorted(set(accuracies[0]) & set(accuracies[1]))
    outcomes, unusable = per_point_outcomes(cells_a, cells_b, name, accuracies, seeds)
    points = len(next(iter(outcomes[0].values()))) if outcomes else evaluation.examples
    found = paired.compare(
        *accuracies,
        report.margin,
        resolution=100.0 / points if points else 0.0,
        outcomes=outcomes,
    )
    marks = _pair_marks(cells_a, cells_b, found.seeds, report, name)
    if outcomes is not None and found.model == paired.SEEDS_ONLY:  # paired.compare's rule
        unusable = f"{len(seeds)} seeds; the seeds × images model needs {paired.CROSSED_MIN_SEEDS}"
    if found.model == paired.SEEDS_ONLY and found.interval is not None:
        marks.append(f"seeds only ({unusable})" if unusable else "seeds only")
    found.eps, found.a, found.b, found.marks = eps, a, b, marks
    _describe(found)
    return found


def _describe(found: paired.Comparison) -> None:
    found.says = paired.describe(found, found.a, found.b)
    found.raw_says = paired.describe(found, found.a, found.b, found.raw_verdict)


def contenders(report: Report) -> dict[float, list[tuple[str, float]]]:
    """Per ε, each variant whose runs are priced (readings.priced) and attacked by the last
    evaluation, with its mean robust accuracy, in the report's group order: the rows of the
    robustness-against-cost table."""
    name = report.evaluations[-1].name
    found: dict[float, list[tuple[str, float]]] = {}
    for (variant, eps), cells in readings.groups(report.cells).items():
        robust = readings.attacked(cells, name)
        if readings.priced(cells) and robust:
            found.setdefault(eps, []).append((variant, statistics.fmean(robust)))
    return found


# What Holm's correction sets on a comparison (paired.correct), shared by a pair listed twice.
ADJUSTED = ("p_holm", "p_equivalence_holm", "correction", "family")


class Family(NamedTuple):
    """A report's comparisons, Holm-corrected together (`family`)."""

    listed: list[paired.Comparison]  # the definition's, at every ε where both variants ran
    versus: dict[tuple[float, str], paired.Comparison]  # (ε, contender) against the most robust
    best: dict[float, str]  # per ε, the most robust contender (the first listed on a tie)
    size: int  # m: the family's hypotheses with a p-value


def family(report: Report) -> Family:
    """The report's comparisons, corrected together by Holm's method (paired.correct): the
    definition's, at every ε where both variants ran, and each contender against the one with
    the highest mean robust accuracy at its ε. A pair in both, either way round, is one
    hypothesis of the family (its p-values do not depend on the order) and gets one adjusted
    p-value; the uncorrected verdicts are kept."""
    listed = []
    for a, b in report.comparisons:
        for eps in report.eps_values:
            pair = comparison(report, eps, a, b)
            if pair is not None:
                listed.append(pair)
    rows_by_eps = contenders(report)
    best = {eps: max(rows, key=lambda row: row[1])[0] for eps, rows in rows_by_eps.items()}
    versus = {
        (eps, variant): comparison(report, eps, variant, best[eps])
        for eps, rows in rows_by_eps.items()
        for variant, _ in rows
        if variant != best[eps]
    }
    hypotheses: dict[tuple[float, frozenset[str]], list[paired.Comparison]] = {}
    for pair in [*listed, *versus.values()]:
        hypotheses.setdefault((pair.eps, frozenset((pair.a, pair.b))), []).append(pair)
    one_each = [same[0] for same in hypotheses.values()]
    size = paired.correct(one_each)
    for first, *again in hypotheses.values():
        for pair in again:
            for key in ADJUSTED:
                setattr(pair, key, getattr(first, key))
            if pair.seeds_only:
                pair.seeds_only.p_holm = first.seeds_only.p_holm
                pair.seeds_only.p_equivalence_holm = first.seeds_only.p_equivalence_holm
            paired.settle(pair)
    for pair in [*listed, *versus.values()]:
        _describe(pair)
    return Family(listed, versus, best, size)


def listed_comparisons(report: Report) -> list[paired.Comparison]:
    """The definition's comparisons at every ε where both variants ran, Holm-corrected in the
    report's family (`family`)."""
    return family(report).listed


def interval_words(found: paired.Comparison | None) -> str:
    if not found or found.interval is None:
        if not found or found.mean is None:
            return "–"
        return f"{paired.signed_points(found.mean)} (one seed)"
    low, high = (paired.signed_points(value) for value in found.interval)
    words = f"{paired.signed_points(found.mean)} [{low}, {high}]"
    if found.seeds_only:  # the crossed interval, and beside it the seeds-only one
        low, high = (paired.signed_points(value) for value in found.seeds_only.interval)
        words += f" (seeds only [{low}, {high}])"
    return words


def margin_words(report: Report) -> str:
    return f"±{report.margin:g} point"


def family_words(found: Sequence[paired.Comparison]) -> str:
    """What the family corrected together is, and its size."""
    size = next((pair.family for pair in found if pair.family is not None), 0)
    words = (
        "The family: this table's comparisons at every ε and those with the most robust "
        "variant in the robustness-against-cost table, a pair in both counted once; "
        f"m = {size}"
    )
    if any(pair.p is None for pair in found):
        words += " (those of two seeds or more: one seed gives no p-value)"
    return (
        f"{words}. Holm's step-down correction adjusts the p-values of A ≠ B and, apart, those "
        "of equivalence within the family, and the seeds-only analyses' apart again (the same "
        "hypotheses); the verdict (Holm) is taken from the adjusted ones, the raw verdict from "
        "the p-values as computed. The interval is the uncorrected 95 % one."
    )


def _p_pair(analysis: paired.Comparison | paired.Analysis, name: str) -> str:
    """A p-value (`name`) of an analysis as computed and after Holm's correction: "0.021, 0.30"."""
    raw, adjusted = getattr(analysis, name), getattr(analysis, f"{name}_holm")
    return f"{paired.p_words(raw)}, {paired.p_words(adjusted)}"


def comparison_table(report: Report) -> list[str]:
    """The definition's comparisons, paired over seeds (and images), Holm-corrected."""
    found = listed_comparisons(report)
    if not found:
        return []
    lines = [
        f"## Paired comparisons ({report.evaluations[-1].label})",
        "",
        "A − B: the mean over seeds of the paired difference of robust accuracy (points), with "
        "its 95 % interval. Where every cell's evaluation recorded which test points it got "
        "right, on the same points, the interval counts the draw of the test images too (the "
        "seeds × images model: d_si = μ + seed_s + image_i + e_si, ANOVA mean squares and "
        "Satterthwaite's degrees of freedom), and the same comparison over seeds alone stands "
        "beside it (seeds only: the per-seed differences, S − 1 degrees of freedom); elsewhere "
        "it is over seeds only, for the images evaluated, and marked so. p (≠): the two-sided "
        "p-value of A ≠ B; p (equivalent): that of equivalence within "
        f"{margin_words(report)} by two one-sided tests at 5 % each (the 90 % interval within "
        "the margin). Verdict: A or B ahead where p (≠) < 0.05, else equivalent where "
        "p (equivalent) < 0.05, else undecided; where the interval counts the images, each "
        "only where the seeds-only analysis shows it too (both p-values below 0.05), so that no "
        "verdict rests on the images' model alone; one seed decides nothing, and the standard "
        "error is taken as at least one step of the accuracy (100/test points) over √seeds "
        "(study/paired.py).",
        "",
        family_words(found),
        "",
        f"| {readings.eps_heading(report)} | A | B | seeds | A − B [95 % interval] | "
        "p (≠): raw, Holm | "
        "p (equivalent): raw, Holm | verdict, raw | verdict (Holm) | marks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for pair in found:
        tests = []
        for name in ("p", "p_equivalence"):
            if getattr(pair, name) is None:
                tests.append("–")
                continue
            words = _p_pair(pair, name)
            if pair.seeds_only:
                words += f" (seeds only {_p_pair(pair.seeds_only, name)})"
            tests.append(words)
        seeds = str(len(pair.seeds))
        if pair.model == paired.CROSSED:
            seeds += f" × {pair.images} images"
        lines.append(
            f"| {pair.eps:g} | {pair.a} | {pair.b} | {seeds} | "
            f"{interval_words(pair)} | {tests[0]} | {tests[1]} | {pair.raw_says} | "
            f"{pair.says} | {', '.join(pair.marks) or '–'} |"
        )
    return lines
