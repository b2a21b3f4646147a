"""A sweep's GPU time, estimated before it runs from measured anchors in its definition.

    "estimate": {"anchor": "the paper's Table 1: RTX 3090 seconds per epoch, ...",
                 "seconds_per_epoch": {"fastat": 23.1, "cifar100/fastbat": 63.0, ...},
                 "seconds_per_pass": 0.00026,        # or {"tiny_imagenet": 0.001, ...}
                 "robust_fraction": 0.5,
                 "validation_examples": {"cifar10": 5000, ...}}  # where val_examples is 0

Training: each cell's epochs × (the anchor's seconds per epoch for its method, looked up as
"<dataset>/<model>/<method>", "<dataset>/<method>", "<model>/<method>", then "<method>", plus
the epoch's robust validation: its examples × PGD's passes, FGSM's and the clean one × the
seconds of a pass).
Evaluation: each evaluation's examples × budgets × the attack's forward-backward passes per
example at most (the registry's `passes`, with `robust_fraction` of the examples still robust
when an ensemble's later parts run) × the seconds of one pass. Both are estimates, and say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fbat_tf import attacks
from fbat_tf.sweeps.definition import Cell, Definition, expand


def _lookup(table: Mapping[str, float] | float | None, cell: Cell) -> float | None:
    if table is None or isinstance(table, (int, float)):
        return table
    dataset, model = cell.flags.get("dataset"), cell.flags.get("model")
    for key in (
        f"{dataset}/{model}/{cell.method}",
        f"{dataset}/{cell.method}",
        f"{model}/{cell.method}",
        cell.method,
        f"{dataset}/{model}",
        str(dataset),
        str(model),
    ):
        if key in table:
            return float(table[key])
    return None


# train.py's defaults for the robust validation of every epoch (flags/train.py).
VALIDATION_DEFAULTS = {"val_examples": 1000, "val_attack_steps": 10, "val_restarts": 1}


def _validation_seconds(spec: Mapping[str, Any], cell: Cell) -> float:
    """One epoch's validation: its examples × (PGD's steps × restarts, FGSM's pass and the
    clean one) × the seconds of a pass. A cell validating on the whole split (0) takes the
    split's size from the anchors' "validation_examples" (by dataset)."""
    per_pass = _lookup(spec.get("seconds_per_pass"), cell)
    if per_pass is None:
        return 0.0
    flags = {**VALIDATION_DEFAULTS, **cell.flags}
    examples = int(flags["val_examples"]) or _lookup(spec.get("validation_examples"), cell)
    if not examples:
        return 0.0
    passes = int(flags["val_attack_steps"]) * int(flags["val_restarts"]) + 2
    return examples * passes * per_pass


def estimate(definition: Definition) -> dict[str, Any] | None:
    """Hours of GPU time for training and for each evaluation, or None without anchors."""
    spec = definition.estimate
    if not spec:
        return None
    robust = float(spec.get("robust_fraction", 0.5))
    cells = expand(definition)
    training, unanchored = 0.0, []
    for cell in cells:
        seconds = _lookup(spec["seconds_per_epoch"], cell)
        if seconds is None or "epochs" not in cell.flags:
            unanchored.append(cell.name)
            continue
        training += int(cell.flags["epochs"]) * (seconds + _validation_seconds(spec, cell))
    evaluation = {}
    for ev in definition.evaluations:
        passes = attacks.passes(ev.attack, ev.options, robust)
        if passes is None:
            continue
        seconds = 0.0
        for cell in cells:
            per_pass = _lookup(spec.get("seconds_per_pass"), cell)
            if per_pass is None:
                unanchored.append(f"{cell.name} ({ev.name})")
                continue
            seconds += ev.examples * len(ev.budgets(definition, cell)) * passes * per_pass
        evaluation[ev.label] = seconds / 3600
    hours = training / 3600
    return {
        "anchor": spec["anchor"],
        "training_hours": hours,
        "evaluation_hours": evaluation,
        "total_hours": hours + sum(evaluation.values()),
        "not_estimated": unanchored,
    }


def describe(found: dict[str, Any]) -> str:
    """One paragraph for a dry run and the report."""
    parts = ", ".join(
        f"{label} {hours:.1f} h" for label, hours in found["evaluation_hours"].items()
    )
    text = (
        f"Estimated GPU time (an estimate from {found['anchor']}, not a measurement): "
        f"training {found['training_hours']:.1f} h, evaluation {parts or 'not estimated'}; "
        f"about {found['total_hours']:.0f} h in all."
    )
    if found["not_estimated"]:
        text += f" Without an anchor, not counted: {', '.join(found['not_estimated'][:5])}."
    return text
