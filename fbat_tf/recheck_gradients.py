"""Committed evaluations' zero-gradient check computed again, from the model each one names.

    python -m fbat_tf.recheck_gradients results/fashion_mnist_interior   # every eval-*.json
    python -m fbat_tf.recheck_gradients                                  # all of results/

Evaluations written before the check looked only at the points the model classifies right
(fbat_tf/checks.py, `zero_gradients`) took the DLR gradient at APGD's random start on every
point of the first batch; on a point the model gets wrong whose label ranks third among the
logits, the DLR loss is the constant 1 and its gradient zero, so the check fired on nearly
every ordinary model. The reference AutoAttack checks the points APGD attacks, those classified
right, and so does the check now.

Each eval-*.json whose indicators hold that check without a `rechecked` note is rewritten with
the check as computed now, on the same points (the first 64 of its first batch, from the split,
dataset and held-out choice it names), at its seed and at the first budget it attacked, its
model loaded as evaluate.py loads it (weights folded where the file says it folded them); the
check keeps the old one under `rechecked` with the code that checked again. Nothing else in the
file changes: the attacks' numbers do not depend on the check. A file whose model is not there
is left as it is, and said so.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from fbat_tf import checks, classifiers, data, provenance, run
from fbat_tf.records import units
from fbat_tf.records.files import write_json_atomic

# The check's points: the reference takes its first batch; evaluate.py the first 64 of it.
POINTS = 64
CHECK = "zero_gradients"


def due(payload: dict[str, Any]) -> bool:
    """Whether the evaluation holds a zero-gradient check not computed again yet."""
    found = ((payload.get("indicators") or {}).get("checks") or {}).get(CHECK)
    return found is not None and "rechecked" not in found


def recheck(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` (an evaluation's dict, `due`) with its zero-gradient check computed again from
    its model and points; FileNotFoundError where the model is not there."""
    classifier, _ = classifiers.load_model(payload["model_path"])
    if payload.get("fold_weights"):
        classifier = classifiers.fold_weights(classifier)
    batch = int(payload["per_batch"][0]["examples"])
    split = data.load(
        payload["dataset"],
        payload["split"],
        batch_size=batch,
        max_examples=int(payload["examples"]),
        download=False,
        validation_from=payload.get("validation_from") or "train",
    )
    x, y = next(iter(split))[:2]
    _, eps, norm = units.split_key(next(iter(payload["robust_accuracy"])))
    found = checks.zero_gradients(
        classifier,
        x[:POINTS],
        y[:POINTS],
        units.to_pixels(eps, norm),
        norm,
        int(payload.get("seed") or 0),
    )
    indicators = dict(payload["indicators"])
    held = dict(indicators["checks"])
    held[CHECK] = {
        "fired": found.fired,
        "detail": found.detail,
        "keys": list(found.keys),
        "rechecked": {"before": held[CHECK], "code": provenance.code()},
    }
    indicators["checks"] = held
    return {**payload, "indicators": indicators}


def evaluations(paths: list[str]) -> list[str]:
    """The eval-*.json files under `paths` (files or folders, links not followed), the pinned
    code copies a sweep keeps (`code/`) left out, sorted."""
    found = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
            continue
        for top, folders, names in os.walk(path):
            folders[:] = sorted(f for f in folders if f != "code")
            kept = set(run.Run(top).eval_files(""))
            found += [os.path.join(top, name) for name in names if name in kept]
    return sorted(found)


def main(paths: list[str]) -> int:
    missing = [path for path in paths if not os.path.lexists(path)]
    if missing:
        print(f"error: {', '.join(missing)}: no such file or folder", file=sys.stderr)
        return 2
    changed = same = 0
    for path in evaluations(paths):
        if os.path.islink(path):
            print(f"{path}: a link, left as it is")
            continue
        with open(path) as f:
            payload = json.load(f)
        if not due(payload):
            continue
        try:
            new = recheck(payload)
        except FileNotFoundError as error:
            print(f"{path}: left as it is: {error}")
            continue
        after = new["indicators"]["checks"][CHECK]
        write_json_atomic(path, new)
        if after["fired"] != after["rechecked"]["before"]["fired"]:
            changed += 1
        else:
            same += 1
        print(f"{path}: {'fires' if after['fired'] else 'quiet'}: {after['detail']}")
    print(f"{changed + same} checks computed again, {changed} of them changed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["results"]))
