"""A sweep's report: sweep.json, the Markdown tables (sweep.md) and the PNG plots, put together
from its sections: `cells` (the numbers), `tuning_report` (the candidates tried and picked by
validation, and the picks beside the test), `costs` (robustness against cost), `comparisons`
(paired verdicts), `paper` (published numbers beside measured ones) and `plots`."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence

from fbat_tf import records
from fbat_tf.records import CellResult, RunRecord, eps_key
from fbat_tf.records.files import LinkRefused, write_atomic
from fbat_tf.records.runs import RESTORE
from fbat_tf.run import RESULTS
from fbat_tf.sweeps import estimate, masking
from study import readings
from study.cells import Report
from study.comparisons import comparison_table, family
from study.costs import cost_rows, cost_table
from study.paper import paper_rows, paper_table
from study.plots import PLOTS, PLOTTERS
from study.tuning_report import criterion_table, tuned_note, tuning_table


def _short(found: str | None) -> str:
    return "no git revision" if found is None else found[:12]


def code_lines(report: Report) -> list[str]:
    """Which code the numbers came from: one line when every cell ran one clean revision, else
    the revisions and the cells run from uncommitted code or from several revisions."""
    code = report.code
    revisions, dirty, mixed = code.revisions, code.dirty_cells, code.mixed_cells
    if not revisions:
        return []
    if len(revisions) == 1 and not dirty:
        return [f"Code: every cell ran revision {_short(next(iter(revisions)))}, committed.", ""]
    counted = ", ".join(f"{_short(r)} ({n} cells)" for r, n in revisions.items())
    lines = [f"Code: the cells ran {len(revisions)} revisions: {counted}."]
    if dirty:
        lines.append(
            f"† {len(dirty)} cells ran uncommitted (or unrecorded) code: {', '.join(dirty)}."
        )
    if mixed:
        lines.append(f"Cells whose parts ran different revisions: {', '.join(mixed)}.")
    return [*lines, ""]


def _dagger(cells: Sequence[CellResult]) -> str:
    return " †" if any(c.code.dirty for c in cells) else ""


UNUSABLE = "§"


def _robust_text(done: list[CellResult], name: str) -> str:
    """A group's robust accuracy over its done cells; where a value was unusable (its file
    holds no accuracy), on how many seeds, marked."""
    values = readings.attacked(done, name)
    text = readings.percent(values)
    if len(values) < len(done):
        text += f" ({len(values)} of {len(done)} seeds {UNUSABLE})"
    return text


def unusable_lines(report: Report) -> list[str]:
    """Under the main table: each evaluation file whose number is no accuracy, left out of every
    table and comparison (its seed with it)."""
    found = [
        f"- {UNUSABLE} {cell.name}: {message}"
        for cell in report.cells
        for evaluation in report.evaluations
        for message in _unusable(cell, evaluation.name)
    ]
    if not found:
        return []
    return [
        "",
        f"{UNUSABLE} Numbers that are no accuracy, left out with their seed (the seeds columns "
        "count what remains):",
        "",
        *found,
    ]


def indicated_lines(report: Report) -> list[str]:
    """Under the main table: each cell and evaluation at the cell's ε that an indicator of
    attack failure or a reference check touched, with what fired (evaluate.py's `indicators`)."""
    found, later, revisions = [], 0, {}
    for cell in report.cells:
        for evaluation in report.evaluations:
            held = cell.evaluation(evaluation.name)
            names = () if held is None else held.indicated.get(eps_key(cell.eps), ())
            if names:
                words = ", ".join(name.replace("_", " ") for name in names)
                found.append(f"- {cell.name}, {evaluation.label}: {words}")
            if held is not None and held.indicators_later:
                later += 1
                revisions.update(dict.fromkeys(held.indicators_later))
    lines = []
    if found:
        lines += [
            "",
            f"{readings.INDICATED_MARK} An indicator of attack failure (Pintor et al., 2022) or "
            "one of the reference AutoAttack's checks fired on these cells' evaluations at their ε "
            "(evaluate.py names each with what to do): their numbers may overestimate robustness.",
            "",
            *found,
        ]
    if later:
        lines += [
            "",
            f"The indicators of {later} of the cells' evaluations, or their zero-gradient check, "
            "were computed after the evaluation, from the committed weights on the same points "
            f"(`python -m fbat_tf.indicate`, revision {', '.join(r[:12] for r in revisions)}): "
            "those evaluations predate the indicators, or their check counted points the model "
            "gets wrong. The attacks' numbers are the evaluations' own.",
        ]
    return lines


def _unusable(cell: CellResult, name: str) -> list[str]:
    """Why numbers of the cell's evaluation `name` were left out, by ε."""
    evaluation = cell.evaluation(name)
    return [] if evaluation is None else list(evaluation.unusable.values())


def masking_lines(report: Report) -> list[str]:
    """Under the main table, where the definition has a masking check: its rule, then each
    cell and ε where it ran (AutoAttack → the checked accuracy), where it is pending, or that
    it triggered nowhere (with the largest gap seen)."""
    check = report.masking_check
    if check is None:
        return []
    lines = ["", masking.rule_words(check)]
    ran, pending, gaps = [], [], []
    for cell in report.cells:
        for eps, entry in (cell.masking_check or {}).items():
            if entry.gap is not None:
                gaps.append(entry.gap)
            if entry.state == "checked":
                ran.append(f"- {masking.footnote(cell, eps, entry)}")
            elif entry.state == "pending":
                pending.append(f"{cell.name} at ε = {eps:g} (gap {entry.gap:.1f} points)")
    if ran:
        lines += ["", *ran]
    if pending:
        lines += [
            "",
            f"Masking check triggered and not yet run (their AutoAttack numbers stand until "
            f"it does): {', '.join(pending)}.",
        ]
    if not ran and not pending:
        largest = f"; the largest gap is {max(gaps):.1f} points" if gaps else ""
        lines += ["", f"No cell's AutoAttack triggered the masking check{largest}."]
    return lines


def plot_lines(report: Report) -> list[str]:
    """Links to the report's plots, as write_report draws them beside sweep.md."""
    kinds = [k for k in PLOTTERS if k != "robust_vs_cost" or cost_rows(report)]
    return ["", "## Plots", "", *(f"- [{PLOTS[k]}]({PLOTS[k]})" for k in kinds)]


def markdown(report: Report) -> str:
    """The report's tables: one row per method variant and ε (mean ± std over seeds)."""
    evaluations = report.evaluations
    described = ", ".join(f"{e.label} on the first {e.examples} test images" for e in evaluations)
    lines = [
        f"# Sweep {report.sweep}",
        "",
        report.description,
        "",
        *readings.overridden(report),
        *code_lines(report),
        *([estimate.describe(report.estimate), ""] if report.estimate else []),
        f"Robust accuracy (%) at the training ε: {described}; clean accuracy on the first "
        f"{evaluations[0].examples}; mean ± sample std over seeds. CO: epochs where the "
        "catastrophic-overfitting guard fired. IG ratio: mean ‖c·g2‖/‖g1‖ over training; "
        "inactive: mean fraction of inactive constraints at δ* (Fast-BAT with its implicit "
        "term).",
        "",
        f"| method | {readings.eps_heading(report)} | seeds | clean | "
        + " | ".join(e.label for e in evaluations)
        + " | selected epoch | CO (epochs) | s/epoch | IG ratio | inactive |",
        "|---|---|---|---|" + "---|" * len(evaluations) + "---|---|---|---|---|",
    ]
    for (variant, eps), cells in readings.groups(report.cells).items():
        done = [c for c in cells if all(e.name in c.evaluations for e in evaluations)]
        trained = [c for c in cells if c.train is not None]
        selected = ", ".join(
            "diverged" if c.state == "diverged" else str(c.train.selected_epoch or "–")
            for c in trained
        )
        overfit = "; ".join(",".join(map(str, c.train.overfitting_epochs)) or "–" for c in trained)
        ratio = readings.trained(cells, lambda train: train.ig_norm_ratio)
        inactive = readings.trained(cells, lambda train: train.inactive_fraction)
        # Every figure is over the same cells, those with every evaluation: a cell between its
        # attacks (an interim report) joins the means when its last attack is in.
        robust = " | ".join(_robust_text(done, e.name) for e in evaluations)
        checked = any(readings.checked(done, report, e.name) for e in evaluations)
        label = readings.label(variant, cells) + tuned_note(report, variant, eps) + _dagger(cells)
        label += f" {masking.MARK}" if checked else ""
        label += f" {masking.MASKED_MARK}" if readings.masked(done) else ""
        label += f" {readings.INDICATED_MARK}" if readings.indicated(done) else ""
        clean = readings.percent(readings.clean(done, report))
        seconds = readings.number(readings.trained(cells, lambda train: train.seconds_per_epoch))
        lines.append(
            f"| {label} | {eps:g} | {len(done)}/{len(cells)} | "
            f"{clean} | {robust} | {selected or '–'} | "
            f"{overfit or '–'} | {seconds} | "
            f"{'–' if not ratio else f'{statistics.fmean(ratio):.2e}'} | "
            f"{'–' if not inactive else f'{100 * statistics.fmean(inactive):.0f}%'} |"
        )
    lines += masking_lines(report) + indicated_lines(report) + unusable_lines(report)
    for evaluation in evaluations:
        if evaluation.eps == "own":
            continue
        attacked_at = report.eps_values if evaluation.eps == "grid" else evaluation.eps
        lines += [
            "",
            f"## {evaluation.label} accuracy (%) across budgets",
            "",
            "Rows: the trained models (ε they were trained at); columns: the ε they are "
            "attacked at." + readings.l2_units(report),
            "",
            "| method | trained at | " + " | ".join(f"ε={e:g}" for e in attacked_at) + " |",
            "|---|---|" + "---|" * len(attacked_at),
        ]
        for (variant, eps), cells in readings.groups(report.cells).items():
            row = [
                readings.percent(readings.attacked(cells, evaluation.name, at))
                + readings.check_mark(cells, report, evaluation.name, at)
                for at in attacked_at
            ]
            lines.append(f"| {variant} | {eps:g} | " + " | ".join(row) + " |")
    tables = (tuning_table(report), criterion_table(report), cost_table(report))
    for section in (*tables, comparison_table(report)):
        if section:
            lines += ["", *section]
    if report.paper is not None:
        lines += ["", *paper_table(report)]
    lines += plot_lines(report)
    return "\n".join(lines) + "\n"


def unreadable_cells(report: Report) -> list[str]:
    """A warning for each cell whose results.json is there but does not read as a run's record
    (cut short, edited): the report leaves it out, and says so here, naming the file."""
    lines = []
    for cell in report.cells:
        path = os.path.join(cell.run_dir, RESULTS)
        if cell.train is None and os.path.exists(path):
            try:
                RunRecord.load(path)
            except ValueError as error:
                found = str(error).removesuffix(RESTORE)
                lines.append(
                    f"warning: the report leaves {cell.name} out: {found}; restore the file, "
                    f"or delete {cell.run_dir} and the sweep trains the cell again"
                )
    return lines


def write_report(report: Report, sweep_dir: str) -> dict[str, str]:
    """sweep.json, sweep.md and the plots in `sweep_dir`; returns their paths by kind."""
    os.makedirs(sweep_dir, exist_ok=True)
    payload = report.to_dict()
    if report.paper is not None:
        payload["paper_vs_measured"] = [row.to_dict() for row in paper_rows(report)]
    priced = {
        f"{eps:g}": [row.to_json() for row in rows] for eps, rows in cost_rows(report).items()
    }
    payload["robust_vs_cost"] = priced
    compared = family(report)
    payload["paired_comparisons"] = [pair.to_dict() for pair in compared.listed]
    # The family Holm's correction covers: the rows of paired_comparisons and the comparisons
    # with the most robust in robust_vs_cost, a pair in both once, those with a p-value.
    payload["paired_family"] = {
        "rows": ["paired_comparisons", "robust_vs_cost"],
        "size": compared.size,
        "correction": "holm",
    }
    text = json.dumps(records.finite_or_null(payload), indent=2, allow_nan=False)
    paths: dict[str, str] = {}
    paths["json"] = path = os.path.join(sweep_dir, "sweep.json")
    _write_text(path, text + "\n")
    paths["markdown"] = path = os.path.join(sweep_dir, "sweep.md")
    _write_text(path, markdown(report))
    plotters = dict(PLOTTERS)
    if not priced:
        del plotters["robust_vs_cost"]  # no run with a recorded step count
    for kind, plot in plotters.items():
        paths[kind] = path = os.path.join(sweep_dir, PLOTS[kind])
        try:
            plot(report, path)
        except OSError as error:
            raise OSError(error.errno, error.strerror, error.filename or path) from error
    return paths


def _write_text(path: str, text: str) -> None:
    """`text` at `path`, written whole or not at all, renamed into place and never through a
    link: no temporary file is left, and an OSError names `path` (a full disk's names no file)."""
    try:
        write_atomic(path, text)
    except LinkRefused:
        raise
    except OSError as error:
        raise OSError(error.errno, error.strerror, error.filename or path) from error
