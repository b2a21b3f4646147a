"""The signature of catastrophic overfitting on a sweep's trained models: accuracy under FGSM
(one signed step of size ε from x) against accuracy under the validation PGD, per cell.

    python bench/records/overfitting_signature.py --sweep_dir=study/results/fashion_mnist \\
        --json=bench/results/overfitting_signature.json

A model that has overfitted catastrophically masks its gradient: the single-step attack that
trained it no longer finds the adversarial examples that a multi-step attack still finds, so
FGSM accuracy stays high while PGD accuracy is near zero (Wong et al. 2020; Andriushchenko and
Flammarion 2020). For every cell of the sweep that holds its selected weights, this evaluates
them on the cell's own validation images at the cell's ε with its validation PGD (steps,
restarts and seed from its saved config) and with FGSM, and prints the gap FGSM − PGD beside
the cell's test AutoAttack accuracy. The overfitting guard's gap threshold is chosen from it.
"""

from __future__ import annotations

import glob
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from harness import command_line, machine, publish  # noqa: E402

from fbat_tf.records import EvaluationResult  # noqa: E402

_SWEEP_DIR = flags.DEFINE_string(
    "sweep_dir",
    "study/results/fashion_mnist",
    "A sweep's results folder (one run directory per cell).",
)
_JSON = flags.DEFINE_string(
    "json", "bench/results/overfitting_signature.json", "Where to write the measurements."
)
_MARKDOWN = flags.DEFINE_string(
    "markdown", None, "Where to write the Markdown table (default: beside --json, .md)."
)


def measure(cell_dir: str) -> dict | None:
    from fbat_tf import classifiers, data, evaluation
    from fbat_tf.attacks.pgd import PGD
    from fbat_tf.run import Run

    run = Run(cell_dir)
    if not run.has_best_weights():
        return None
    classifier, config = classifiers.load_classifier(cell_dir)
    if config.method == "standard":
        return None  # not adversarially trained: nothing to overfit to
    eps = config.eps
    validation = data.load(
        config.dataset,
        "validation",
        data_dir=config.data_dir,
        batch_size=config.batch_size,
        max_examples=config.val_examples or None,
        download=False,
    )
    attacks = {
        ("fgsm", eps): PGD(eps, steps=1, restarts=1, step_size=eps, random_start=False),
        ("pgd", eps): PGD(eps, config.val_attack_steps, config.val_restarts),
    }
    result = evaluation.evaluate(
        classifiers.InferenceGraph(classifier), validation, attacks, seed=config.seed
    )
    tested = EvaluationResult.read(run.eval_path("autoattack"))
    autoattack = tested.robust_accuracy("autoattack") if tested else None
    fgsm, pgd = result.robust_accuracy("fgsm"), result.robust_accuracy("pgd")
    return {
        "cell": os.path.basename(cell_dir.rstrip("/")),
        "method": config.method,
        "eps_255": round(eps * 255, 3),
        "examples": result.examples,
        "clean": result.clean_accuracy,
        "fgsm": fgsm,
        "pgd": pgd,
        "gap": fgsm - pgd,
        "test_autoattack": autoattack,
    }


def main(argv: list[str]) -> None:
    del argv
    rows = []
    for cell_dir in sorted(glob.glob(os.path.join(_SWEEP_DIR.value, "*", ""))):
        row = measure(cell_dir)
        if row is not None:
            rows.append(row)
            print(
                f"{row['cell']:<34} clean {row['clean']:.3f} FGSM {row['fgsm']:.3f} "
                f"PGD {row['pgd']:.3f} gap {row['gap']:+.3f}",
                flush=True,
            )
    rows.sort(key=lambda r: (r["method"], r["eps_255"], r["cell"]))
    report = {
        "command": command_line(),
        "machine": machine(),
        "sweep_dir": _SWEEP_DIR.value,
        "cells": rows,
    }
    lines = [
        f"`{report['command']}`: the selected model of each cell on its validation images at "
        "its ε: clean, FGSM (one step of ε from x) and validation-PGD accuracy (%), the gap "
        "FGSM − PGD in points, and the cell's test AutoAttack accuracy.",
        "",
        "| cell | clean | FGSM | PGD | gap | test AA |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        aa = "–" if row["test_autoattack"] is None else f"{100 * row['test_autoattack']:.1f}"
        lines.append(
            f"| {row['cell']} | {100 * row['clean']:.1f} | {100 * row['fgsm']:.1f} | "
            f"{100 * row['pgd']:.1f} | {100 * row['gap']:+.1f} | {aa} |"
        )
    markdown = _MARKDOWN.value or os.path.splitext(_JSON.value)[0] + ".md"
    publish("\n".join(lines), report, _JSON.value, markdown_path=markdown)


if __name__ == "__main__":
    app.run(main)
