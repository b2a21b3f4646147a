"""An exported ONNX or LiteRT file evaluated as it will run, against the model it came from.

    attacks = replayed(crafted, direct, source)   # gradient attacks crafted on the source
    result = evaluation.evaluate(artifact, split, attacks)
    row = recheck(result, artifact, source, split, attacks, "export/fmnist/1")

evaluate.py does this for `--model_path=<file>.onnx|.tflite` (DESIGN.md §5.4). The artifact
computes what the SavedModel computes, so the adversarial examples that count are the source
model's: every attack that needs the model's gradients (PGD, AutoAttack and its parts) is run
on the source model with the evaluation's seeds and its points are fed to the artifact, which
also records, per point, whether the two models give it the same class. Attacks that read only
outputs (Square) run on the artifact itself. The row says, on the same test points, the
artifact's and the source's accuracy, clean and on each replayed attack, how often their
predictions agree, and flags every accuracy more than a point below the source's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from export import artifacts
from fbat_tf import attacks
from fbat_tf.artifacts import compare
from fbat_tf.records import units

# An artifact's accuracy this far below the source's, on the same points, is flagged.
DROP_FLAGGED = 0.01


def replayed(
    crafted: Mapping[tuple[str, float], Any],
    direct: Mapping,
    source: Callable,
    kept: dict | None = None,
) -> dict:
    """The attacks of an exported file, by (name, ε) in order: each that needs the attacked
    model's gradients as `crafted` builds it, run on `source` and replayed
    (attacks.transfer.ReplayedAttack); each black-box one as `direct` builds it (without XLA,
    which cannot compile a call into the file's runtime). `kept`, shared by the files one
    source's points are replayed on, keeps each attack's points once crafted, by (name, ε)."""
    from fbat_tf.attacks.transfer import ReplayedAttack

    return {
        key: direct[key]
        if attacks.entry(key[0]).black_box
        else ReplayedAttack(source, attack, None if kept is None else kept.setdefault(key, {}))
        for key, attack in crafted.items()
    }


def _bits(values: np.ndarray) -> str:
    return "".join("1" if v else "0" for v in values)


def recheck(
    result, artifact: Callable, source: Callable, split, built: Mapping, source_path: str
) -> dict[str, Any]:
    """The re-check's row for the model card, kept in `result.extra["deployment"]` with the
    per-point agreement strings; prints a warning line for each flagged drop."""
    from fbat_tf.attacks.transfer import ReplayedAttack

    agree, source_right, _ = compare(source, artifact, split)
    rows = {
        "clean": {
            "accuracy": result.clean_accuracy,
            "source_accuracy": float(source_right.mean()) if len(agree) else None,
            "agreement": float(agree.mean()) if len(agree) else None,
        }
    }
    per_point = {"clean": _bits(agree)}
    for (name, eps), attack in built.items():
        norm = getattr(attack, "norm", "linf")
        attacked = result.attacked(name, units.in_flag_units(eps, norm), norm)
        key, accuracy = attacked.key, attacked.robust_accuracy
        if isinstance(attack, ReplayedAttack):
            agreed = np.concatenate(attack.agreement)
            right = np.concatenate(attack.source_right)
            rows[key] = {
                "accuracy": accuracy,
                "source_accuracy": float(right.mean()),
                "agreement": float(agreed.mean()),
                "replayed": True,
            }
            per_point[key] = _bits(agreed)
        else:
            rows[key] = {"accuracy": accuracy, "replayed": False}
    flagged = [
        f"{key}: {row['accuracy']:.4f} against the source's {row['source_accuracy']:.4f} "
        f"({100 * (row['accuracy'] - row['source_accuracy']):+.1f} points)"
        for key, row in rows.items()
        if row.get("source_accuracy") is not None
        and row["source_accuracy"] - row["accuracy"] > DROP_FLAGGED
    ]
    row = {
        "source": source_path,
        "examples": result.examples,
        "split": result.split,
        "first_point": result.first_point,
        "seed": result.seed,
        "accuracy": rows,
        "flagged": flagged,
    }
    result.extra["deployment"] = {**row, "agreement_outcomes": per_point}
    result.extra["replayed"] = [key for key, r in rows.items() if r.get("replayed")]
    for line in flagged:
        print(
            f"warning: {result.model_path}: more than a point lost: {line}",
            file=sys.stderr,
        )
    return row


def record(model_path: str, row: Mapping[str, Any]) -> str | None:
    """The row in the model card of the export the file sits in, with what the file is; the
    card's path, or None where there is no card."""
    folder = os.path.dirname(os.path.abspath(model_path))
    name = os.path.basename(model_path)
    described = {"file": name, **row}
    return artifacts.record_recheck(folder, name, described)
