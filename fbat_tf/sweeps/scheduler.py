"""Running a sweep's cells, one after another in this process: each cell's train.py, then its
evaluate.py commands, from the sweep's pinned code, with a line per cell and the report
rewritten after each. Tuning runs come first; a final cell of a tuned unit starts once its
unit's pick is written (tuning.settle, after the unit's last tuning run), with the pick's flags.

    outcome = run_cells(definition, to_run, sweep_dir, code, report, wait_seconds=60)
    outcome.failed, outcome.diverged              # cell names

`report(definition, sweep_dir)` rewrites the sweep's report: the entry point hands it over (the
report lives in the study package, above the launchers, which never import it).

A cell's masking check (sweeps/masking.py) is decided from its finished AutoAttack file, so
`run_cell` plans the cell a second time after an AutoAttack that triggered it.

Several such processes may share one sweep directory: each cell is claimed (claims.py) by the
process that runs it, and cells another live process holds are waited for, then taken over
should it die.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sequence

from fbat_tf.records import files
from fbat_tf.run import Run
from fbat_tf.sweeps import claims, revision, tuning
from fbat_tf.sweeps.definition import Cell, Definition, commands
from fbat_tf.sweeps.results import cell_state, missing_budgets
from fbat_tf.sweeps.steps import Step, run_steps


def new_runs(definition: Definition, known: Sequence[Cell], sweep_dir: str) -> list[Cell]:
    """The tuning runs an extension of a unit's grid added that `known` (a launcher's cells)
    lacks, for the units of its cells, and that have not finished in `sweep_dir`: the launcher
    queues them. (A unit's finished runs are not new: a launcher left with a tuned unit's final
    cells alone would otherwise count them as cells to run or wait for.)"""
    names = {cell.name for cell in known}
    units = {cell.unit for cell in known if cell.unit is not None}
    return [
        c
        for c in tuning.tuning_cells(definition)
        if c.unit in units
        and c.name not in names
        and cell_state(os.path.join(sweep_dir, c.name), definition) not in ("done", "diverged")
    ]


def program(argv: list[str], code: revision.Pinned) -> list[str]:
    """The command line of `python <argv>` with the program taken from the code the cells run."""
    return [sys.executable, os.path.join(code.tree, argv[0]), *argv[1:]]


def remaining(definition: Definition, cell: Cell, sweep_dir: str) -> dict[str, list[str]]:
    """What is left of a cell, as `commands` gives them, by part: its training unless
    finished, then each evaluation it lacks (or the budgets added to the grid since one ran),
    then the masking check where the finished AutoAttack triggered it and it has not run
    (decided from the AutoAttack files: while AutoAttack is still to run, no check); a tuning
    run's training alone. A final cell of a tuned unit has a plan once its pick is in its
    flags."""
    if cell.pending:
        raise ValueError(f"{cell.name} waits for its tuning pick: it cannot be planned yet")
    cell_dir = os.path.join(sweep_dir, cell.name)
    argv = commands(definition, cell, sweep_dir)
    left = {}
    if cell_state(cell_dir) in ("new", "started"):
        left["train"] = argv["train"]
    if cell.stage == "tuning":  # trained and validated only: never evaluated
        return left
    # Budgets added to the grid after an evaluation ran go into a file of their own.
    missing = missing_budgets(definition, cell, cell_dir)
    later = commands(definition, cell, sweep_dir, missing)
    for evaluation in definition.evaluations:
        if not os.path.exists(os.path.join(cell_dir, evaluation.file())):
            left[evaluation.name] = argv[evaluation.name]
        elif evaluation.name in missing:
            left[evaluation.name] = later[evaluation.name]
    check = definition.masking_check
    if check is not None and check.name in missing:
        left[check.name] = later[check.name]
    return left


def plan(definition: Definition, cell: Cell, sweep_dir: str, code: revision.Pinned) -> list[Step]:
    """What is left of a cell (`remaining`), as the steps that do it, each logged beside the
    cells; an evaluation needs the training's weights. The masking check is in the plan made
    after the AutoAttack that triggers it has run, not in the one that runs AutoAttack.
    LinkRefused where the logs' folder or a log is a symbolic link: no step appends behind one
    (and a step opens its log so, too)."""
    cell_dir = os.path.join(sweep_dir, cell.name)
    # Logs beside the cells: train.py wants a new run directory empty.
    log_dir = os.path.join(sweep_dir, "logs")
    files.make_dirs(os.path.dirname(os.path.join(log_dir, cell.name)), inside=sweep_dir)
    needs = (
        Run(cell_dir).best_weights,
        f"{cell_dir} holds a finished training run but not its weights (a clone holds only "
        "the committed results), so it cannot be evaluated: delete "
        f"{Run(cell_dir).results_path} to train it again",
    )
    steps = []
    for part, argv in remaining(definition, cell, sweep_dir).items():
        log = log_path(sweep_dir, cell.name, part)
        files.refuse_links(log, inside=sweep_dir)
        steps.append(Step(part, program(argv, code), log, None if part == "train" else needs))
    return steps


def log_path(sweep_dir: str, name: str, part: str) -> str:
    """The log of a cell's training ("train") or of its evaluations (any other part)."""
    kind = "train" if part == "train" else "evaluate"
    return os.path.join(sweep_dir, "logs", f"{name}.{kind}.log")


def run_cell(
    definition: Definition, cell: Cell, sweep_dir: str, code: revision.Pinned
) -> dict[str, float]:
    """Train (or resume) and evaluate one cell here; seconds spent per part. Where the
    AutoAttack evaluation just run triggers the masking check, a second plan runs it."""
    spent = run_steps(plan(definition, cell, sweep_dir, code), os.getcwd())
    if needs_check(definition, cell, sweep_dir):
        more = run_steps(plan(definition, cell, sweep_dir, code), os.getcwd())
        spent = {part: spent.get(part, 0.0) + more.get(part, 0.0) for part in {**spent, **more}}
    return spent


def needs_check(definition: Definition, cell: Cell, sweep_dir: str) -> bool:
    """Whether the cell's evaluations are done and its masking check is due: the state after
    which a launcher runs the cell once more, for the check alone."""
    return cell_state(os.path.join(sweep_dir, cell.name), definition) == "check pending"


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def by_kind(
    done: Sequence[tuple[tuple[str, str | None], float]], waiting: Sequence[tuple[str, str | None]]
) -> float:
    """Seconds of one process the `waiting` cells would take, each at the mean its kind's done
    cells recorded: a kind is a stage and a tuning unit ((stage, unit)); where no cell of its
    kind is done, its stage's mean, else every done cell's. A tuning run (trained and validated
    only) and a final cell (attacked too) of one unit take very different times."""
    if not done:
        return 0.0
    of_kind: dict[tuple[str, str | None], list[float]] = {}
    of_stage: dict[str, list[float]] = {}
    for kind, seconds in done:
        of_kind.setdefault(kind, []).append(seconds)
        of_stage.setdefault(kind[0], []).append(seconds)
    every = [seconds for _, seconds in done]
    total = 0.0
    for kind in waiting:
        found = of_kind.get(kind) or of_stage.get(kind[0]) or every
        total += sum(found) / len(found)
    return total


@dataclasses.dataclass
class Outcome:
    """The cells a run of the scheduler could not finish: diverged (a finding) or failed."""

    diverged: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)


def ready(definition: Definition, cell: Cell, sweep_dir: str) -> Cell | None:
    """The cell to run now: a tuning run as it is; a final cell with the flags of its tuning
    pick (written into tuning.json first, if its tuning runs have all finished), or None while
    its unit has no pick."""
    if cell.stage == "tuning" or cell.unit is None:
        return cell
    if cell.unit not in definition.picks:
        for entry in tuning.settle(definition, sweep_dir, cell.unit):
            print(tuning.describe_pick(entry), flush=True)
    pick = definition.picks.get(cell.unit)
    if pick is None:
        return None
    return dataclasses.replace(cell, flags={**cell.flags, **pick}, pending=False)


def _unblocked(
    definition: Definition,
    cells: list[Cell],
    sweep_dir: str,
    outcome: Outcome,
    queued: list[Cell],
) -> list[Cell]:
    """The final cells waiting for a pick that can still get one; the others are failed,
    saying why (a tuning run of their unit failed here, or no process runs it)."""
    kept = []
    for cell in cells:
        reason = tuning.blocked(definition, cell, sweep_dir, outcome.failed, queued)
        if reason is None:
            kept.append(cell)
        else:
            outcome.failed.append(cell.name)
            print(f"{cell.name}: FAILED: not run: {reason}", file=sys.stderr)
    return kept


def time_left(
    definition: Definition,
    to_run: list[Cell],
    sweep_dir: str,
    spent_cells: Sequence[tuple[tuple[str, str | None], float]],
) -> float:
    """Seconds until the sweep's cells are done, each at the mean of the cells of its kind this
    process ran (`by_kind`; `spent_cells`: ((stage, unit), seconds) each): the cells of `to_run`
    not finished yet (by any process), shared among this process and the other live ones
    holding claims on them."""
    unfinished = [
        cell
        for cell in to_run
        if cell_state(os.path.join(sweep_dir, cell.name), definition) not in ("done", "diverged")
    ]
    others = {
        (found.get("host"), found.get("pid"))
        for found in (claims.owner(sweep_dir, cell.name) for cell in unfinished)
        if found is not None
    }
    left = by_kind(spent_cells, [(cell.stage, cell.unit) for cell in unfinished])
    return left / (1 + len(others))


def diverged_line(counter: str, cell_dir: str) -> str:
    """Either launcher's line for a cell that diverged in training: a finding, not a failure."""
    return f"{counter}: diverged in training, not evaluated: {Run(cell_dir).divergence_message()}"


def finished_line(cell: Cell, spent: dict[str, float]) -> str:
    """Either launcher's words for a cell that finished, from the seconds of its parts."""
    if cell.stage == "tuning":
        return f"trained in {duration(spent['train'])}, validated (a tuning run: not evaluated)"
    return f"trained in {duration(spent['train'])}, evaluated in {duration(spent['evaluate'])}"


# Rewrites a sweep's report from its files: report(definition, sweep_dir).
Report = Callable[[Definition, str], None]


def rewrite_report(report: Report, definition: Definition, sweep_dir: str) -> None:
    """The report, rewritten after a cell. Where that fails, a warning on standard error says
    why and the cells go on: they are what the sweep is for, and the report is rewritten after
    the next one (`sweep.py --report_only` rewrites it from the files at any time)."""
    try:
        report(definition, sweep_dir)
    except Exception as error:  # noqa: BLE001 (whatever the report trips on, the cells go on)
        print(
            f"warning: {sweep_dir}: the report was not rewritten after this cell "
            f"({type(error).__name__}: {error}); the cells go on, and `sweep.py --report_only` "
            "rewrites it",
            file=sys.stderr,
            flush=True,
        )


def run_cells(
    definition: Definition,
    to_run: list[Cell],
    sweep_dir: str,
    code: revision.Pinned,
    report: Report,
    wait_seconds: float,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Outcome:
    """Run the cells in order (tuning runs first), each claimed while it runs; one line per
    cell (its time, the sweep's, and the time left, `time_left`), the
    report rewritten after each. Cells another live process holds are waited for, and so are
    final cells whose tuning pick is not written yet."""
    outcome = Outcome()
    spent_cells: list[tuple[tuple[str, str | None], float]] = []
    begin = time.perf_counter()
    ran = 0
    pending = sorted(to_run, key=lambda c: c.stage != "tuning")
    while pending:
        waiting, on_tuning = [], []
        for cell in pending:
            found = ready(definition, cell, sweep_dir)
            if found is None:
                on_tuning.append(cell)
                continue
            cell = found
            cell_dir = os.path.join(sweep_dir, cell.name)
            if cell_state(cell_dir, definition) == "done":
                continue  # finished by another process
            claim = claims.take(sweep_dir, cell.name)
            if claim is None:
                waiting.append(cell)
                continue
            ran += 1
            counter = f"[{ran}/{len(to_run)}] {cell.name}"
            try:
                if cell_state(cell_dir, definition) == "done":
                    continue
                spent = run_cell(definition, cell, sweep_dir, code)
            except RuntimeError as error:
                if cell_state(cell_dir) == "diverged":  # a finding, not a failure
                    outcome.diverged.append(cell.name)
                    say(diverged_line(counter, cell_dir))
                else:
                    outcome.failed.append(cell.name)
                    print(f"{counter}: FAILED\n{error}", file=sys.stderr)
                continue
            finally:
                claim.release()
            spent_cells.append(((cell.stage, cell.unit), sum(spent.values())))
            left = time_left(definition, to_run, sweep_dir, spent_cells)
            say(
                f"{counter}: {finished_line(cell, spent)}; sweep "
                f"{duration(time.perf_counter() - begin)} spent, about {duration(left)} left"
            )
            rewrite_report(report, definition, sweep_dir)
        # Runs a unit's grid gained where its best sat at an edge (tuning.grow): queued here.
        fresh = new_runs(definition, to_run, sweep_dir)
        to_run, waiting = [*to_run, *fresh], [*fresh, *waiting]
        on_tuning = _unblocked(definition, on_tuning, sweep_dir, outcome, waiting)
        if waiting:
            names = ", ".join(c.name for c in waiting[:3]) + (", ..." if len(waiting) > 3 else "")
            say(f"waiting for {len(waiting)} cells other sweep.py processes run: {names}")
        if on_tuning:
            units = sorted({c.unit for c in on_tuning})
            say(
                f"{len(on_tuning)} cells wait for the tuning picks of {', '.join(units[:3])}"
                + (", ..." if len(units) > 3 else "")
            )
        if (waiting or on_tuning) and not any(ready(definition, c, sweep_dir) for c in on_tuning):
            time.sleep(wait_seconds)
        pending = sorted(waiting + on_tuning, key=lambda c: c.stage != "tuning")
    return outcome
