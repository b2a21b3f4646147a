"""Robustness against cost: each variant's training cost in passes through the model (and the
measured time of its steps, second), its Pareto standing and its paired comparison with the
most robust variant at each ε."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from fbat_tf import catalog
from fbat_tf.sweeps import masking
from study import comparisons, paired, readings
from study.cells import CostBench, Report
from study.comparisons import interval_words, margin_words


def kilo(passes: float) -> str:
    """Passes in thousands, to three significant digits: never 0.0 for a short run."""
    return f"{passes / 1000:.3g}"


@dataclasses.dataclass
class CostRow:
    """One variant at one ε in the robustness-against-cost table (cost_rows)."""

    variant: str  # its label in the tables
    key: str  # its variant key (readings.groups)
    passes: float  # its runs' mean cost in passes through the model
    passes_per_step: int
    robust: float  # the last evaluation's robust accuracy, mean over seeds
    seeds: int
    marks: list[str]  # masking-checked, masked, touched by an indicator
    most_robust: bool
    versus_best: paired.Comparison | None  # its paired comparison with the most robust
    seconds: float | None = None  # measured step time × its steps, where a bench gives one
    seconds_rounds: list[float] | None = None
    pareto: bool = False  # no other variant is as cheap and as robust

    def to_json(self) -> dict[str, Any]:
        """As sweep.json holds it: the time keys only where a cost bench gave a time."""
        found = dataclasses.asdict(dataclasses.replace(self, versus_best=None))
        found["versus_best"] = self.versus_best and self.versus_best.to_dict()
        if self.seconds is None:
            del found["seconds"], found["seconds_rounds"]
        return found


@dataclasses.dataclass(frozen=True)
class MeasuredTime:
    """The cost bench's step times (`measured_time`) and the load they were measured under."""

    bench: CostBench
    load: float | None  # the highest load average over a minute the bench recorded, or None
    cores: int | None  # the machine's, as the bench recorded them
    under_load: bool  # a load above the cores: the times are indicative only


def measured_time(report: Report) -> MeasuredTime | None:
    """The cost bench's step times, where the definition names one, and whether they were
    measured under a load above the machine's cores (then no choice rests on them)."""
    cost = report.cost
    if cost is None:
        return None
    setting = cost.setting
    load = setting.get("load_average_1min") or {}
    cores = (setting.get("machine") or {}).get("cpu_count")
    peak = max(load.values()) if load else None
    return MeasuredTime(cost, peak, cores, peak is not None and cores is not None and peak > cores)


def cost_rows(report: Report) -> dict[float, list[CostRow]]:
    """Per ε, each variant: its runs' mean cost in passes, its passes per step, its
    robustness (the last evaluation, mean over seeds), whether it is on the Pareto front (no
    other is as cheap and as robust), its paired comparison with the most robust variant
    (Holm-corrected in the report's family, comparisons.family), and the measured time of its
    steps where a cost bench gives one."""
    name = report.evaluations[-1].name
    timing = measured_time(report)
    compared = comparisons.family(report)
    per_eps: dict[float, list[CostRow]] = {}
    for (variant, eps), cells in readings.groups(report.cells).items():
        # Runs still training (no optimizer steps recorded yet) are priced once they finish.
        priced = readings.priced(cells)
        robust = readings.attacked(cells, name)
        if not priced or not robust:
            continue
        row = CostRow(
            variant=readings.label(variant, cells),
            key=variant,
            passes=statistics.fmean(readings.cell_passes(cell) for cell in priced),
            passes_per_step=catalog.total_passes(priced[0].train.passes),
            robust=statistics.fmean(robust),
            seeds=len(robust),
            # Its robustness holds masking-checked numbers, cells the check found masked
            # (sweeps/masking.py) and cells an indicator of attack failure touched.
            marks=[
                *([readings.CHECKED] if readings.checked(cells, report, name) else []),
                *filter(None, [readings.masked_words(cells), readings.indicated_words(cells)]),
            ],
            most_robust=variant == compared.best[eps],
            versus_best=compared.versus.get((eps, variant)),
        )
        if timing:
            step = timing.bench.step_seconds.get(priced[0].train.cost_variant)
            steps = [c.train.optimizer_steps for c in priced]
            rounds = timing.bench.round_step_seconds.get(priced[0].train.cost_variant)
            if step is not None:
                row.seconds = step * statistics.fmean(steps)
                row.seconds_rounds = [r * statistics.fmean(steps) for r in rounds or []]
        per_eps.setdefault(eps, []).append(row)
    for rows in per_eps.values():
        for row in rows:
            row.pareto = not any(
                other.passes <= row.passes
                and other.robust >= row.robust
                and (other.passes, other.robust) != (row.passes, row.robust)
                for other in rows
            )
        rows.sort(key=lambda row: row.passes)
    return dict(sorted(per_eps.items()))


def _mark(row: CostRow) -> str:
    checked = f" {masking.MARK}" if readings.CHECKED in row.marks else ""
    masked = any(mark.startswith(f"masked {masking.MASKED_MARK}") for mark in row.marks)
    touched = any(mark.startswith(f"indicators {readings.INDICATED_MARK}") for mark in row.marks)
    return (
        checked
        + (f" {masking.MASKED_MARK}" if masked else "")
        + (f" {readings.INDICATED_MARK}" if touched else "")
    )


def cheapest_equivalent(rows: list[CostRow]) -> CostRow:
    """The cheapest variant (in passes) that is the most robust or shown equivalent to it, by
    the Holm-corrected verdicts of the comparisons with the most robust."""
    return min(
        (r for r in rows if r.most_robust or r.versus_best.verdict == "equivalent"),
        key=lambda r: r.passes,
    )


def cost_table(report: Report) -> list[str]:
    """The robustness-against-cost section, or nothing where no run recorded its steps."""
    rows_by_eps = cost_rows(report)
    if not rows_by_eps:
        return []
    evaluation = report.evaluations[-1]
    timing = measured_time(report)
    lines = [
        f"## Robustness against cost ({evaluation.label})",
        "",
        "Cost: each run's optimizer steps × its method's passes through the model per step "
        "(forward, backward and second-order passes, DESIGN.md §3.6), which no machine load "
        "moves. Against the most robust variant at each ε: the paired difference of robust "
        "accuracy over seeds, and images where the evaluations recorded them (points, 95 % "
        "interval, with the seeds-only one beside it where the images are counted; as in the "
        "paired comparisons, study/paired.py), and its verdict "
        f"(equivalent: within {margin_words(report)} by two one-sided tests; one seed decides "
        "nothing), Holm-corrected in one family with the paired comparisons (below); the "
        "interval is the uncorrected 95 % one. Which variant is the most robust is chosen by "
        "the data (the highest mean), so its lead over the others is not tested in advance. "
        "Pareto: no other variant is both as cheap and as robust.",
    ]
    columns = f"| {readings.eps_heading(report)} | method | passes/step | run (k passes) | "
    columns += "robust (%) | seeds | "
    columns += "vs the most robust | verdict (Holm) | Pareto |"
    rule = "|---|---|---|---|---|---|---|---|---|"
    if timing:
        setting = timing.bench.setting
        rounds = len(next(iter(timing.bench.round_step_seconds.values())))
        load = "unrecorded" if timing.load is None else f"up to {timing.load:.1f}"
        lines[-1] += (
            f" Time, second: each run's optimizer steps × its method's step time measured side "
            f"by side in `{timing.bench.source}` ({setting.get('model')}, width "
            f"{setting.get('width')}, batch {setting.get('batch_size')}, {setting.get('device')}"
            f"; median and range over {rounds} rounds; load average {load} on "
            f"{timing.cores} cores)."
        )
        if timing.under_load:
            lines[-1] += " **Measured under a load above the cores: indicative only.**"
        columns += " time (s) |"
        rule += "---|"
    lines += ["", columns, rule]
    for eps, rows in rows_by_eps.items():
        for row in rows:
            versus = row.versus_best
            says = "most robust" if versus is None else versus.says
            # The verdict's marks: the comparison's, over the runs it pairs on both sides (the
            # most robust's too); the most robust row, compared with none, carries its own.
            marks = versus.marks if versus else row.marks
            if marks:
                says += f" ({', '.join(marks)})"
            line = (
                f"| {eps:g} | {row.variant} | {row.passes_per_step} | "
                f"{kilo(row.passes)} | {100 * row.robust:.1f} | {row.seeds} | "
                f"{interval_words(versus)} | {says} | {'yes' if row.pareto else ''} |"
            )
            if timing:
                spread = row.seconds_rounds or []
                time = "–" if row.seconds is None else f"{row.seconds:.0f}"
                if len(spread) > 1:
                    time += f" ({min(spread):.0f}–{max(spread):.0f})"
                line += f" {time} |"
            lines.append(line)
    lines += [
        "",
        "The cheapest method (in passes) that is the most robust or shown equivalent to it, at "
        "each ε, by the corrected verdicts above; cheaper methods the seeds cannot tell from "
        "it are named as undecided:",
        "",
    ]
    for eps, rows in rows_by_eps.items():
        best = next(r for r in rows if r.most_robust)
        cheap = cheapest_equivalent(rows)
        undecided = [
            r.variant
            for r in rows
            if r.passes < cheap.passes and r.versus_best.verdict == "undecided"
        ]
        line = (
            f"- ε = {eps:g}: {cheap.variant}{_mark(cheap)} ({100 * cheap.robust:.1f}%, "
            f"{kilo(cheap.passes)}k passes); most robust {best.variant}{_mark(best)} "
            f"({100 * best.robust:.1f}%, {kilo(best.passes)}k passes)"
        )
        if undecided:
            line += f"; undecided: {', '.join(undecided)}"
        lines.append(line)
    return lines
