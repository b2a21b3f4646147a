"""Committed evaluations brought to today's indicators of attack failure, from the model each one
names, without attacking the test points again.

    python -m fbat_tf.indicate study/results/fashion_mnist_tuned   # every eval-*.json under it
    python -m fbat_tf.indicate                                     # all of results/

Two kinds of file are rewritten; every other is left as it is:

- One written before evaluate.py computed the indicators (it holds per-point outcomes and no
  `indicators`): the reference AutoAttack's checks on the first 64 points of its first batch and
  the six indicators on its first 32 clean-correct points (fbat_tf/checks.py,
  fbat_tf/indicators.py), per attack and ε, with the attacks rebuilt from the settings the file
  records (PGD's steps and restarts, AutoAttack's version, Square's queries and restarts) at its
  seed, as evaluate.py computes them after its attacks. `indicators.computed_later` names the
  code that computed them; the attacks' numbers are the file's own.
- One whose zero-gradient check counted every point of the batch (before the check looked only
  at the points the model classifies right: on a point whose label ranks third among the logits
  the DLR loss is the constant 1 and its gradient zero, so the check fired on nearly every
  ordinary model): that check is computed again on the same points, and keeps the old one under
  `rechecked` with the code that checked again.

The model is loaded as evaluate.py loads it (weights folded where the file says it folded them),
the points from the split, dataset and held-out choice the file names; a committed run moved with
its evaluations is found in the folder the file is in (`model_of`). A file whose model is not
there, or a link, is left as it is and said so; a link named on the command line is refused, and
the folders are walked without following links.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from fbat_tf import onednn, provenance, run, startup
from fbat_tf.records import units
from fbat_tf.records.files import write_json_atomic

# The checks' points: the reference takes its first batch; evaluate.py the first 64 of it.
CHECK_POINTS = 64
CHECK = "zero_gradients"
# The file keys of each attack's options, as evaluate.py records the flags it ran with.
RECORDED = ("pgd_steps", "pgd_restarts", "aa_version", "square_n_queries", "square_restarts")


def lacks_indicators(payload: dict[str, Any]) -> bool:
    """An evaluation written before the indicators: outcomes, and no `indicators`."""
    return "indicators" not in payload and bool(payload.get("outcomes"))


def due_recheck(payload: dict[str, Any]) -> bool:
    """An evaluation whose zero-gradient check was not computed again yet."""
    found = ((payload.get("indicators") or {}).get("checks") or {}).get(CHECK)
    return (
        found is not None
        and "rechecked" not in found
        and "computed_later" not in (payload.get("indicators") or {})
    )


class Setting:
    """What an evaluation attacked, as its file records it: the model, the split's batches, the
    first budget's ε and norm, the attacks by (name, ε)."""

    def __init__(self, payload: dict[str, Any], model: str | None = None):
        from fbat_tf import classifiers, data, evaluation

        classifier, _ = classifiers.load_model(model or payload["model_path"])
        if payload.get("fold_weights"):
            classifier = classifiers.fold_weights(classifier)
        self.classifier = classifier
        self.split = data.load(
            payload["dataset"],
            payload["split"],
            # The first batch's size (a file without batches: one batch of all its points).
            batch_size=int((payload.get("per_batch") or [payload])[0]["examples"]),
            max_examples=int(payload["examples"]),
            download=False,
            validation_from=payload.get("validation_from") or "train",
        )
        self.seed = int(payload.get("seed") or 0)
        keys = [units.split_key(key) for key in payload["robust_accuracy"]]
        self.norm = keys[0][2]
        self.eps = units.to_pixels(keys[0][1], self.norm)
        names = list(dict.fromkeys(name for name, _, _ in keys))
        budgets = list(dict.fromkeys(units.to_pixels(eps, norm) for _, eps, norm in keys))
        self.attacks = evaluation.registry_attacks(
            names, budgets, norm=self.norm, options={n: _options(n, payload) for n in names}
        )

    def first_batch(self):
        x, y = next(iter(self.split))[:2]
        return x[:CHECK_POINTS], y[:CHECK_POINTS]


def _options(name: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Attack `name`'s options as the file recorded the flags that set them."""
    from fbat_tf import attacks

    entry = attacks.entry(name)
    return {
        option.name: payload[entry.flag_name(option)]
        for option in entry.options
        if entry.flag_name(option) in RECORDED and entry.flag_name(option) in payload
    }


def indicate(payload: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """`payload` (`lacks_indicators`) with the checks and indicators evaluate.py computes now,
    of the model at `model` (default: the one the file names)."""
    from fbat_tf import checks, indicators
    from fbat_tf.records import EvaluationResult

    setting = Setting(payload, model)
    result = EvaluationResult.from_dict(payload)
    found_checks = checks.reference_checks(
        setting.classifier, *setting.first_batch(), setting.attacks, setting.seed
    )
    taken = indicators.sample(setting.split, result.clean_outcomes or "", indicators.POINTS)
    if taken is None:
        return payload
    found = indicators.compute(
        setting.classifier, *taken, setting.attacks, result, setting.seed, found_checks
    )
    return {**payload, "indicators": {**found.to_dict(), "computed_later": provenance.code()}}


def recheck(payload: dict[str, Any], model: str | None = None) -> dict[str, Any]:
    """`payload` (`due_recheck`) with its zero-gradient check computed again from its model (at
    `model`, default the one the file names) and points."""
    from fbat_tf import checks

    setting = Setting(payload, model)
    found = checks.zero_gradients(
        setting.classifier, *setting.first_batch(), setting.eps, setting.norm, setting.seed
    )
    held = dict(payload["indicators"]["checks"])
    held[CHECK] = {
        "fired": found.fired,
        "detail": found.detail,
        "keys": list(found.keys),
        "rechecked": {"before": held[CHECK], "code": provenance.code()},
    }
    return {**payload, "indicators": {**payload["indicators"], "checks": held}}


def model_of(path: str, payload: dict[str, Any]) -> str:
    """The model the evaluation at `path` attacked: the path it names, or, where nothing is
    there any more and the file lies in a run directory of that path's name (a committed run
    moved with its evaluations), that run directory."""
    named = payload["model_path"]
    here = os.path.dirname(os.path.abspath(path))
    moved = os.path.basename(os.path.normpath(named)) == os.path.basename(here)
    if not os.path.exists(named) and moved and run.Run(here).status() is not None:
        return here
    return named


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


def _said(payload: dict[str, Any]) -> str:
    """What fired, in a few words."""
    held = payload.get("indicators") or {}
    fired = [
        name.replace("_", " ")
        for counts in (held.get("attacks") or {}).values()
        for name, count in counts.items()
        if count and count["points"]
    ]
    fired += [
        name.replace("_", " ") for name, c in (held.get("checks") or {}).items() if c["fired"]
    ]
    return ", ".join(dict.fromkeys(fired)) or "none fired"


def main(paths: list[str]) -> int:
    missing = [path for path in paths if not os.path.lexists(path)]
    if missing:
        print(f"error: {', '.join(missing)}: no such file or folder", file=sys.stderr)
        return 2
    # Files are rewritten only inside what was named: a named link could lead anywhere.
    linked = [path for path in paths if os.path.islink(path)]
    if linked:
        print(
            f"error: {', '.join(linked)}: a symbolic link; name the file or folder it points at",
            file=sys.stderr,
        )
        return 2
    onednn.choose(None)  # as evaluate.py chooses for these datasets, before TensorFlow loads
    startup.load_tensorflow()
    computed = rechecked = 0
    for path in evaluations(paths):
        if os.path.islink(path):
            print(f"{path}: a link, left as it is")
            continue
        with open(path) as f:
            payload = json.load(f)
        if lacks_indicators(payload):
            step, kind = indicate, "indicators computed"
        elif due_recheck(payload):
            step, kind = recheck, "zero-gradient check computed again"
        else:
            continue
        try:
            new = step(payload, model_of(path, payload))
        except FileNotFoundError as error:
            print(f"{path}: left as it is: {error}")
            continue
        if new is payload:
            print(f"{path}: left as it is: no point is right clean")
            continue
        write_json_atomic(path, new)
        computed += step is indicate
        rechecked += step is recheck
        print(f"{path}: {kind}: {_said(new)}")
    print(f"{computed} files given indicators, {rechecked} zero-gradient checks computed again")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["results"]))
