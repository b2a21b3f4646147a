"""Older results.json read as today's: the part of the upgrade (fbat_tf/upgrade.py) that needs
the records alone.

`RunRecord.from_dict` calls these where it reads each part, and reads today's schema otherwise,
so that every reader of a run directory gets today's record: run.py and the classifiers too,
which lie below the method registry and so cannot reach fbat_tf/upgrade.py (tests/test_layers.py).
What needs the registry (a run's method record) is upgraded there.

Each function takes a part as any version wrote it and gives today's form; today's form comes
back as it was, so reading a record twice changes nothing.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from fbat_tf.records import units
from fbat_tf.records.config import TrainConfig

# What a pre-evaluation "final" block kept beside its numbers, as written.
_FINAL_KEPT = ("pgd_steps", "pgd_restarts", "aa_version")


def final_test(final: Any, config: TrainConfig) -> Any:
    """results.json's "final" in the evaluation schema (EvaluationResult.from_dict's)."""
    if "robust_accuracy" in final:
        return final
    # Written by train.py before its test was an evaluation's result: {"test_examples",
    # "test_clean_accuracy", "test_pgd_robust_accuracy", "pgd_steps", "pgd_restarts",
    # "eval_time_s" (PGD's and AutoAttack's seconds together) and, where AutoAttack ran,
    # "test_aa_robust_accuracy", "test_aa_per_attack", "aa_version", "aa_time_s"}, at the run's
    # ε (L∞ only then) on its dataset. Today: {"examples", "clean_accuracy", "robust_accuracy"
    # and "time_s" by "pgd@<ε>" and "autoattack@<ε>", "autoattack_per_attack", "dataset", ...}.
    eps = units.in_flag_units(config.eps, "linf")
    pgd = units.key("pgd", eps)
    total, aa_seconds = final.get("eval_time_s"), final.get("aa_time_s")
    robust = {pgd: final["test_pgd_robust_accuracy"]}
    seconds = {pgd: None if total is None else total - (aa_seconds or 0.0)}
    parts = {}
    if final.get("test_aa_robust_accuracy") is not None:
        autoattack = units.key("autoattack", eps)
        robust[autoattack] = final["test_aa_robust_accuracy"]
        seconds[autoattack] = aa_seconds
        parts[autoattack] = final.get("test_aa_per_attack") or {}
    return {
        "examples": final["test_examples"],
        "clean_accuracy": final["test_clean_accuracy"],
        "robust_accuracy": robust,
        "time_s": seconds,
        "dataset": config.dataset,
        **{key: final[key] for key in _FINAL_KEPT if key in final},
        "autoattack_per_attack": parts,
    }


def history(epochs: list[Any]) -> list[Any]:
    """A run's epochs (records.Epoch) with validation's mark of the best so far ("val_best")."""
    if any("val_best" in epoch.logs for epoch in epochs):
        return epochs
    # Written by train.py before validation marked the epoch whose weights it saved: epochs
    # with "val_robust_accuracy" and no "val_best". Today: "val_best" 1.0 on each epoch whose
    # finite robust accuracy beat every earlier one, else 0.0 (callbacks.RobustValidation's
    # rule), so that the last mark is the first epoch of the highest accuracy.
    best = -math.inf
    upgraded = []
    for epoch in epochs:
        logs = dict(epoch.logs)
        if "val_robust_accuracy" in logs:
            robust = logs["val_robust_accuracy"]
            better = isinstance(robust, numbers.Real) and math.isfinite(robust) and robust > best
            best = robust if better else best
            logs["val_best"] = 1.0 if better else 0.0
        upgraded.append(dataclasses.replace(epoch, logs=logs))
    return upgraded
