"""A RobustBench-format entry for an evaluated model (`robustbench.json`, DESIGN.md §5.6).

    entry = robustbench.entry(result, dataset="fashion_mnist", eps=8 / 255, architecture=...)
    entry = robustbench.entry(result, "cifar10", eps=0.5, architecture=..., norm="l2")

The fields are those of RobustBench's model entries (model_info/<dataset>/<Linf|L2>/<Name>.json
in the RobustBench repository): link, name, authors, additional_data, number_forward_passes,
dataset, venue, architecture, eps, clean_acc, reported, autoattack_acc, footnote, unreliable;
accuracies are percentages written as strings with two decimals ("83.34"), ε as "8/255" (L∞) or
"0.5" (L2, in pixel units, as RobustBench's L2 entries write it).

fbat-tf cannot know, and leaves empty (""): `link`, `name` (the paper's title), `authors` and
`venue` (the publication), `reported` (the robust accuracy the paper reports) and `unreliable`
(RobustBench's own verdict after checking an entry). It knows the rest: `additional_data` is
false (training reads only the dataset's training split), `number_forward_passes` 1 (the
model is deterministic, one pass per prediction). The footnote says how many test points the
numbers are over: RobustBench's leaderboards use the full test set (10,000 points for CIFAR-10),
and an entry over fewer is not comparable with theirs.

An entry is made only where AutoAttack (standard) ran at the model's training ε: the
leaderboard's number is AutoAttack's at the threat model's ε.
"""

from __future__ import annotations

import errno
import os
from typing import Any

UNKNOWN = ""


def write(
    home: str, result, dataset: str, eps: float, name: str | None, norm: str = "linf"
) -> tuple[str, str | None] | None:
    """Write the entry for `result` (see `entry`) as `home`'s robustbench.json, atomically:
    (its path, what it replaced or None), or None where the result holds no AutoAttack
    (standard) at `eps` under `norm`. An entry already there is replaced where it is for
    another threat model (its ε or norm not this entry's: written for the wrong ball) or over
    no more points than this one, or cannot be read; otherwise it is kept: FileExistsError
    naming it (`KEPT` says what to do), so that an evaluation on 16 points never replaces one
    on 10,000. OSError where it cannot be written."""
    from fbat_tf.records import write_json_atomic
    from fbat_tf.run import Run

    found = entry(result, dataset, eps, name, norm)
    if found is None:
        return None
    path = Run(home).robustbench_path
    replaced = None
    if os.path.lexists(path):
        replaced = _replaced(path, found)
        if replaced is None:
            raise FileExistsError(errno.EEXIST, KEPT, path)
    write_json_atomic(path, found, replace=True)
    return path, replaced


def _replaced(path: str, new: dict[str, Any]) -> str | None:
    """What the entry at `path` was, where `new` replaces it (see `write`); None to keep it."""
    import json

    try:
        with open(path) as f:
            old = json.load(f)
        threat, points = _described(old)
    except (OSError, ValueError, TypeError, AttributeError):
        return "an entry that could not be read"
    if (threat, old.get("eps")) != (_described(new)[0], new["eps"]):
        return f"an entry for {threat} {old.get('eps')}, not this model's threat model"
    if points is None or points <= _described(new)[1]:
        return f"an entry over {points} points" if points else "an entry of unknown size"
    return None


def _described(found: dict[str, Any]) -> tuple[str, int | None]:
    """An entry's threat model ("Linf" or "L2", from its footnote) and number of points."""
    import re

    footnote = str(found.get("footnote", ""))
    threat = re.search(r" at (Linf|L2) ", footnote)
    points = re.search(r"the first (\d+) points", footnote)
    return (threat.group(1) if threat else "Linf"), (int(points.group(1)) if points else None)


# What a caller says of an entry `write` kept.
KEPT = (
    "a RobustBench entry over more points is there already, kept (delete it to write this "
    "evaluation's)"
)


def write_and_say(
    home: str, result, dataset: str, eps: float, name: str | None, norm: str = "linf"
) -> None:
    """`write`, saying on standard output where the entry is, what it replaced or that one
    there was kept, and on standard error, as a warning, why it could not be written: the
    evaluation it comes from is saved already and stands without it."""
    import sys

    from flags import errors

    try:
        written = write(home, result, dataset, eps, name, norm)
    except FileExistsError as error:
        print(f"RobustBench entry: {error.filename}: {KEPT}")
        return
    except OSError as error:
        print(
            f"warning: {home}: RobustBench entry not written: {errors.describe(error)}",
            file=sys.stderr,
        )
        return
    if written:
        path, replaced = written
        print(f"RobustBench entry: {path}" + (f" (replaces {replaced})" if replaced else ""))


def _percent(value: float) -> str:
    return f"{100 * value:.2f}"


def entry(
    result, dataset: str, eps: float, architecture: str | None, norm: str = "linf"
) -> dict[str, Any] | None:
    """The entry for an EvaluationResult, or None where it holds no AutoAttack (standard) at
    `eps` (pixel units, the training ε) under `norm`."""
    from fbat_tf import attacks
    from fbat_tf.records import CodeIdentity, units

    found = result.get("autoattack", units.in_flag_units(eps, norm), norm)
    leaderboard = attacks.entry("autoattack").defaults()["version"]  # the standard version
    if found is None or (result.aa_version or leaderboard) != leaderboard:
        return None
    revision = CodeIdentity.of(result.code).revision
    budget = units.shown(eps, norm).removesuffix(" (L2)")
    threat = units.REFERENCE_NAMES[norm]
    return {
        "link": UNKNOWN,
        "name": UNKNOWN,
        "authors": UNKNOWN,
        "additional_data": False,
        "number_forward_passes": 1,
        "dataset": dataset,
        "venue": UNKNOWN,
        "architecture": architecture or UNKNOWN,
        "eps": budget,
        "clean_acc": _percent(result.clean_accuracy),
        "reported": UNKNOWN,
        "autoattack_acc": _percent(found.robust_accuracy),
        "footnote": (
            f"Evaluated by fbat-tf on the first {result.examples} points of the "
            f"{result.split or 'test'} split with its TensorFlow AutoAttack "
            f"(standard: APGD-CE, APGD-T, FAB-T, Square) at {threat} {budget}"
            + (f", revision {revision[:7]}" if revision else "")
            + "."
        ),
        "unreliable": UNKNOWN,
    }
