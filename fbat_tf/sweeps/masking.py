"""A sweep's masking check: a stronger black-box attack beside AutoAttack on the same test
points, and the cell's robust accuracy the two combined; a cell where black-box attacks still
break more than a threshold of points the white-box parts left robust is marked masked.

    "masking_check": {"of": "autoattack", "threshold": 1.0, "on": "every cell",
                      "attack": {"attack": "square", "examples": 500,
                                 "options": {"n_queries": 10000, "restarts": 1}}}

`of` names the definition's AutoAttack (standard) evaluation (default "autoattack");
`threshold` is in percentage points; `attack` is an attack of the registry with its options,
run by evaluate.py into `eval-masking.json` (`name` sets another) at the `of` evaluation's
budgets, on its first `examples` test points (default: all of them).

`on` says where it runs. "triggered" (the default): at each ε where Square removed more than
`threshold` points beyond what AutoAttack's parts before it left, `gap_points` of its recorded
parts compared exactly (1.0 point is not more than 1.0). "every cell": at every ε of every
cell, so that the two methods of a comparison get the same check whatever their AutoAttack
showed.

Once it has run, the checked robust accuracy counts a test point robust only if it survived
both attacks, from the files' per-point `outcomes` ("1" per point still classified correctly,
in the evaluated order, under the key "<attack>@<ε>"; where the check ran on the first
`examples` points only, the points after them count as AutoAttack left them), or, where either
file lacks them, the lower of the two accuracies, said so. What black-box attacks broke beyond
AutoAttack's white-box parts, in points (`residual`): Square's gap inside AutoAttack, plus the
share of the checked points that AutoAttack left robust and the stronger attack broke; more
than `threshold`, and the cell is masked at that ε (`masked`), its number a sign that the
gradients misled the white-box attacks, and every verdict on it says so.

    check = definition.masking_check
    lacking(check, cell_dir)                  # [16.0]: budgets the check is due at and lacks
    checks = cell_checks(check, cell_dir)     # {16.0: MaskingEntry(triggered, gap, ...)}
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, NamedTuple

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

KEYS = ("of", "threshold", "attack", "on")
TRIGGERED, EVERY_CELL = "triggered", "every cell"
ON = (TRIGGERED, EVERY_CELL)
ATTACK_KEYS = ("attack", "name", "examples", "options")
DEFAULT_NAME = "masking"
# The mark of a checked number in the report's tables, and of a masked cell's.
MARK = "‡"
MASKED_MARK = "§"
PER_POINT = "per point"


@dataclasses.dataclass(frozen=True)
class MaskingCheck:
    """The definition's "masking_check": the evaluation it reads (`of`), its threshold
    (points), the stronger attack, as an evaluation at the `of` evaluation's budgets on its
    first `evaluation.examples` points, and where it runs (`on`: TRIGGERED or EVERY_CELL)."""

    of: Evaluation
    threshold: float
    evaluation: Evaluation
    on: str = TRIGGERED

    @property
    def name(self) -> str:
        return self.evaluation.name

    def record(self) -> dict[str, Any]:
        return {
            "of": self.of.name,
            "threshold": self.threshold,
            "on": self.on,
            **self.evaluation.record(),
        }


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
    on = given.get("on", TRIGGERED)
    if on not in ON:
        raise DefinitionError(f"{where}.on: give one of {list(ON)}, got {on!r}")
    examples = spec.get("examples", of.examples)
    if (
        not isinstance(examples, int)
        or isinstance(examples, bool)
        or not 1 <= examples <= of.examples
    ):
        raise DefinitionError(
            f"{where}.attack.examples: the check runs on the test points of {of_name!r}, its "
            f"first {of.examples} or fewer of them; got {examples!r}"
        )
    found = parse_evaluation(f"{where}.attack", spec, DEFAULT_NAME, ATTACK_KEYS)
    if any(e.name == found.name for e in evaluations):
        raise DefinitionError(
            f"{where}.attack.name: {found.name!r} is an evaluation's name already; give another"
        )
    evaluation = dataclasses.replace(found, eps=of.eps, examples=examples)
    return MaskingCheck(of, float(threshold), evaluation, on)


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


class Decision(NamedTuple):
    """The rule on one AutoAttack result (`decide`)."""

    gap: Fraction | None  # points, exact; None without Square last
    triggered: bool  # the gap is more than the threshold


def decide(parts: Mapping[str, float], examples: int, threshold: float) -> Decision:
    """The rule on one AutoAttack result: its gap (points, exact; None without Square last)
    and whether it is more than `threshold` points."""
    gap = gap_points(parts, examples)
    return Decision(gap, exceeds(gap, threshold))


def _due(check: MaskingCheck, found: _Found) -> bool:
    """Whether the check runs where AutoAttack found `found`: everywhere "on every cell",
    else where its gap triggers it."""
    return check.on == EVERY_CELL or decide(found.parts, found.examples, check.threshold).triggered


def lacking(check: MaskingCheck, cell_dir: str) -> list[float]:
    """The budgets (1/255) at which the check is due after the cell's finished AutoAttack and
    no file of the check holds its result; [] before the AutoAttack evaluation has run."""
    done = _found(cell_dir, check.evaluation)
    due = [eps for eps, found in _found(cell_dir, check.of).items() if _due(check, found)]
    return sorted(eps for eps in due if eps not in done)


def _per_point(first: _Found, second: _Found) -> str:
    """The points (in `first`'s order) that survived both, where `second` attacked the first
    of `first`'s points (all or fewer); ValueError where their outcomes do not allow it."""
    assert first.outcomes is not None and second.outcomes is not None
    checked = len(second.outcomes)
    if checked > len(first.outcomes):
        raise ValueError(
            f"the check holds {checked} points, AutoAttack {len(first.outcomes)}: not its points"
        )
    head = combined_outcomes(first.outcomes[:checked], second.outcomes)
    return head + first.outcomes[checked:]


def combine(first: _Found, second: _Found) -> tuple[float, str]:
    """The robust accuracy of points that survived both attacks, and how it was reached: per
    point where both files hold outcomes of the same points (`second` on the first of
    `first`'s), else the lower accuracy."""
    if first.outcomes is None or second.outcomes is None:
        lacks = " and ".join(
            os.path.basename(f.source) for f in (first, second) if f.outcomes is None
        )
        return min(first.accuracy, second.accuracy), (
            f"the lower of the two accuracies: {lacks} holds no per-point outcomes"
        )
    if (
        first.clean is not None
        and second.clean is not None
        and first.clean[: len(second.clean)] != second.clean
    ):
        return min(first.accuracy, second.accuracy), (
            "the lower of the two accuracies: the files' clean outcomes differ (not the same "
            "test points)"
        )
    try:
        both = _per_point(first, second)
    except ValueError as error:
        return min(first.accuracy, second.accuracy), f"the lower of the two accuracies: {error}"
    return both.count("1") / len(both) if both else 0.0, PER_POINT


def residual(first: _Found, second: _Found, gap: Fraction | None, how: str) -> Fraction | None:
    """What black-box attacks broke beyond AutoAttack's white-box parts, in points: Square's
    `gap` inside AutoAttack plus, of the points the check attacked, the share AutoAttack left
    robust and the stronger attack broke (per point; else, on equal points, the drop of the
    combined accuracy below AutoAttack's). None without a gap."""
    if gap is None:
        return None
    if how == PER_POINT:
        assert first.outcomes is not None and second.outcomes is not None
        checked = len(second.outcomes)
        broke = sum(
            a == "1" and b == "0" for a, b in zip(first.outcomes, second.outcomes, strict=False)
        )
        return gap + Fraction(100 * broke, checked)
    if second.examples != first.examples:
        return None
    return gap + Fraction(f"{100 * max(0.0, first.accuracy - second.accuracy):.9f}")


def cell_checks(check: MaskingCheck, cell_dir: str) -> dict[float, MaskingEntry]:
    """What the check says of a cell at each ε its AutoAttack ran: the gap (points) and
    whether it triggered; where the check is due, the stronger attack's accuracy, the
    combined one and whether the cell is masked once it has run ("checked"), else
    "pending"."""
    strong = _found(cell_dir, check.evaluation)
    checks = {}
    for eps, found in _found(cell_dir, check.of).items():
        decided = decide(found.parts, found.examples, check.threshold)
        entry = MaskingEntry(
            triggered=decided.triggered,
            gap=None if decided.gap is None else float(decided.gap),
            threshold=check.threshold,
            autoattack=found.accuracy,
            source=found.source,
            state=NOT_TRIGGERED,
        )
        if _due(check, found):
            entry = dataclasses.replace(entry, label=check.evaluation.label, state=PENDING)
            if eps in strong:
                accuracy, how = combine(found, strong[eps])
                left = residual(found, strong[eps], decided.gap, how)
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
                        _per_point(found, strong[eps]) if how == PER_POINT else None
                    ),
                    residual=None if left is None else float(left),
                    masked=None if left is None else exceeds(left, check.threshold),
                    checked_examples=strong[eps].examples,
                )
        checks[eps] = entry
    return checks


def pending_reason(check: MaskingCheck, cell_dir: str) -> str:
    """Why a cell's check is due, as the dry run prints it: at each budget still unchecked,
    the points Square removed after the white-box parts, and either the threshold that gap
    passed (a triggered check) or that the check runs on every cell whatever the gap."""
    due = ", ".join(
        f"ε = {eps:g}: Square removed {entry.gap:.1f} points after the white-box parts"
        for eps, entry in cell_checks(check, cell_dir).items()
        if entry.state == PENDING
    )
    if check.on == EVERY_CELL:
        return f"masking check pending (run on every cell; {due})"
    return f"masking check pending ({due}; more than {check.threshold:g})"


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
    on = "" if entry.checked_examples is None else f" on the first {entry.checked_examples} points"
    said = ""
    if entry.residual is not None:
        said = f"; black-box attacks broke {entry.residual:.1f} points beyond them"
        said += f", masked {MASKED_MARK}" if entry.masked else ""
    return (
        f"{cell.name} at ε = {eps:g}: AutoAttack {100 * entry.autoattack:.1f} → "
        f"{100 * entry.combined:.1f} ({entry.label}{on} alone {100 * entry.strong:.1f}; "
        f"Square removed {entry.gap:.1f} points after the white-box parts{said}{how})"
    )


def rule_words(check: MaskingCheck) -> str:
    """The rule, for the report."""
    points = f"{check.threshold:g} point{'' if check.threshold == 1 else 's'}"
    where = (
        "on every cell at every ε (both sides of every comparison get the same check)"
        if check.on == EVERY_CELL
        else f"where Square, run last in AutoAttack, removed more than {points} beyond what its "
        "white-box parts left (a sign of gradient masking)"
    )
    return (
        f"{MARK} masking check: {where}, {check.evaluation.label} also attacked the cell "
        f"on AutoAttack's first {check.evaluation.examples} test points; a point counts as "
        "robust only if it survived both, and that robust accuracy is the cell's in every "
        f"table and comparison. {MASKED_MARK} masked: black-box attacks broke more than {points} "
        "beyond what AutoAttack's white-box parts left (Square's gap inside AutoAttack plus "
        "the share of the checked points the stronger attack broke); that cell's number, and "
        "every verdict on it, may overestimate its robustness."
    )
