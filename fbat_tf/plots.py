"""Figures of an evaluation."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from fbat_tf.records.files import write_atomic


def plot_robustness(result: Any, path: str, labels: Mapping[str, str]) -> None:
    """Robust accuracy against ε, one line per attack, the clean accuracy at ε = 0 (`result`
    an EvaluationResult)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves: dict[str, list[tuple[float, float]]] = {}
    for attacked in result.robust:
        if attacked.robust_accuracy is None:  # not applicable (the model has no gradients)
            continue
        start = [(0.0, result.clean_accuracy)]
        curves.setdefault(attacked.attack, start).append((attacked.eps, attacked.robust_accuracy))
    figure, axes = plt.subplots(figsize=(5, 3.5))
    for name, points in curves.items():
        eps, accuracy = zip(*sorted(points), strict=True)
        axes.plot(eps, [100 * a for a in accuracy], marker="o", label=labels.get(name, name))
    axes.set_xlabel("ε (1/255)")
    axes.set_ylabel("accuracy (%)")
    axes.set_ylim(0, 100)
    axes.grid(alpha=0.3)
    axes.legend()
    axes.set_title(f"{result.dataset or ''}: first {result.examples} examples")
    figure.tight_layout()
    drawn = io.BytesIO()
    figure.savefig(drawn, format="png", dpi=120)
    plt.close(figure)
    write_atomic(path, drawn.getvalue())  # never through a link at `path`
