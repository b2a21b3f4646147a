"""Older files read as today's records, in one place: every schema fbat-tf once wrote and reads
still (committed results go back to the first sweeps), each with what wrote it and what today's
form is. The rest of the code reads today's records only.

    record = upgrade.read_run(path)          # results.json of any version, as today's RunRecord
    record.method.passes, record.method.cost_variant       # recorded, or derived as now
    block = upgrade.evaluation_block(given)  # a sweep definition's "evaluation", today's form

Where it lies: above the method registry (tests/test_layers.py's layer of the trainer and the
evaluation), because an older run's method record is completed from the registry; below the
sweep report, which reads through it. The parts of an older results.json that need the records
alone (its final test, its history) are upgraded in records/upgrade.py, which
`RunRecord.from_dict` calls, because run.py, the classifiers and export/ read records too, the
first two below the registry; `read_run` gives a record upgraded by both.

Not upgraded, because no shape changed: evaluate.py's eval-*.json of every version reads as
today's (what was added since, the outcomes, `code`, `per_batch`, the norm and the split's
points, is absent from older ones and read as absent, and an ε key without a norm is L∞), and a
sweep's sweep.json is written whole by every report. Keys a version does not know (a config
field since retired, a later version's part) are no older schema: records keep them and write
them back as they were (records/__init__.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fbat_tf import catalog, methods
from fbat_tf.records import MethodRecord, RunRecord


def read_run(path: str) -> RunRecord | None:
    """The record at `path` in today's form, or None where there is none or it is not a
    record (RunRecord.read)."""
    found = RunRecord.read(path)
    return None if found is None else run(found)


def run(record: RunRecord) -> RunRecord:
    """A run's record (read by RunRecord, which upgrades its final test and history) with its
    method record in today's form."""
    return dataclasses.replace(record, method=method(record.method, record.config.method))


def method(found: MethodRecord | None, name: str) -> MethodRecord:
    """A run's method record in today's form; `name` is the method its config trained
    (TrainConfig.method), for records that do not say."""
    # Written by train.py before results.json held "method" (no committed record is so): no
    # "method". Today: the method's name, its config as the run recorded it (none: its
    # defaults), its cost variant and passes.
    found = found or MethodRecord()
    name = found.name or name
    config = _method_config(name, found.config)
    # Written before the method recorded its cost variant (bench/step_time.py's name for it)
    # and its passes per step: {"name", its options}, later with "title". Today: both, derived
    # from the config as the registry declares them (a title is not: those runs had none).
    return dataclasses.replace(
        found,
        name=name,
        config=config,
        cost_variant=found.cost_variant or methods.cost_variant(name, config),
        passes=found.passes or methods.passes(name, config),
    )


def _method_config(name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded method config as the method records it now."""
    declared = methods.defaults(name)
    # Written by Fast-BAT before its constructor took ig_coef 0 for ig "none": ig_coef 0 with
    # the default ig "hessian_free" (fashion_mnist's ig_coef0 cells), although a zero
    # coefficient trains first-order Fast-BAT. Today: ig "none" with ig_coef 0; a config naming
    # no ig_coef has the declared one.
    if "ig_coef" not in declared:
        return dict(config)
    ig = catalog.implicit_gradient(
        config.get("ig", declared["ig"]), config.get("ig_coef", declared["ig_coef"])
    )
    if ig == catalog.IMPLICIT_GRADIENTS[2]:
        return {**config, "ig": ig}
    return dict(config)


# A sweep definition's "evaluation" before it listed its attacks.
OLDER_EVALUATION = (
    "pgd_steps",
    "pgd_restarts",
    "pgd_examples",
    "autoattack_examples",
    "batch_size",
)


def evaluation_block(given: Mapping[str, Any]) -> Mapping[str, Any]:
    """A sweep definition's "evaluation" object in today's form ({"attacks": [...],
    "batch_size"}); ValueError saying what is amiss in an older one."""
    if "attacks" in given:
        return given
    # Written in sweep definitions (study/definitions/fashion_mnist.json, fashion_mnist_ig.json)
    # before "attacks": {"pgd_steps", "pgd_restarts", "pgd_examples", "autoattack_examples",
    # "batch_size"}, each optional, and so also a definition without "evaluation". It meant
    # PGD at the grid's budgets and AutoAttack at the cell's own. Today: those two attacks
    # listed; what it leaves out takes today's defaults (examples, batch size) or the catalog's
    # PGD steps and restarts.
    unknown = sorted(set(given) - set(OLDER_EVALUATION))
    if unknown:
        raise ValueError(
            f"unknown evaluation keys {unknown}; known: 'batch_size', 'attacks' (or the older "
            f"{list(OLDER_EVALUATION)})"
        )
    for key, value in given.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"evaluation {key!r} must be an integer >= 1")
    steps = given.get("pgd_steps", catalog.PGD_STEPS)
    restarts = given.get("pgd_restarts", catalog.PGD_RESTARTS)
    pgd = {"attack": "pgd", "eps": "grid", "options": {"steps": steps, "restarts": restarts}}
    autoattack = {"attack": "autoattack", "eps": "own"}
    for attack, key in ((pgd, "pgd_examples"), (autoattack, "autoattack_examples")):
        if key in given:
            attack["examples"] = given[key]
    block: dict[str, Any] = {"attacks": [pgd, autoattack]}
    if "batch_size" in given:
        block["batch_size"] = given["batch_size"]
    return block
