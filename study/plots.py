"""A sweep's PNG plots: robustness against cost, against ε, clean against robust, validation
robust accuracy per epoch and seconds per epoch."""

from __future__ import annotations

import io
import math
import statistics
import textwrap
from typing import Any

from fbat_tf.records import CellResult
from fbat_tf.records.files import write_atomic
from study import readings
from study.cells import Report
from study.costs import cost_rows
from study.paper import measured_metric

PLOTS = {
    "robust_vs_cost": "robust_vs_cost.png",
    "robust_vs_eps": "robust_vs_eps.png",
    "clean_vs_robust": "clean_vs_robust.png",
    "val_robust_per_epoch": "val_robust_per_epoch.png",
    "seconds_per_epoch": "seconds_per_epoch.png",
}


def _legend(axes, **options) -> None:
    """A legend where the axes hold labelled lines (a sweep with no finished cell has none)."""
    if axes.get_legend_handles_labels()[0]:
        axes.legend(**options)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_robust_vs_cost(report: Report, path: str) -> None:
    """Per ε, each variant's robustness (the last evaluation, mean over seeds, with the range
    over seeds) against its training cost in passes, the Pareto front drawn; hollow: shown
    behind the most robust by the paired test, filled: not."""
    plt = _pyplot()
    rows_by_eps = cost_rows(report)
    panels = list(rows_by_eps) or [0.0]
    figure, grid = _panels(plt, len(panels))
    colours = _colours(report)
    name = report.evaluations[-1].name
    label = report.evaluations[-1].label
    groups = readings.groups(report.cells)
    for axes, eps in zip(grid.flat, panels, strict=False):
        rows = rows_by_eps.get(eps, [])
        for row in rows:
            colour = colours.get(row.key)
            behind = row.versus_best is not None and row.versus_best.verdict == "b"
            values = [100 * v for v in readings.attacked(groups[row.key, eps], name)]
            axes.vlines(row.passes, min(values), max(values), color=colour, linewidth=1)
            axes.scatter(
                row.passes,
                100 * row.robust,
                facecolors="none" if behind else colour,
                edgecolors=colour,
                s=28,
                label=row.variant,
                zorder=3,
            )
        front = [r for r in rows if r.pareto]
        if front:
            axes.step(
                [r.passes for r in front],
                [100 * r.robust for r in front],
                where="post",
                color="grey",
                linewidth=1,
                zorder=2,
            )
        axes.set_xscale("log")
        axes.set_title(f"ε = {readings.eps_text(report, eps)}", fontsize=9)
        axes.set_xlabel("training cost (passes through the model)")
        axes.set_ylabel(f"{label} (%)")
        axes.grid(alpha=0.3)
        _legend(axes, fontsize=5)
    _finish(
        figure,
        grid,
        len(panels),
        f"{report.sweep}: robustness against cost (bars: range over seeds; grey: Pareto "
        "front; hollow: behind the most robust, paired over seeds)",
        path,
    )


def plot_robust_vs_eps(report: Report, path: str) -> None:
    """Each evaluation's accuracy at the training ε (the last evaluation solid, the others
    dashed or dotted), one colour per variant."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    colours = _colours(report)
    by_variant: dict[str, dict[float, list[CellResult]]] = {}
    for (variant, eps), cells in readings.groups(report.cells).items():
        by_variant.setdefault(variant, {})[eps] = cells
    evaluations = report.evaluations
    styles = dict(
        zip((e.name for e in reversed(evaluations)), ("-", "--", ":", "-."), strict=False)
    )
    for variant, per_eps in by_variant.items():
        for evaluation in evaluations:
            metric, style = evaluation.name, styles.get(evaluation.name, ":")
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
                label=f"{variant} ({evaluation.label})",
            )
    heading = readings.eps_heading(report).replace("ε (/255)", "ε (1/255)")
    axes.set_xlabel(f"{heading}, trained and attacked at")
    axes.set_ylabel("robust accuracy (%)")
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    _legend(axes, fontsize=7, ncol=2)
    axes.set_title(f"{report.sweep}: robust accuracy against ε")
    _save(figure, path)


def plot_clean_vs_robust(report: Report, path: str) -> None:
    """One point per evaluated cell: the last evaluation's accuracy at the training ε (the
    strongest attack, where the definition lists it last) against clean accuracy, ε written."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 4.2))
    colours = _colours(report)
    labelled = set()
    last = report.evaluations[-1]
    for cell in report.cells:
        robust, clean = readings.attacked([cell], last.name), readings.clean([cell], report)
        if not robust or not clean:
            continue
        x, y = 100 * robust[0], 100 * clean[0]
        label = None if cell.variant in labelled else cell.variant
        labelled.add(cell.variant)
        axes.scatter(x, y, color=colours[cell.variant], label=label, s=18)
        axes.annotate(
            f"{cell.eps:g}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points"
        )
    axes.set_xlabel(f"{last.label} accuracy (%) at the training ε")
    axes.set_ylabel("clean accuracy (%)")
    axes.grid(alpha=0.3)
    _legend(axes, fontsize=7)
    labels = readings.eps_heading(report).replace("ε (/255)", "ε/255")
    axes.set_title(f"{report.sweep}: clean against robust (labels: {labels})")
    _save(figure, path)


def plot_val_robust_per_epoch(report: Report, path: str) -> None:
    """Validation PGD accuracy per epoch: one panel per ε, one line per cell, × where the
    catastrophic-overfitting guard fired; dotted in the same colour, the FGSM accuracy where
    the run logged it (far above the PGD line: the gradient-masking signature)."""
    plt = _pyplot()
    eps_values = sorted({c.eps for c in report.cells if c.train is not None})
    if not eps_values:
        eps_values = [0.0]
    figure, grid = _panels(plt, len(eps_values), sharey=True)
    colours = _colours(report)
    for axes, eps in zip(grid.flat, eps_values, strict=False):
        labelled = set()
        for cell in report.cells:
            train = cell.train
            if cell.eps != eps or train is None:
                continue
            robust = [math.nan if v is None else 100 * v for v in train.val_robust_accuracy]
            epochs = list(range(1, len(robust) + 1))
            label = None if cell.variant in labelled else cell.variant
            labelled.add(cell.variant)
            colour = colours[cell.variant]
            axes.plot(epochs, robust, marker=".", color=colour, label=label, linewidth=1)
            fgsm = train.val_fgsm_accuracy
            if any(v is not None for v in fgsm):
                fgsm = [math.nan if v is None else 100 * v for v in fgsm]
                axes.plot(epochs, fgsm, linestyle=":", color=colour, linewidth=1)
            for epoch in train.overfitting_epochs:
                axes.scatter(epoch, robust[epoch - 1], marker="x", color=colour, s=60, zorder=3)
        axes.set_title(f"ε = {readings.eps_text(report, eps)}", fontsize=9)
        axes.set_xlabel("epoch")
        axes.set_ylim(0, 100)
        axes.grid(alpha=0.3)
        _legend(axes, fontsize=6)
    for axes in grid[:, 0]:
        axes.set_ylabel("validation PGD accuracy (%)")
    _finish(
        figure,
        grid,
        len(eps_values),
        f"{report.sweep}: validation PGD accuracy per epoch (× guard fired; dotted: FGSM)",
        path,
    )


def plot_seconds_per_epoch(report: Report, path: str) -> None:
    """Mean seconds per epoch of each variant over its cells."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6.5, 3.6))
    colours = _colours(report)
    variants = list(colours)
    means = []
    for variant in variants:
        cells = [c for c in report.cells if c.variant == variant]
        values = readings.trained(cells, lambda train: train.seconds_per_epoch)
        means.append(statistics.fmean(values) if values else 0.0)
    axes.bar(range(len(variants)), means, color=[colours[v] for v in variants])
    axes.set_xticks(range(len(variants)), variants, rotation=20, ha="right", fontsize=7)
    axes.set_ylabel("seconds per epoch")
    axes.grid(alpha=0.3, axis="y")
    axes.set_title(f"{report.sweep}: training time per epoch")
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
    # Wrapped to the figure's width: a grid of one ε is one panel wide.
    figure.suptitle(textwrap.fill(title, width=max(24, int(figure.get_figwidth() * 9))))
    _save(figure, path)


def _colours(report: Report) -> dict[str, Any]:
    plt = _pyplot()
    variants = list(dict.fromkeys(c.variant for c in report.cells))
    cycle = plt.get_cmap("tab10")
    return {variant: cycle(i % 10) for i, variant in enumerate(variants)}


def _save(figure, path: str) -> None:
    figure.tight_layout()
    drawn = io.BytesIO()
    try:
        figure.savefig(drawn, format="png", dpi=120)
    finally:
        _pyplot().close(figure)
    # Renamed into place (several sweep.py processes may write at once), never through a link;
    # a full disk leaves no temporary file (records.files.write_atomic).
    write_atomic(path, drawn.getvalue())


# The plots by kind, each drawn by plotter(report, path) into PLOTS[kind] of the sweep folder.
PLOTTERS = {
    "robust_vs_cost": plot_robust_vs_cost,
    "robust_vs_eps": plot_robust_vs_eps,
    "clean_vs_robust": plot_clean_vs_robust,
    "val_robust_per_epoch": plot_val_robust_per_epoch,
    "seconds_per_epoch": plot_seconds_per_epoch,
}
