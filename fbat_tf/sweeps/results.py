"""What a sweep's cells hold: their state, the budgets they lack and their numbers by file."""

from __future__ import annotations

import os

from fbat_tf import run
from fbat_tf.records import (
    AttackResult,
    EvaluationResult,
    Outcomes,
    eps_key,
)
from fbat_tf.sweeps import masking, tuning
from fbat_tf.sweeps.definition import (
    Cell,
    Definition,
    Evaluation,
    expand,
)


def _files(cell_dir: str, evaluation: Evaluation) -> list[str]:
    return evaluation.files(cell_dir)


def _attacked(
    cell_dir: str, evaluation: Evaluation
) -> dict[float, tuple[AttackResult, str, EvaluationResult]]:
    """Each ε's result (records.eps_key: 8.0) over every file of the evaluation, with the file
    and the whole result it came from; where files overlap, eval-<name>.json counts."""
    found: dict[float, tuple[AttackResult, str, EvaluationResult]] = {}
    for name in _files(cell_dir, evaluation):
        path = os.path.join(cell_dir, name)
        result = EvaluationResult.load(path)
        for attacked in result.robust:
            found.setdefault(eps_key(attacked.eps), (attacked, path, result))
    return found


def evaluation_results(cell_dir: str, evaluation: Evaluation) -> dict[float, tuple[float, str]]:
    """Robust accuracy by ε (records.eps_key: 8.0) over every file of the evaluation, with the
    file each number came from; where files overlap, eval-<name>.json counts."""
    return {
        eps: (attacked.robust_accuracy, path)
        for eps, (attacked, path, _) in _attacked(cell_dir, evaluation).items()
    }


def evaluation_outcomes(cell_dir: str, evaluation: Evaluation) -> dict[float, Outcomes]:
    """Per ε, which test points the attacked model got right (one '0' or '1' per evaluated
    point, in order) and on which split, from the file its robust accuracy came from, where
    that file recorded them (evaluate.py's "outcomes", keyed as its robust accuracy)."""
    found = {}
    for eps, (attacked, _, result) in _attacked(cell_dir, evaluation).items():
        points = result.outcomes.get(attacked.key)
        if isinstance(points, str) and points:
            found[eps] = Outcomes(points, result.split)
    return found


def missing_budgets(definition: Definition, cell: Cell, cell_dir: str) -> dict[str, list[float]]:
    """Per evaluation already run, the budgets it lacks (added to the grid since); and under
    the masking check's name, the budgets where the cell's finished AutoAttack triggered it
    and it has not run (masking.lacking)."""
    missing = {}
    for evaluation in definition.evaluations:
        if not os.path.exists(os.path.join(cell_dir, evaluation.file())):
            continue
        have = evaluation_results(cell_dir, evaluation)
        lacking = [eps for eps in evaluation.budgets(definition, cell) if eps_key(eps) not in have]
        if lacking:
            missing[evaluation.name] = lacking
    check = definition.masking_check
    if check is not None:
        lacking = masking.lacking(check, cell_dir)
        if lacking:
            missing[check.name] = lacking
    return missing


def cell_state(cell_dir: str, definition: Definition | None = None) -> str:
    """'done' (trained and evaluated), 'check pending', 'trained', 'diverged', 'started' or
    'new'. 'done' once every evaluation of the definition holds every budget it asks for and,
    where the definition has a masking check, the check has run wherever the finished
    AutoAttack triggered it ('check pending' until then: the check is required only where it
    triggered); a tuning run, under `tuning/`: once trained; without the definition, the
    training's state alone ('trained' at most). A diverged run is not trained again (train.py
    refuses it) nor evaluated."""
    cell = run.Run(cell_dir)
    status = cell.status()
    if status == "diverged":
        return "diverged"
    if status != "complete":
        return "started" if os.path.exists(cell.flags_path) else "new"
    if definition is None:
        return "trained"
    name = os.path.basename(os.path.normpath(cell_dir))
    if os.path.basename(os.path.dirname(os.path.normpath(cell_dir))) == tuning.DIRECTORY:
        return "done"  # a tuning run: trained and validated, never evaluated
    found = next((c for c in expand(definition) if c.name == name), None)
    evaluated = all(
        os.path.exists(os.path.join(cell_dir, e.file())) for e in definition.evaluations
    )
    missing = missing_budgets(definition, found, cell_dir) if evaluated and found else {}
    check = definition.masking_check
    pending = check is not None and check.name in missing
    if set(missing) - ({check.name} if pending else set()):
        evaluated = False
    if not evaluated:
        return "trained"
    return "check pending" if pending else "done"


def finished(definition: Definition, sweep_dir: str, checks: bool = True) -> bool:
    """Whether every final cell of the sweep in `sweep_dir` is done (trained and evaluated) or
    diverged: a sweep still running, or cut short, is not. `checks=False` counts a cell whose
    masking check alone is pending as finished: every evaluation of the definition is in (a
    finished study whose definition gained a check on every cell is such a sweep while the
    check runs)."""
    ended = ("done", "diverged") if checks else ("done", "diverged", "check pending")
    return all(
        cell_state(os.path.join(sweep_dir, cell.name), definition) in ended
        for cell in expand(definition)
    )
