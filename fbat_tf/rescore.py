"""Committed evaluations re-scored by the standard robust definition, from their per-point
outcomes: an example is robust only where it is right both clean and under the attack
(records.evaluations.STANDARD). Evaluations written before counted a point right under the
attack alone (ATTACKED_ONLY); AutoAttack's numbers, which always started from the clean pass,
do not change, the others' (PGD, Square run on its own, transfer) may only fall.

    python -m fbat_tf.rescore results/          # every eval-*.json and results.json

A file that keeps outcomes is rewritten: each attack's outcomes become clean AND attacked, its
accuracy and each batch's follow from them, `robust_definition` says STANDARD, and `rescored`
names every number that changed with its value before ({"pgd@76": 0.06}, {} where none did). A
file without outcomes cannot be re-scored and is left as it is: it says nothing of its rule, and
records read it as ATTACKED_ONLY. A results.json is re-scored in its final test. What a file
holds besides is written back unchanged.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from fbat_tf import run
from fbat_tf.records.evaluations import ATTACKED_ONLY, STANDARD, EvaluationResult
from fbat_tf.records.files import write_json_atomic


def rescored(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]] | None:
    """`payload` (an evaluation's dict) re-scored by STANDARD, and the accuracies that changed
    with their old values; None where it keeps no outcomes or says its rule already. Its
    outcomes are checked against its accuracies first (ValueError where they disagree)."""
    if payload.get("robust_definition") or not payload.get("outcomes"):
        return None
    EvaluationResult.from_dict(payload)  # the outcomes agree with the numbers as written
    outcomes = dict(payload["outcomes"])
    clean = outcomes["clean"]
    changed: dict[str, float] = {}
    robust = dict(payload["robust_accuracy"])
    for key, held in outcomes.items():
        if key == "clean":
            continue
        both = "".join("1" if a == b == "1" else "0" for a, b in zip(clean, held, strict=True))
        outcomes[key] = both
        if key in robust:
            new = both.count("1") / len(both)
            if new != robust[key]:
                changed[key] = robust[key]
                robust[key] = new
    payload = {**payload, "robust_accuracy": robust, "outcomes": outcomes}
    parts = payload.get("autoattack_per_attack") or {}
    for key, per_part in parts.items():
        for part in per_part:
            if part != "clean" and f"{key}/{part}" in outcomes:
                held = outcomes[f"{key}/{part}"]
                if held.count("1") / len(held) != per_part[part]:
                    raise ValueError(f"{key}/{part}: re-scored differs, but its parts start clean")
    start, batches = 0, []
    for batch in payload.get("per_batch") or []:
        stop = start + batch["examples"]
        accuracies = {
            key: outcomes[key][start:stop].count("1") / max(batch["examples"], 1)
            if key in outcomes
            else value
            for key, value in batch["robust_accuracy"].items()
        }
        batches.append({**batch, "robust_accuracy": accuracies})
        start = stop
    if batches:
        payload["per_batch"] = batches
    payload["robust_definition"] = STANDARD
    payload["rescored"] = {
        "from": f"per-point outcomes scored {ATTACKED_ONLY!r}",
        "before": changed,
    }
    EvaluationResult.from_dict(payload)  # and now by the standard definition
    return payload, changed


def rescore_file(path: str) -> dict[str, float] | None:
    """Re-score the file at `path` (an eval-*.json, or a results.json's final test) in place;
    the accuracies that changed with their old values, or None where it was left as it is."""
    with open(path) as f:
        payload = json.load(f)
    if os.path.basename(path) == run.RESULTS:
        final = payload.get("final")
        done = rescored(final) if isinstance(final, dict) else None
        if done is None:
            return None
        payload = {**payload, "final": done[0]}
    else:
        done = rescored(payload)
        if done is None:
            return None
        payload = done[0]
    write_json_atomic(path, payload)
    return done[1]


def main(folders: list[str]) -> int:
    changed_files = rescored_files = 0
    for folder in folders:
        for top, _, names in sorted(os.walk(folder)):
            for name in sorted(names):
                if name != run.RESULTS and name not in run.Run(top).eval_files(""):
                    continue
                path = os.path.join(top, name)
                changed = rescore_file(path)
                if changed is None:
                    continue
                rescored_files += 1
                if changed:
                    changed_files += 1
                    shown = ", ".join(f"{k} {v:.3f}" for k, v in changed.items())
                    print(f"{path}: before {shown}")
    print(f"{rescored_files} files re-scored, {changed_files} with numbers changed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["results"]))
