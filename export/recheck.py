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
predictions agree, and flags every accuracy more than a point below the source's, every
agreement below 95 %, and a source whose weights are not those the model card says the file
was exported from.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from export import artifacts
from fbat_tf import attacks, run
from fbat_tf.artifacts import compare
from fbat_tf.records import units

# An artifact's accuracy this far below the source's, on the same points, is flagged; so is an
# agreement of predictions below AGREEMENT_FLAGGED (clean or on a replayed attack's points): a
# file of the source's own weights agrees on all of them but what rounding moves (the int8 demo
# file on 98.8-99.2 %, BUILD.md), another model on far fewer.
DROP_FLAGGED = 0.01
AGREEMENT_FLAGGED = 0.95


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
    other_source = other_source_problem(result.model_path, source_path)
    flagged = ([other_source] if other_source else []) + flagged_rows(rows)
    row = {
        "source": source_path,
        "source_weights_sha256": run.weights_sha256(source_path),
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
        print(f"warning: {result.model_path}: {line}", file=sys.stderr)
    return row


def other_source_problem(model_path: str, source_path: str) -> str | None:
    """Where the source's weights are not those the file's model card says it was exported
    from (both known: source.weights_sha256, recorded since exports wrote it), the flag that
    names it; else None."""
    exported_from, given = run.weights_sha256(model_path), run.weights_sha256(source_path)
    if not exported_from or not given or exported_from == given:
        return None
    return (
        f"source: {source_path} is not the model this file was exported from (its weights' "
        f"SHA-256 begins {given[:12]}, the model card's {exported_from[:12]}): pass the run "
        "or SavedModel it was exported from as --source_model_path"
    )


def flagged_rows(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The re-check's rows (by result key) that are flagged, each said in words: an accuracy
    more than DROP_FLAGGED below the source's on the same points, an agreement below
    AGREEMENT_FLAGGED."""
    flagged = []
    for key, row in rows.items():
        accuracy, source = row.get("accuracy"), row.get("source_accuracy")
        # The margin keeps a drop of exactly a point (0.86 to 0.85 in 100) from passing for
        # more by the floats' rounding.
        lost = None if source is None or accuracy is None else source - accuracy
        if lost is not None and lost > DROP_FLAGGED + 1e-9:
            flagged.append(
                f"{key}: more than {100 * DROP_FLAGGED:g} point lost: {accuracy:.4f} against the "
                f"source's {source:.4f} ({100 * (accuracy - source):+.1f} points)"
            )
        agreement = row.get("agreement")
        if agreement is not None and agreement < AGREEMENT_FLAGGED:
            flagged.append(
                f"{key}: agrees with the source on {100 * agreement:.1f}% of the points, below "
                f"{100 * AGREEMENT_FLAGGED:g}%: is the source the model this file was exported "
                "from?"
            )
    return flagged


def table(row: Mapping[str, Any]) -> str:
    """The re-check's row as the console shows it under the file's own table: on the same
    points, the file's accuracy, the source's, and how often their predictions agree (an
    attack run on the file itself has no source figures: "-")."""

    def shown(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    lines = [
        f"against the source {row['source']}, on the same {row['examples']} points:",
        f"{'':<28}{'file':>8}{'source':>8}{'agree':>8}",
    ]
    for key, found in row["accuracy"].items():
        values = (found.get(k) for k in ("accuracy", "source_accuracy", "agreement"))
        lines.append(f"{key:<28}" + "".join(f"{shown(v):>8}" for v in values))
    return "\n".join(lines)


def record(model_path: str, row: Mapping[str, Any]) -> str | None:
    """The row in the model card of the export the file sits in, with what the file is; the
    card's path, or None where there is no card."""
    folder = os.path.dirname(os.path.abspath(model_path))
    name = os.path.basename(model_path)
    described = {"file": name, **row}
    return artifacts.record_recheck(folder, name, described)
