"""A sweep's GPU time, estimated before it runs from measured anchors in its definition.

    "estimate": {"anchor": "the paper's Table 1: RTX 3090 seconds per epoch, ...",
                 "seconds_per_epoch": {"fastat": 23.1, "cifar100/fastbat": 63.0, ...},
                 "seconds_per_pass": 0.00026,        # or {"tiny_imagenet": 0.001, ...}
                 "robust_fraction": 0.5,
                 "validation_examples": {"cifar10": 5000, ...},  # where val_examples is 0
                 "test_examples": {"cifar10": 10000, ...}}       # caps an evaluation's examples

Every part of a cell is a term of its own:
- the tuning runs (fbat_tf/sweeps/tuning.py): their training and validation, as below;
- training: epochs × the anchor's seconds per epoch for the cell's method, looked up as
  "<dataset>/<model>/<method>", "<dataset>/<method>", "<model>/<method>", then "<method>";
- validation: epochs × the epoch's robust validation, its examples × (PGD's steps × restarts,
  FGSM's pass and the clean one, and `val_square_queries` / 3 on `robust_fraction` of them)
  × the seconds of a pass;
- final evaluation: train.py's own test of the selected model, its examples × (a clean pass,
  PGD's steps × restarts, AutoAttack's passes where it runs) × the seconds of a pass;
- each evaluation of the definition: its examples × budgets × the attack's forward-backward
  passes per example at most (the registry's `passes`, with `robust_fraction` of the examples
  still robust when an ensemble's later parts run) × the seconds of a pass;
- the masking check, apart and out of the total: the same for its attack on every cell, the
  most it costs (it runs only where a cell's AutoAttack triggers it).
An evaluation of more examples than the test split holds counts the split's size
("test_examples"). Every term is an estimate, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fbat_tf import attacks
from fbat_tf.sweeps.definition import Cell, Definition, expand
from fbat_tf.sweeps.tuning import tuning_cells


def _lookup(table: Mapping[str, float] | float | None, cell: Cell) -> float | None:
    if table is None or isinstance(table, (int, float)):
        return table
    dataset, model = cell.config.dataset, cell.config.model
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


def _examples(spec: Mapping[str, Any], cell: Cell, asked: int, key: str) -> float | None:
    """`asked` examples (0: the whole split), at most the split's size from the anchors."""
    size = _lookup(spec.get(key), cell)
    if not asked:
        return size
    return asked if size is None else min(asked, size)


def _validation_seconds(
    spec: Mapping[str, Any], cell: Cell, per_pass: float, robust: float
) -> float:
    """One epoch's validation: its examples × (PGD's steps × restarts, FGSM's pass and the
    clean one, and where it runs Square's queries on the `robust` share left, a forward pass
    counting 1/3) × the seconds of a pass."""
    config = cell.config
    examples = _examples(spec, cell, config.val_examples, "validation_examples")
    passes = _pgd_passes(config.val_attack_steps, config.val_restarts) + 2
    passes += robust * config.val_square_queries / 3
    return (examples or 0) * passes * per_pass


def _final_seconds(spec: Mapping[str, Any], cell: Cell, per_pass: float, robust: float) -> float:
    """train.py's test of the selected model: a clean pass, PGD-K-R and, where it runs,
    AutoAttack (standard) per example."""
    config = cell.config
    examples = _examples(spec, cell, config.eval_examples, "test_examples")
    passes = 1 + _pgd_passes(config.eval_pgd_steps, config.eval_pgd_restarts)
    if config.eval_autoattack:
        passes += attacks.passes("autoattack", {}, robust)
    return (examples or 0) * passes * per_pass


def _pgd_passes(steps: int, restarts: int) -> float:
    """PGD-K-R's forward-backward passes per example, as the attack registry counts them."""
    return attacks.passes("pgd", {"steps": steps, "restarts": restarts})


def estimate(definition: Definition) -> dict[str, Any] | None:
    """Hours of GPU time by term (training, validation, train.py's final evaluation, each
    evaluation of the definition), or None without anchors."""
    spec = definition.estimate
    if not spec:
        return None
    robust = float(spec.get("robust_fraction", 0.5))
    cells = expand(definition)
    training = validation = final = tuned = 0.0
    unanchored = []
    for cell in [*tuning_cells(definition), *cells]:
        seconds = _lookup(spec["seconds_per_epoch"], cell)
        per_pass = _lookup(spec.get("seconds_per_pass"), cell)
        if seconds is None or per_pass is None:
            unanchored.append(cell.name)
            continue
        epochs = cell.config.epochs
        if cell.stage == "tuning":  # trained and validated, never tested
            tuned += epochs * (seconds + _validation_seconds(spec, cell, per_pass, robust))
            continue
        training += epochs * seconds
        validation += epochs * _validation_seconds(spec, cell, per_pass, robust)
        final += _final_seconds(spec, cell, per_pass, robust)
    evaluation = {}
    for ev in definition.evaluations:
        seconds = _evaluation_seconds(definition, ev, cells, spec, robust, unanchored)
        if seconds is not None:
            evaluation[ev.label] = seconds / 3600
    # The masking check runs only where a cell's AutoAttack triggers it: at most every cell.
    check = definition.masking_check
    checking = None
    if check is not None:
        seconds = _evaluation_seconds(definition, check.evaluation, cells, spec, robust, [])
        checking = None if seconds is None else seconds / 3600
    terms = {
        "training_hours": training / 3600,
        "validation_hours": validation / 3600,
        "final_evaluation_hours": final / 3600,
    }
    if definition.tuning is not None:
        terms["tuning_hours"] = tuned / 3600
    return {
        "anchor": spec["anchor"],
        **terms,
        "evaluation_hours": evaluation,
        "total_hours": sum(terms.values()) + sum(evaluation.values()),
        "not_estimated": unanchored,
        **({} if checking is None else {"masking_check_hours_at_most": checking}),
    }


def _evaluation_seconds(
    definition: Definition,
    ev: Any,
    cells: list[Cell],
    spec: Mapping[str, Any],
    robust: float,
    unanchored: list[str],
) -> float | None:
    """An evaluation over the cells: examples × budgets × the attack's passes × the seconds of
    a pass; None where the registry does not say its passes."""
    passes = attacks.passes(ev.attack, ev.options, robust)
    if passes is None:
        return None
    seconds = 0.0
    for cell in cells:
        per_pass = _lookup(spec.get("seconds_per_pass"), cell)
        if per_pass is None:
            unanchored.append(f"{cell.name} ({ev.name})")
            continue
        examples = _examples(spec, cell, ev.examples, "test_examples")
        seconds += examples * len(ev.budgets(definition, cell)) * passes * per_pass
    return seconds


def describe(found: dict[str, Any]) -> str:
    """One paragraph for a dry run and the report, every term shown."""
    parts = "".join(
        f", evaluation by {label} {hours:.1f} h"
        for label, hours in found["evaluation_hours"].items()
    )
    tuned = (
        f"the tuning runs' training and validation {found['tuning_hours']:.1f} h, "
        if "tuning_hours" in found
        else ""
    )
    text = (
        f"Estimated GPU time (an estimate from {found['anchor']}, not a measurement): "
        f"{tuned}training {found['training_hours']:.1f} h, per-epoch validation "
        f"{found['validation_hours']:.1f} h, train.py's final evaluation "
        f"{found['final_evaluation_hours']:.1f} h{parts}; about {found['total_hours']:.0f} h "
        "in all."
    )
    if found.get("masking_check_hours_at_most") is not None:
        text += (
            f" The masking check, where a cell's AutoAttack triggers it: up to "
            f"{found['masking_check_hours_at_most']:.1f} h more were every cell to."
        )
    if found["not_estimated"]:
        text += f" Without an anchor, not counted: {', '.join(found['not_estimated'][:5])}."
    return text
