"""A sweep's masking check: where a cell's AutoAttack shows Square, its black-box part, still
breaking examples after the white-box parts, a stronger black-box attack runs on the cell too,
on the same test points, and the cell's robust accuracy is the two combined.

    "masking_check": {"of": "autoattack", "threshold": 1.0,
                      "attack": {"attack": "square", "examples": 1000,
                                 "options": {"n_queries": 10000, "restarts": 5}}}

`of` names the definition's AutoAttack (standard) evaluation (default "autoattack");
`threshold` is in percentage points; `attack` is an attack of the registry with its options,
run by evaluate.py into `eval-masking.json` (`name` sets another) at the budgets that triggered
it, on the `of` evaluation's examples (`examples`, where given, must be that many).

The rule, at each ε of the `of` evaluation: it triggers where Square removed more than
`threshold` points beyond what the parts before it left, `gap_points` of its recorded parts
compared exactly (1.0 point is not more than 1.0). The checked robust accuracy counts a test
point robust only if it survived both attacks: from the files' per-point `outcomes` ("1" per
point still classified correctly, in the evaluated order, under the key "<attack>@<ε>"), or,
where either file lacks them, the lower of the two accuracies, said so.

    check = definition.masking_check
    lacking(check, cell_dir)                  # [16.0]: triggered budgets the check still lacks
    checks = cell_checks(check, cell_dir)     # {16.0: MaskingEntry(triggered, gap, ...)}
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from fbat_tf.attacks.masking import (
    combined_outcomes,
    ends_with_black_box,
    exceeds,
    gap_points,
)
from fbat_tf.records import (
    CellResult,
    EvaluationResult,
    EvaluationSummary,
    MaskingEntry,
    eps_key,
)
from fbat_tf.records.cells import CHECKED, NOT_TRIGGERED, PENDING
from fbat_tf.sweeps.errors import DefinitionError
from fbat_tf.sweeps.evaluations import Evaluation, parse_evaluation

KEYS = ("of", "threshold", "attack")
ATTACK_KEYS = ("attack", "name", "examples", "options")
DEFAULT_NAME = "masking"
# The mark of a checked number in the report's tables.
MARK = "‡"
PER_POINT = "per point"


@dataclasses.dataclass(frozen=True)
class MaskingCheck:
    """The definition's "masking_check": the evaluation it reads (`of`), its threshold
    (points) and the stronger attack, as an evaluation at the `of` evaluation's budgets and
    examples (it runs at those that trigger it)."""

    of: Evaluation
    threshold: float
    evaluation: Evaluation

    @property
    def name(self) -> str:
        return self.evaluation.name

    def record(self) -> dict[str, Any]:
        return {"of": self.of.name, "threshold": self.threshold, **self.evaluation.record()}


def parse(path: str, given: Any, evaluations: Sequence[Evaluation]) -> MaskingCheck | None:
    """The definition's "masking_check", checked; DefinitionError naming the key at fault."""
    if given is None:
        return None
    where = f"{path}: masking_check"
    if not isinstance(given, dict):
        raise DefinitionError(f"{where}: give an object with {list(KEYS)}")
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        raise DefinitionError(f"{where}: unknown keys {unknown}; known {list(KEYS)}")
    of_name = given.get("of", "autoattack")
    of = next((e for e in evaluations if e.name == of_name), None)
    if of is None:
        raise DefinitionError(
            f"{where}.of: {of_name!r} names no evaluation of the definition "
            f"({[e.name for e in evaluations]})"
        )
    if not ends_with_black_box(of.attack, of.options):
        raise DefinitionError(
            f"{where}.of: {of_name!r} must be an AutoAttack standard evaluation (Square is its "
            f"last part), not {of.label}"
        )
    threshold = given.get("threshold")
    if (
        not isinstance(threshold, (int, float))
        or isinstance(threshold, bool)
        or not math.isfinite(threshold)
        or threshold < 0
    ):
        raise DefinitionError(f"{where}.threshold: give points >= 0, got {threshold!r}")
    spec = given.get("attack")
    if not isinstance(spec, dict):
        raise DefinitionError(f"{where}.attack: give an object with 'attack' (a registry name)")
    if "examples" in spec and spec["examples"] != of.examples:
        raise DefinitionError(
            f"{where}.attack.examples: the check runs on the test points of {of_name!r}, its "
            f"first {of.examples}; got {spec['examples']!r}"
        )
    found = parse_evaluation(f"{where}.attack", spec, DEFAULT_NAME, ATTACK_KEYS)
    if any(e.name == found.name for e in evaluations):
        raise DefinitionError(
            f"{where}.attack.name: {found.name!r} is an evaluation's name already; give another"
        )
    evaluation = dataclasses.replace(found, eps=of.eps, examples=of.examples)
    return MaskingCheck(of, float(threshold), evaluation)


@dataclasses.dataclass(frozen=True)
class _Found:
    """One attack at one ε in a cell's evaluation file: its accuracy and per-point outcomes."""

    accuracy: float
    source: str
    examples: int
    outcomes: str | None
    clean: str | None
    parts: dict[str, float]
    code: dict[str, Any] | None


def _found(cell_dir: str, evaluation: Evaluation) -> dict[float, _Found]:
    """By ε (16.0), the evaluation's attack over its files (eval-<name>.json first)."""
    found: dict[float, _Found] = {}
    for name in evaluation.files(cell_dir):
        path = os.path.join(cell_dir, name)
        result = EvaluationResult.load(path)
        for attacked in result.robust:
            if attacked.attack != evaluation.attack:
                continue
            found.setdefault(
                eps_key(attacked.eps),
                _Found(
                    attacked.robust_accuracy,
                    path,
                    result.examples,
                    result.outcomes.get(attacked.key),
                    result.clean_outcomes,
                    dict(attacked.parts),
                    result.code,
                ),
            )
    return found


def decide(parts: Mapping[str, float], examples: int, threshold: float) -> dict[str, Any]:
    """The rule on one AutoAttack result: its gap (points, exact; None without Square last)
    and whether it is more than `threshold` points."""
    gap = gap_points(parts, examples)
    return {"gap": gap, "triggered": exceeds(gap, threshold)}


def _triggered(check: MaskingCheck, cell_dir: str) -> dict[float, _Found]:
    return {
        eps: found
        for eps, found in _found(cell_dir, check.of).items()
        if decide(found.parts, found.examples, check.threshold)["triggered"]
    }


def lacking(check: MaskingCheck, cell_dir: str) -> list[float]:
    """The budgets (1/255) at which the cell's finished AutoAttack triggers the check and no
    file of the check holds its result; [] before the AutoAttack evaluation has run."""
    done = _found(cell_dir, check.evaluation)
    return sorted(eps for eps in _triggered(check, cell_dir) if eps not in done)


def combine(first: _Found, second: _Found) -> tuple[float, str]:
    """The robust accuracy of points that survived both attacks, and how it was reached: per
    point where both files hold outcomes of the same points, else the lower accuracy."""
    if first.outcomes is None or second.outcomes is None:
        lacks = " and ".join(
            os.path.basename(f.source) for f in (first, second) if f.outcomes is None
        )
        return min(first.accuracy, second.accuracy), (
            f"the lower of the two accuracies: {lacks} holds no per-point outcomes"
        )
    if first.clean is not None and second.clean is not None and first.clean != second.clean:
        return min(first.accuracy, second.accuracy), (
            "the lower of the two accuracies: the files' clean outcomes differ (not the same "
            "test points)"
        )
    try:
        both = combined_outcomes(first.outcomes, second.outcomes)
    except ValueError as error:
        return min(first.accuracy, second.accuracy), f"the lower of the two accuracies: {error}"
    return both.count("1") / len(both) if both else 0.0, PER_POINT


def cell_checks(check: MaskingCheck, cell_dir: str) -> dict[float, MaskingEntry]:
    """What the check says of a cell at each ε its AutoAttack ran: the gap (points) and
    whether it triggered; where it did, the stronger attack's accuracy and the combined one
    once it has run ("checked"), else "pending"."""
    strong = _found(cell_dir, check.evaluation)
    checks = {}
    for eps, found in _found(cell_dir, check.of).items():
        decided = decide(found.parts, found.examples, check.threshold)
        entry = MaskingEntry(
            triggered=decided["triggered"],
            gap=None if decided["gap"] is None else float(decided["gap"]),
            threshold=check.threshold,
            autoattack=found.accuracy,
            source=found.source,
            state=NOT_TRIGGERED,
        )
        if decided["triggered"]:
            entry = dataclasses.replace(entry, label=check.evaluation.label, state=PENDING)
            if eps in strong:
                accuracy, how = combine(found, strong[eps])
                entry = dataclasses.replace(
                    entry,
                    state=CHECKED,
                    strong=strong[eps].accuracy,
                    strong_source=strong[eps].source,
                    combined=accuracy,
                    combined_by=how,
                    code=strong[eps].code,
                    # The points each survived both, for paired comparisons.
                    combined_outcomes=(
                        combined_outcomes(found.outcomes, strong[eps].outcomes)
                        if how == PER_POINT
                        else None
                    ),
                )
        checks[eps] = entry
    return checks


def apply(evaluation: EvaluationSummary, checks: Mapping[float, MaskingEntry]) -> EvaluationSummary:
    """The `of` evaluation's summary with the checked accuracies, where every table reads
    them, the AutoAttack ones kept as `unchecked_robust_accuracy`."""
    checked = {eps: c.combined for eps, c in checks.items() if c.state == CHECKED}
    if not checked:
        return evaluation
    # The per-point outcomes paired comparisons read are the checked ones too: a point counts
    # where it survived both attacks; where the check could only take the lower accuracy, the
    # outcomes no longer give the accuracy, and comparisons fall back to the seeds.
    outcomes = dict(evaluation.outcomes)
    for eps in checked:
        combined = checks[eps].combined_outcomes
        if eps in outcomes and combined is not None:
            outcomes[eps] = dataclasses.replace(outcomes[eps], points=combined)
    return dataclasses.replace(
        evaluation,
        robust_accuracy={**evaluation.robust_accuracy, **checked},
        outcomes=outcomes,
        unchecked_robust_accuracy=dict(evaluation.robust_accuracy),
        checked=tuple(sorted(checked)),
    )


def is_checked(cell: CellResult, name: str, eps: float | None = None) -> bool:
    """Whether the cell's number of evaluation `name` at ε (default: the cell's own) is a
    checked one."""
    evaluation = cell.evaluation(name)
    return evaluation is not None and evaluation.is_checked(cell.eps if eps is None else eps)


def footnote(cell: CellResult, eps: float, entry: MaskingEntry) -> str:
    """ "fastbat-eps16-seed0 at ε = 16: AutoAttack 21.4 → 18.0 (Square-10000×5 alone 18.3;
    Square removed 3.4 points after the white-box parts)"."""
    how = "" if entry.combined_by == PER_POINT else f"; {entry.combined_by}"
    return (
        f"{cell.name} at ε = {eps:g}: AutoAttack {100 * entry.autoattack:.1f} → "
        f"{100 * entry.combined:.1f} ({entry.label} alone {100 * entry.strong:.1f}; "
        f"Square removed {entry.gap:.1f} points after the white-box parts{how})"
    )


def rule_words(check: Mapping[str, Any]) -> str:
    """The rule, for the report."""
    points = f"{check['threshold']:g} point{'' if check['threshold'] == 1 else 's'}"
    return (
        f"{MARK} masking check: where Square, run last in AutoAttack, removed more than "
        f"{points} beyond what its white-box parts left (a sign of "
        f"gradient masking), {check['label']} also attacked the cell on the same test points; "
        "a point counts as robust only if it survived both, and that robust accuracy is the "
        "cell's in every table and comparison."
    )
