"""A sweep's report: sweep.json, the Markdown tables (sweep.md) and the PNG plots."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

from fbat_tf import catalog, run
from fbat_tf.sweeps import estimate, paired


def _groups(cells: Sequence[dict[str, Any]]) -> dict[tuple[str, float], list[dict[str, Any]]]:
    """Cells by (variant, ε), seeds together: the variants in grid order, each one's ε rising
    (a later grid entry may add budgets to a variant listed earlier)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["variant"], cell["eps"]), []).append(cell)
    order = list(dict.fromkeys(variant for variant, _ in groups))
    return dict(sorted(groups.items(), key=lambda item: (order.index(item[0][0]), item[0][1])))


def _values(cells: Sequence[dict[str, Any]], *path: str) -> list[float]:
    values = []
    for cell in cells:
        value: Any = cell
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            values.append(float(value))
    return values


def _label(variant: str, cells: Sequence[dict[str, Any]]) -> str:
    """The variant with the method's title, where its runs recorded one."""
    titles = list(dict.fromkeys(c["title"] for c in cells if c.get("title")))
    return f"{variant} ({', '.join(titles)})" if titles else variant


def _percent(values: Sequence[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{100 * values[0]:.1f}"
    return f"{100 * statistics.fmean(values):.1f} ± {100 * statistics.stdev(values):.1f}"


def _number(values: Sequence[float], digits: int = 1) -> str:
    return f"{statistics.fmean(values):.{digits}f}" if values else "–"


def _evaluations(report: dict[str, Any]) -> list[dict[str, Any]]:
    return report["evaluation"]["attacks"]


def _attacked(cells: Sequence[dict[str, Any]], name: str, eps: float | None = None) -> list[float]:
    """Robust accuracies of evaluation `name` at ε (default: each cell's own), as fractions."""
    values = []
    for cell in cells:
        key = f"{cell['eps'] if eps is None else eps:g}"
        value = cell.get(name, {}).get("robust_accuracy", {}).get(key)
        if value is not None:
            values.append(value)
    return values


def _clean(cells: Sequence[dict[str, Any]], report: dict[str, Any]) -> list[float]:
    """Clean accuracy from the cells' first evaluation (the one with the most examples when
    the definition says so first)."""
    first = _evaluations(report)[0]["name"]
    return _values(cells, first, "clean_accuracy")


def _overridden(report: dict[str, Any]) -> list[str]:
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


def _short(found: str | None) -> str:
    return "no git revision" if found is None else found[:12]


def code_lines(report: dict[str, Any]) -> list[str]:
    """Which code the numbers came from: one line when every cell ran one clean revision, else
    the revisions and the cells run from uncommitted code or from several revisions."""
    code = report.get("code") or {}
    revisions, dirty, mixed = (
        code.get("revisions", {}),
        code.get("dirty_cells"),
        code.get("mixed_cells"),
    )
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


def _dagger(cells: Sequence[dict[str, Any]]) -> str:
    return " †" if any(c.get("code", {}).get("dirty") for c in cells) else ""


def markdown(report: dict[str, Any]) -> str:
    """The report's tables: one row per method variant and ε (mean ± std over seeds)."""
    evaluations = _evaluations(report)
    described = ", ".join(
        f"{e['label']} on the first {e['examples']} test images" for e in evaluations
    )
    lines = [
        f"# Sweep {report['sweep']}",
        "",
        report["description"],
        "",
        *_overridden(report),
        *code_lines(report),
        *([estimate.describe(report["estimate"]), ""] if report.get("estimate") else []),
        f"Robust accuracy (%) at the training ε: {described}; clean accuracy on the first "
        f"{evaluations[0]['examples']}; mean ± sample std over seeds. CO: epochs where the "
        "catastrophic-overfitting guard fired. IG ratio: mean ‖c·g2‖/‖g1‖ over training; "
        "inactive: mean fraction of inactive constraints at δ* (Fast-BAT with its implicit "
        "term).",
        "",
        "| method | ε (/255) | seeds | clean | "
        + " | ".join(e["label"] for e in evaluations)
        + " | selected epoch | CO (epochs) | s/epoch | IG ratio | inactive |",
        "|---|---|---|---|" + "---|" * len(evaluations) + "---|---|---|---|---|",
    ]
    for (variant, eps), cells in _groups(report["cells"]).items():
        done = [c for c in cells if all(e["name"] in c for e in evaluations)]
        selected = ", ".join(
            "diverged" if c["state"] == "diverged" else str(c["train"]["selected_epoch"] or "–")
            for c in cells
            if "train" in c
        )
        overfit = "; ".join(
            ",".join(map(str, c["train"]["overfitting_epochs"])) or "–"
            for c in cells
            if "train" in c
        )
        ratio = _values(cells, "train", "ig_norm_ratio")
        inactive = _values(cells, "train", "inactive_fraction")
        robust = " | ".join(_percent(_attacked(cells, e["name"])) for e in evaluations)
        lines.append(
            f"| {_label(variant, cells)}{_dagger(cells)} | {eps:g} | {len(done)}/{len(cells)} | "
            f"{_percent(_clean(cells, report))} | {robust} | {selected or '–'} | "
            f"{overfit or '–'} | {_number(_values(cells, 'train', 'seconds_per_epoch'))} | "
            f"{'–' if not ratio else f'{statistics.fmean(ratio):.2e}'} | "
            f"{'–' if not inactive else f'{100 * statistics.fmean(inactive):.0f}%'} |"
        )
    eps_values = report["eps_values"]
    for evaluation in evaluations:
        if evaluation["eps"] == "own":
            continue
        attacked_at = eps_values if evaluation["eps"] == "grid" else evaluation["eps"]
        lines += [
            "",
            f"## {evaluation['label']} accuracy (%) across budgets",
            "",
            "Rows: the trained models (ε they were trained at); columns: the ε they are "
            "attacked at.",
            "",
            "| method | trained at | " + " | ".join(f"ε={e:g}" for e in attacked_at) + " |",
            "|---|---|" + "---|" * len(attacked_at),
        ]
        for (variant, eps), cells in _groups(report["cells"]).items():
            row = [_percent(_attacked(cells, evaluation["name"], at)) for at in attacked_at]
            lines.append(f"| {variant} | {eps:g} | " + " | ".join(row) + " |")
    for section in (cost_table(report), comparison_table(report)):
        if section:
            lines += ["", *section]
    if "paper" in report:
        lines += ["", *paper_table(report)]
    return "\n".join(lines) + "\n"


# Paired comparisons and robustness against cost -------------------------------------------------


def _by_seed(cells: Sequence[dict[str, Any]], name: str) -> dict[int, float]:
    """Robust accuracy of evaluation `name` at each cell's own ε, by seed."""
    values = {}
    for cell in cells:
        value = cell.get(name, {}).get("robust_accuracy", {}).get(f"{cell['eps']:g}")
        if value is not None:
            values[cell["seed"]] = value
    return values


def _pair_marks(a: Sequence[dict], b: Sequence[dict], seeds: Sequence[int]) -> list[str]:
    """What weakens a paired comparison: its cells ran different revisions or uncommitted code,
    or two runs of one seed started from different weights or data (their fingerprints)."""
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
    return marks


def comparison(report: dict[str, Any], eps: float, a: str, b: str) -> dict[str, Any] | None:
    """Variant `a` against `b` at ε, paired over seeds on the last evaluation (paired.compare),
    with its marks; None where either has no cell."""
    groups = _groups(report["cells"])
    cells_a, cells_b = groups.get((a, eps)), groups.get((b, eps))
    if not cells_a or not cells_b:
        return None
    evaluation = _evaluations(report)[-1]
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
        marks=_pair_marks(cells_a, cells_b, found["seeds"]),
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


def cell_passes(cell: dict[str, Any]) -> float | None:
    """Passes through the model of the run's optimizer steps (DESIGN.md §3.6)."""
    train = cell.get("train", {})
    steps, per_step = train.get("optimizer_steps"), train.get("passes")
    return None if not steps or not per_step else steps * catalog.total_passes(per_step)


def measured_time(report: dict[str, Any]) -> dict[str, Any] | None:
    """The cost bench's step times, where the definition names one, and whether they were
    measured under a load above the machine's cores (then no choice rests on them)."""
    cost = report.get("cost")
    if not cost:
        return None
    setting = cost.get("setting", {})
    load = setting.get("load_average_1min") or {}
    cores = (setting.get("machine") or {}).get("cpu_count")
    peak = max(load.values()) if load else None
    return {
        **cost,
        "load": peak,
        "cores": cores,
        "under_load": peak is not None and cores is not None and peak > cores,
    }


def cost_rows(report: dict[str, Any]) -> dict[float, list[dict[str, Any]]]:
    """Per ε, each variant: its runs' mean cost in passes, its passes per step, its
    robustness (the last evaluation, mean over seeds), whether it is on the Pareto front (no
    other is as cheap and as robust), its paired comparison with the most robust variant, and
    the measured time of its steps where a cost bench gives one."""
    name = _evaluations(report)[-1]["name"]
    timing = measured_time(report)
    per_eps: dict[float, list[dict[str, Any]]] = {}
    for (variant, eps), cells in _groups(report["cells"]).items():
        passes = [p for p in (cell_passes(cell) for cell in cells) if p is not None]
        robust = _attacked(cells, name)
        if not passes or not robust:
            continue
        row = {
            "variant": _label(variant, cells),
            "key": variant,
            "passes": statistics.fmean(passes),
            "passes_per_step": catalog.total_passes(cells[0]["train"]["passes"]),
            "robust": statistics.fmean(robust),
            "seeds": len(robust),
        }
        if timing:
            step = timing["step_seconds"].get(cells[0]["train"].get("cost_variant"))
            steps = [c["train"]["optimizer_steps"] for c in cells if "train" in c]
            rounds = timing["round_step_seconds"].get(cells[0]["train"].get("cost_variant"))
            if step is not None:
                row["seconds"] = step * statistics.fmean(steps)
                row["seconds_rounds"] = [r * statistics.fmean(steps) for r in rounds or []]
        per_eps.setdefault(eps, []).append(row)
    for eps, rows in per_eps.items():
        best = max(rows, key=lambda row: row["robust"])
        for row in rows:
            row["pareto"] = not any(
                other["passes"] <= row["passes"]
                and other["robust"] >= row["robust"]
                and (other["passes"], other["robust"]) != (row["passes"], row["robust"])
                for other in rows
            )
            row["most_robust"] = row is best
            row["versus_best"] = (
                None if row is best else comparison(report, eps, row["key"], best["key"])
            )
        rows.sort(key=lambda row: row["passes"])
    return dict(sorted(per_eps.items()))


def cheapest_equivalent(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The cheapest variant (in passes) that is the most robust or shown equivalent to it."""
    return min(
        (r for r in rows if r["most_robust"] or r["versus_best"]["verdict"] == "equivalent"),
        key=lambda r: r["passes"],
    )


def _interval(found: dict[str, Any] | None) -> str:
    if not found or found["interval"] is None:
        return "–" if not found or found["mean"] is None else f"{found['mean']:+.1f} (one seed)"
    low, high = found["interval"]
    return f"{found['mean']:+.1f} [{low:+.1f}, {high:+.1f}]"


def _margin_words(report: dict[str, Any]) -> str:
    return f"±{report.get('margin', paired.MARGIN):g} point"


def cost_table(report: dict[str, Any]) -> list[str]:
    """The robustness-against-cost section, or nothing where no run recorded its steps."""
    rows_by_eps = cost_rows(report)
    if not rows_by_eps:
        return []
    evaluation = _evaluations(report)[-1]
    timing = measured_time(report)
    lines = [
        f"## Robustness against cost ({evaluation['label']})",
        "",
        "Cost: each run's optimizer steps × its method's passes through the model per step "
        "(forward, backward and second-order passes, DESIGN.md §3.6), which no machine load "
        "moves. Against the most robust variant at each ε: the paired difference of robust "
        "accuracy over seeds (points, 95 % interval) and its verdict (equivalent: within "
        f"{_margin_words(report)} by two one-sided tests; one seed decides nothing). Pareto: no "
        "other variant is both as cheap and as robust.",
    ]
    columns = "| ε (/255) | method | passes/step | run (k passes) | robust (%) | seeds | "
    columns += "vs the most robust | verdict | Pareto |"
    rule = "|---|---|---|---|---|---|---|---|---|"
    if timing:
        setting = timing.get("setting", {})
        rounds = len(next(iter(timing["round_step_seconds"].values())))
        load = "unrecorded" if timing["load"] is None else f"up to {timing['load']:.1f}"
        lines[-1] += (
            f" Time, second: each run's optimizer steps × its method's step time measured side "
            f"by side in `{timing['source']}` ({setting.get('model')}, width "
            f"{setting.get('width')}, batch {setting.get('batch_size')}, {setting.get('device')}"
            f"; median and range over {rounds} rounds; load average {load} on "
            f"{timing['cores']} cores)."
        )
        if timing["under_load"]:
            lines[-1] += " **Measured under a load above the cores: indicative only.**"
        columns += " time (s) |"
        rule += "---|"
    lines += ["", columns, rule]
    for eps, rows in rows_by_eps.items():
        for row in rows:
            versus = row["versus_best"]
            says = "most robust" if versus is None else versus["says"]
            if versus and versus["marks"]:
                says += f" ({', '.join(versus['marks'])})"
            line = (
                f"| {eps:g} | {row['variant']} | {row['passes_per_step']} | "
                f"{row['passes'] / 1000:.1f} | {100 * row['robust']:.1f} | {row['seeds']} | "
                f"{_interval(versus)} | {says} | {'yes' if row['pareto'] else ''} |"
            )
            if timing:
                spread = row.get("seconds_rounds") or []
                time = "–" if "seconds" not in row else f"{row['seconds']:.0f}"
                if len(spread) > 1:
                    time += f" ({min(spread):.0f}–{max(spread):.0f})"
                line += f" {time} |"
            lines.append(line)
    lines += [
        "",
        "The cheapest method (in passes) that is the most robust or shown equivalent to it, at "
        "each ε; cheaper methods the seeds cannot tell from it are named as undecided:",
        "",
    ]
    for eps, rows in rows_by_eps.items():
        best = next(r for r in rows if r["most_robust"])
        cheap = cheapest_equivalent(rows)
        undecided = [
            r["variant"]
            for r in rows
            if r["passes"] < cheap["passes"] and r["versus_best"]["verdict"] == "undecided"
        ]
        line = (
            f"- ε = {eps:g}: {cheap['variant']} ({100 * cheap['robust']:.1f}%, "
            f"{cheap['passes'] / 1000:.1f}k passes); most robust {best['variant']} "
            f"({100 * best['robust']:.1f}%, {best['passes'] / 1000:.1f}k passes)"
        )
        if undecided:
            line += f"; undecided: {', '.join(undecided)}"
        lines.append(line)
    return lines


def comparison_table(report: dict[str, Any]) -> list[str]:
    """The definition's comparisons, paired over seeds."""
    found = listed_comparisons(report)
    if not found:
        return []
    lines = [
        f"## Paired comparisons ({_evaluations(report)[-1]['label']})",
        "",
        "A − B: the mean over seeds of the paired difference of robust accuracy (points), with "
        "its 95 % interval; verdict: A or B ahead where the interval excludes 0, equivalent "
        f"within {_margin_words(report)} by two one-sided tests at 5 %, else undecided; one "
        "seed decides nothing, and the spread of the differences is taken as at least one step "
        "of the accuracy (100/test points; sweeps/paired.py).",
        "",
        "| ε (/255) | A | B | seeds | A − B [95 % interval] | verdict | marks |",
        "|---|---|---|---|---|---|---|",
    ]
    for pair in found:
        lines.append(
            f"| {pair['eps']:g} | {pair['a']} | {pair['b']} | {len(pair['seeds'])} | "
            f"{_interval(pair)} | {pair['says']} | {', '.join(pair['marks']) or '–'} |"
        )
    return lines


PAPER_METRICS = (("clean", "clean"), ("pgd", "PGD"), ("autoattack", "AA"))


def measured_metric(
    cells: Sequence[dict[str, Any]],
    metric: str,
    report: dict[str, Any],
    attacked_eps: float | None = None,
) -> list[float]:
    """The cells' values of a paper metric, in percent (seconds for seconds_per_epoch): clean,
    seconds_per_epoch, or the name of an evaluation, at each cell's ε or at `attacked_eps`."""
    if metric == "clean":
        return [100 * v for v in _clean(cells, report)]
    if metric == "seconds_per_epoch":
        return _values(cells, "train", "seconds_per_epoch")
    if any(e["name"] == metric for e in _evaluations(report)):
        return [100 * v for v in _attacked(cells, metric, attacked_eps)]
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


def matching_cells(report: dict[str, Any], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells a published row speaks of: its method and training ε, and the row's setting
    (its flags over the paper's defaults) equal to the cell's (its flags over the same
    defaults, which are train.py's): Fast-BAT cells at 1/λ = 2000 are not the paper's 2500."""
    paper = report["paper"]
    matched = []
    for cell in report["cells"]:
        if cell["method"] != entry["method"] or not _same(cell["eps"], float(entry["eps"])):
            continue
        defaults = _defaults(paper, cell["eps"])
        setting = {**defaults, **entry.get("flags", {})}
        flags = {**defaults, **cell.get("flags", {})}
        if all(key in flags and _same(flags[key], value) for key, value in setting.items()):
            matched.append(cell)
    return matched


def _of_setting(report: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Whether the sweep runs the row's setting: every flag the row names is set to the row's
    value by some cell (a CIFAR-10 sweep lists no CIFAR-100 row; a row whose method the grid
    lacks shows "not run")."""
    cells = report["cells"]
    # A null flag is a setting the paper leaves unknown (Table 8's c): no cell can be it.
    return all(
        value is not None and any(_same(cell.get("flags", {}).get(key), value) for cell in cells)
        for key, value in entry.get("flags", {}).items()
    )


def _in_stds(difference: float | None, *stds: float | None) -> float | None:
    """The difference in units of the larger std (None without a std)."""
    larger = max((s for s in stds if s), default=None)
    return None if difference is None or not larger else difference / larger


def paper_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Paper against measured, per published number, beside the cells of its setting."""
    rows = []
    for entry in report["paper"]["rows"]:
        if entry.get("implemented", True) is False or not _of_setting(report, entry):
            continue
        cells = matching_cells(report, entry)
        for metric, _ in (*PAPER_METRICS, ("seconds_per_epoch", "s/epoch")):
            if metric not in entry:
                continue
            mean, std = entry[metric]
            measured = measured_metric(cells, metric, report, entry.get("attacked_eps"))
            value = statistics.fmean(measured) if measured else None
            spread = statistics.stdev(measured) if len(measured) > 1 else None
            difference = None if value is None else value - mean
            rows.append(
                {
                    "table": entry["table"],
                    "method": entry["method"],
                    "eps": entry["eps"],
                    "attacked_eps": entry.get("attacked_eps", entry["eps"]),
                    "metric": metric,
                    "paper_mean": mean,
                    "paper_std": std,
                    "measured_mean": value,
                    "measured_std": spread,
                    # The runs that gave a number, of the cells of the setting.
                    "measured_runs": [
                        c["run_dir"]
                        for c in cells
                        if measured_metric([c], metric, report, entry.get("attacked_eps"))
                    ],
                    "setting_runs": len(cells),
                    "difference": difference,
                    "difference_in_std": _in_stds(difference, std, spread),
                    "flags": entry.get("flags", {}),
                }
            )
    return rows


def paper_table(report: dict[str, Any]) -> list[str]:
    lines = [
        f"## Paper against measured ({report['paper'].get('source', 'paper')})",
        "",
        *_overridden(report),
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
        paper = f"{row['paper_mean']:.2f}" + (
            f" ± {row['paper_std']:.2f}" if row["paper_std"] is not None else ""
        )
        stds = "–"
        if row["measured_mean"] is None:
            measured = difference = "not run"
        else:
            measured = f"{row['measured_mean']:.2f}" + (
                f" ± {row['measured_std']:.2f}" if row["measured_std"] is not None else ""
            )
            measured += f" (n = {len(row['measured_runs'])} of {row['setting_runs']})"
            difference = f"{row['difference']:+.2f}"
            if row["difference_in_std"] is not None:
                stds = f"{row['difference_in_std']:+.1f}"
        setting = " ".join(
            f"{k}={v}" for k, v in row["flags"].items() if k not in ("dataset", "model")
        )
        lines.append(
            f"| {row['table']} | {row['method']} | {setting or '–'} | {row['eps']:g} | "
            f"{row['attacked_eps']:g} | {row['metric']} | {paper} | {measured} | {difference} | "
            f"{stds} |"
        )
    return lines


# Plots ------------------------------------------------------------------------------------------

PLOTS = {
    "robust_vs_cost": "robust_vs_cost.png",
    "robust_vs_eps": "robust_vs_eps.png",
    "clean_vs_robust": "clean_vs_robust.png",
    "val_robust_per_epoch": "val_robust_per_epoch.png",
    "seconds_per_epoch": "seconds_per_epoch.png",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_robust_vs_cost(report: dict[str, Any], path: str) -> None:
    """Per ε, each variant's robustness (the last evaluation, mean over seeds, with the range
    over seeds) against its training cost in passes, the Pareto front drawn; hollow: shown
    behind the most robust by the paired test, filled: not."""
    plt = _pyplot()
    rows_by_eps = cost_rows(report)
    panels = list(rows_by_eps) or [0.0]
    figure, grid = _panels(plt, len(panels))
    colours = _colours(report)
    name = _evaluations(report)[-1]["name"]
    label = _evaluations(report)[-1]["label"]
    groups = _groups(report["cells"])
    for axes, eps in zip(grid.flat, panels, strict=False):
        rows = rows_by_eps.get(eps, [])
        for row in rows:
            colour = colours.get(row["key"])
            behind = row["versus_best"] is not None and row["versus_best"]["verdict"] == "b"
            values = [100 * v for v in _attacked(groups[row["key"], eps], name)]
            axes.vlines(row["passes"], min(values), max(values), color=colour, linewidth=1)
            axes.scatter(
                row["passes"],
                100 * row["robust"],
                facecolors="none" if behind else colour,
                edgecolors=colour,
                s=28,
                label=row["variant"],
                zorder=3,
            )
        front = [r for r in rows if r["pareto"]]
        if front:
            axes.step(
                [r["passes"] for r in front],
                [100 * r["robust"] for r in front],
                where="post",
                color="grey",
                linewidth=1,
                zorder=2,
            )
        axes.set_xscale("log")
        axes.set_title(f"ε = {eps:g}/255", fontsize=9)
        axes.set_xlabel("training cost (passes through the model)")
        axes.set_ylabel(f"{label} (%)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=5)
    _finish(
        figure,
        grid,
        len(panels),
        f"{report['sweep']}: robustness against cost (bars: range over seeds; grey: Pareto "
        "front; hollow: behind the most robust, paired over seeds)",
        path,
    )


def plot_robust_vs_eps(report: dict[str, Any], path: str) -> None:
    """Each evaluation's accuracy at the training ε (the last evaluation solid, the others
    dashed or dotted), one colour per variant."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    colours = _colours(report)
    by_variant: dict[str, dict[float, list[dict]]] = {}
    for (variant, eps), cells in _groups(report["cells"]).items():
        by_variant.setdefault(variant, {})[eps] = cells
    evaluations = _evaluations(report)
    styles = dict(
        zip((e["name"] for e in reversed(evaluations)), ("-", "--", ":", "-."), strict=False)
    )
    for variant, per_eps in by_variant.items():
        for evaluation in evaluations:
            metric, style = evaluation["name"], styles.get(evaluation["name"], ":")
            points = [
                (eps, measured_metric(cells, metric, report))
                for eps, cells in sorted(per_eps.items())
            ]
            points = [(eps, values) for eps, values in points if values]
            if not points:
                continue
            eps, values = zip(*points, strict=True)
            means = [statistics.fmean(v) for v in values]
            spread = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            axes.errorbar(
                eps,
                means,
                yerr=spread,
                linestyle=style,
                marker="o",
                markersize=4,
                capsize=2,
                color=colours[variant],
                label=f"{variant} ({evaluation['label']})",
            )
    axes.set_xlabel("ε (1/255), trained and attacked at")
    axes.set_ylabel("robust accuracy (%)")
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    axes.set_title(f"{report['sweep']}: robust accuracy against ε")
    _save(figure, path)


def plot_clean_vs_robust(report: dict[str, Any], path: str) -> None:
    """One point per evaluated cell: the last evaluation's accuracy at the training ε (the
    strongest attack, where the definition lists it last) against clean accuracy, ε written."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    colours = _colours(report)
    labelled = set()
    evaluations = _evaluations(report)
    last = evaluations[-1]
    for cell in report["cells"]:
        robust, clean = _attacked([cell], last["name"]), _clean([cell], report)
        if not robust or not clean:
            continue
        x, y = 100 * robust[0], 100 * clean[0]
        label = None if cell["variant"] in labelled else cell["variant"]
        labelled.add(cell["variant"])
        axes.scatter(x, y, color=colours[cell["variant"]], label=label, s=18)
        axes.annotate(
            f"{cell['eps']:g}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points"
        )
    axes.set_xlabel(f"{last['label']} accuracy (%) at the training ε")
    axes.set_ylabel("clean accuracy (%)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    axes.set_title(f"{report['sweep']}: clean against robust (labels: ε/255)")
    _save(figure, path)


def plot_val_robust_per_epoch(report: dict[str, Any], path: str) -> None:
    """Validation PGD accuracy per epoch: one panel per ε, one line per cell, × where the
    catastrophic-overfitting guard fired; dotted in the same colour, the FGSM accuracy where
    the run logged it (far above the PGD line: the gradient-masking signature)."""
    plt = _pyplot()
    eps_values = sorted({c["eps"] for c in report["cells"] if "train" in c})
    if not eps_values:
        eps_values = [0.0]
    figure, grid = _panels(plt, len(eps_values), sharey=True)
    colours = _colours(report)
    for axes, eps in zip(grid.flat, eps_values, strict=False):
        labelled = set()
        for cell in report["cells"]:
            if cell["eps"] != eps or "train" not in cell:
                continue
            robust = [
                math.nan if v is None else 100 * v for v in cell["train"]["val_robust_accuracy"]
            ]
            epochs = list(range(1, len(robust) + 1))
            label = None if cell["variant"] in labelled else cell["variant"]
            labelled.add(cell["variant"])
            colour = colours[cell["variant"]]
            axes.plot(epochs, robust, marker=".", color=colour, label=label, linewidth=1)
            fgsm = cell["train"].get("val_fgsm_accuracy", [])
            if any(v is not None for v in fgsm):
                fgsm = [math.nan if v is None else 100 * v for v in fgsm]
                axes.plot(epochs, fgsm, linestyle=":", color=colour, linewidth=1)
            for epoch in cell["train"]["overfitting_epochs"]:
                axes.scatter(epoch, robust[epoch - 1], marker="x", color=colour, s=60, zorder=3)
        axes.set_title(f"ε = {eps:g}/255", fontsize=9)
        axes.set_xlabel("epoch")
        axes.set_ylim(0, 100)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=6)
    for axes in grid[:, 0]:
        axes.set_ylabel("validation PGD accuracy (%)")
    _finish(
        figure,
        grid,
        len(eps_values),
        f"{report['sweep']}: validation PGD accuracy per epoch (× guard fired; dotted: FGSM)",
        path,
    )


def plot_seconds_per_epoch(report: dict[str, Any], path: str) -> None:
    """Mean seconds per epoch of each variant over its cells."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 3.6))
    colours = _colours(report)
    variants = list(colours)
    means = []
    for variant in variants:
        cells = [c for c in report["cells"] if c["variant"] == variant]
        values = _values(cells, "train", "seconds_per_epoch")
        means.append(statistics.fmean(values) if values else 0.0)
    axes.bar(range(len(variants)), means, color=[colours[v] for v in variants])
    axes.set_xticks(range(len(variants)), variants, rotation=20, ha="right", fontsize=7)
    axes.set_ylabel("seconds per epoch")
    axes.grid(alpha=0.3, axis="y")
    axes.set_title(f"{report['sweep']}: training time per epoch")
    _save(figure, path)


def _panels(plt, count: int, sharey: bool = False):
    """A figure with one panel per ε, three to a row."""
    columns = min(count, 3)
    rows = math.ceil(count / columns)
    return plt.subplots(
        rows, columns, figsize=(4.3 * columns, 3.3 * rows), squeeze=False, sharey=sharey
    )


def _finish(figure, grid, used: int, title: str, path: str) -> None:
    for axes in list(grid.flat)[used:]:
        axes.set_visible(False)
    figure.suptitle(title)
    _save(figure, path)


def _colours(report: dict[str, Any]) -> dict[str, Any]:
    plt = _pyplot()
    variants = list(dict.fromkeys(c["variant"] for c in report["cells"]))
    cycle = plt.get_cmap("tab10")
    return {variant: cycle(i % 10) for i, variant in enumerate(variants)}


def _save(figure, path: str) -> None:
    figure.tight_layout()
    tmp = f"{path}.{os.getpid()}.tmp.png"  # several sweep.py processes may write at once
    figure.savefig(tmp, dpi=120)
    _pyplot().close(figure)
    os.replace(tmp, path)


def write_report(report: dict[str, Any], sweep_dir: str) -> dict[str, str]:
    """sweep.json, sweep.md and the plots in `sweep_dir`; returns their paths by kind."""
    os.makedirs(sweep_dir, exist_ok=True)
    paths = {"json": os.path.join(sweep_dir, "sweep.json")}
    payload = dict(report)
    if "paper" in report:
        payload["paper_vs_measured"] = paper_rows(report)
    payload["robust_vs_cost"] = {f"{eps:g}": rows for eps, rows in cost_rows(report).items()}
    payload["paired_comparisons"] = listed_comparisons(report)
    text = json.dumps(run.finite_or_null(payload), indent=2, allow_nan=False)
    _write_text(paths["json"], text + "\n")
    paths["markdown"] = os.path.join(sweep_dir, "sweep.md")
    _write_text(paths["markdown"], markdown(report))
    plotters = {
        "robust_vs_cost": plot_robust_vs_cost,
        "robust_vs_eps": plot_robust_vs_eps,
        "clean_vs_robust": plot_clean_vs_robust,
        "val_robust_per_epoch": plot_val_robust_per_epoch,
        "seconds_per_epoch": plot_seconds_per_epoch,
    }
    if not payload["robust_vs_cost"]:
        del plotters["robust_vs_cost"]  # no run with a recorded step count
    for kind, plot in plotters.items():
        paths[kind] = os.path.join(sweep_dir, PLOTS[kind])
        plot(report, paths[kind])
    return paths


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
