"""What the report says of a sweep's cells: every number with the file it came from, the
tuning stage, the paper's numbers and the cost bench, collected into the report's record
(`Report`), which the report's sections read by attribute and `Report.to_dict` writes to
sweep.json."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from fbat_tf import upgrade
from fbat_tf.records import (
    METHOD_LOGS,
    CellCode,
    CellResult,
    CellTuning,
    CodeIdentity,
    EvaluationResult,
    EvaluationSummary,
    RunRecord,
    TrainSummary,
    eps_key,
)
from fbat_tf.sweeps import estimate, masking, tuning
from fbat_tf.sweeps.definition import (
    RESULTS,
    Cell,
    Definition,
    DefinitionError,
    Evaluation,
    commands,
    expand,
)
from fbat_tf.sweeps.results import cell_state, evaluation_outcomes, evaluation_results
from study.paired import MARGIN


def _read(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _mean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else None


def cell_record(definition: Definition, cell: Cell, sweep_dir: str) -> CellResult:
    """Everything the report says of one cell, each number with the file it came from, and
    the commands that made them."""
    cell_dir = os.path.join(sweep_dir, cell.name)
    identity = dict(
        name=cell.name,
        run_dir=cell_dir,
        method=cell.method,
        variant=cell.variant(),
        options=cell.options,
        flags=cell.flags,
        eps=cell.eps,
        seed=cell.seed,
        state=cell_state(cell_dir, definition),
        # The tuning unit whose pick the cell's flags carry, or None; pending: no pick yet.
        tuning=None if cell.unit is None else CellTuning(cell.unit, cell.pending),
        commands={
            name: shlex.join(["python", *argv])
            for name, argv in commands(definition, cell, sweep_dir).items()
        },
    )
    found = upgrade.read_run(os.path.join(cell_dir, RESULTS))
    if found is None:
        return CellResult(**identity, code=CellCode((), False))
    train = train_record(found, os.path.join(cell_dir, RESULTS))
    evaluations = {}
    for evaluation in definition.evaluations:
        summary = _evaluation_record(cell_dir, evaluation)
        if summary is not None:
            evaluations[evaluation.name] = summary
    checks = None
    check = definition.masking_check
    if check is not None and check.of.name in evaluations:
        # At every ε of the AutoAttack evaluation: the gap, whether it triggered, and where it
        # ran the stronger attack's and the combined accuracy, which the tables then read.
        checks = masking.cell_checks(check, cell_dir)
        evaluations[check.of.name] = masking.apply(evaluations[check.of.name], checks)
    checked = [e for e in (checks or {}).values() if e.state == "checked"]
    return CellResult(
        **identity,
        code=cell_code([train, *evaluations.values(), *checked]),
        train=train,
        # How the run named its method ("first-order Fast-BAT"); runs before titles have none.
        title=None if found.method is None else found.method.title,
        evaluations=evaluations,
        masking_check=checks,
    )


def train_record(found: RunRecord, source: str) -> TrainSummary:
    """What the report says of a cell's training run, from its record in today's form
    (upgrade.read_run)."""
    history = found.history
    selected = found.selected_epoch()
    # The implicit term's logs, where the method wrote them (Fast-BAT's full method).
    logged = tuple(name for name in METHOD_LOGS if any(name in e.logs for e in history))
    pgd = [e.val_pgd_accuracy for e in history]
    return TrainSummary(
        source=source,
        status=found.status,
        epochs=found.epochs,
        epochs_run=len(history),
        selected_epoch=None if selected is None else selected.epoch,
        val_clean_accuracy=[e.val_clean_accuracy for e in history],
        val_robust_accuracy=[e.val_robust_accuracy for e in history],
        val_fgsm_accuracy=[e.val_fgsm_accuracy for e in history],
        overfitting_epochs=[e.epoch for e in history if e.overfitting],
        seconds_per_epoch=_mean(e.seconds for e in history),
        train_seconds=sum(e.seconds or 0.0 for e in history),
        optimizer_steps=found.optimizer_steps,
        code=found.code,
        cost_variant=found.method.cost_variant,
        passes=found.method.passes,
        pairing=found.pairing,
        ig_norm_ratio=found.mean_log("ig_norm_ratio"),
        inactive_fraction=found.mean_log("inactive_fraction"),
        method_logs=logged,
        val_pgd_accuracy=pgd if any(v is not None for v in pgd) else None,
    )


def cell_code(parts: list[Any]) -> CellCode:
    """Which code made the cell's numbers, from the parts that ran (its training, evaluations
    and the masking checks that ran): their revisions (None: not a git checkout) and whether
    any of them ran from uncommitted changes. A part without a code block ran before results
    recorded one."""
    ran = [CodeIdentity.of(part.code) for part in parts]
    return CellCode(
        tuple(dict.fromkeys(code.revision for code in ran)),
        any(code.dirty is not False for code in ran),
    )


@dataclasses.dataclass(frozen=True)
class CodeSummary:
    """The sweep's code (`code_summary`): cells per revision (None: not a git checkout), and
    the cells run from uncommitted (or unknown) code or from several revisions, by name."""

    revisions: dict[str | None, int] = dataclasses.field(default_factory=dict)
    dirty_cells: tuple[str, ...] = ()
    mixed_cells: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """As sweep.json holds it."""
        return {
            "revisions": self.revisions,
            "dirty_cells": list(self.dirty_cells),
            "mixed_cells": list(self.mixed_cells),
        }


def code_summary(cells: Sequence[CellResult]) -> CodeSummary:
    """The sweep's code: cells per revision, and the cells run from uncommitted (or unknown)
    code or from several revisions."""
    revisions: dict[str | None, int] = {}
    for cell in cells:
        for found in cell.code.revisions:
            revisions[found] = revisions.get(found, 0) + 1
    return CodeSummary(
        revisions,
        tuple(c.name for c in cells if c.code.dirty),
        tuple(c.name for c in cells if len(c.code.revisions) > 1),
    )


def _evaluation_record(cell_dir: str, evaluation: Evaluation) -> EvaluationSummary | None:
    """What the evaluation's files say: robust accuracy by ε (with its file), and for an
    ensemble the accuracy after each part and the seconds each took, by ε."""
    source = os.path.join(cell_dir, evaluation.file())
    main = EvaluationResult.read(source)
    if main is None:
        return None
    merged = evaluation_results(cell_dir, evaluation)
    # A value that is no accuracy (NaN, a hand edit, a bug) is left out, said so, never used.
    unusable = {
        eps: f"{path}: robust accuracy {value!r} is not a number from 0 to 1, left out"
        for eps, (value, path) in merged.items()
        if not (isinstance(value, (int, float)) and 0 <= value <= 1)
    }
    return EvaluationSummary(
        source=source,
        label=evaluation.label,
        examples=main.examples,
        clean_accuracy=main.clean_accuracy,
        robust_accuracy={eps: value for eps, (value, _) in merged.items() if eps not in unusable},
        unusable=unusable,
        sources={eps: path for eps, (_, path) in merged.items()},
        time_s={eps_key(r.eps): r.seconds for r in main.robust},
        per_part={eps_key(r.eps): r.parts for r in main.robust if r.parts},
        part_seconds={eps_key(r.eps): r.part_seconds for r in main.robust if r.part_seconds},
        code=main.code,
        # Which points each ε's attack left right, where the files recorded them: the paired
        # comparisons then count the test images too (study/paired.py).
        outcomes=evaluation_outcomes(cell_dir, evaluation),
        indicated=_indicated(main),
        indicators_later=() if main.indicators is None else main.indicators.later,
    )


def _indicated(result: EvaluationResult) -> dict[float, tuple[str, ...]]:
    """The indicators and reference checks that fired on each ε's attack of `result`, by name
    (none for a result from before the indicators)."""
    found = result.indicators
    if found is None:
        return {}
    fired: dict[float, tuple[str, ...]] = {}
    for attacked in result.robust:  # several attacks at one ε: what fired on any of them
        names = (*found.fired(attacked.key), *found.checks_fired(attacked.key))
        if names:
            held = fired.get(eps_key(attacked.eps), ())
            fired[eps_key(attacked.eps)] = tuple(dict.fromkeys((*held, *names)))
    return fired


def _portable(path: str) -> str:
    """`path` relative to the working directory when it lies below it, else as given."""
    relative = os.path.relpath(os.path.abspath(path))
    return path if relative.startswith(os.pardir) else relative


@dataclasses.dataclass(frozen=True)
class Report:
    """The sweep's report data (`collect`): the definition's parts, every cell's record, and
    the sections built beside them. Each field has a default (the definition's, or none), so
    that a report made by hand names only what it holds."""

    sweep: str = ""  # the definition's name
    # The definition's path, relative to the working directory as the cells' run directories
    # are, so that the committed report does not name the machine it was written on.
    definition: str = ""
    description: str = ""
    flags: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The definition's evaluations, in its order, and evaluate.py's --batch_size in each.
    evaluations: tuple[Evaluation, ...] = ()
    batch_size: int = Definition.batch_size
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # sweep.py --override
    estimate: dict[str, Any] | None = None  # the GPU time estimate (sweeps/estimate.py)
    eps_values: tuple[float, ...] = ()  # every ε of the grid, ascending
    cells: tuple[CellResult, ...] = ()
    code: CodeSummary = dataclasses.field(default_factory=CodeSummary)
    comparisons: tuple[tuple[str, str], ...] = ()  # the pairs of variants the report compares
    margin: float = MARGIN  # the equivalence margin (points)
    tuning: tuning.Section | None = None  # the tuning stage (tuning.report_section)
    masking_check: masking.MaskingCheck | None = None
    paper: dict[str, Any] | None = None  # the paper-numbers file (load_paper)
    cost: CostBench | None = None  # the cost bench's step times (load_cost)

    def to_dict(self) -> dict[str, Any]:
        """As sweep.json holds it, in its order, up to what write_report adds after (the paper
        rows, robustness against cost, the paired comparisons): the tuning stage, the masking
        check, the paper's numbers and the cost bench only where the definition has them."""
        found = {
            "sweep": self.sweep,
            "definition": self.definition,
            "description": self.description,
            "flags": self.flags,
            "evaluation": {
                "batch_size": self.batch_size,
                "attacks": [evaluation.record() for evaluation in self.evaluations],
            },
            "overrides": self.overrides,
            "estimate": self.estimate,
            "eps_values": list(self.eps_values),
            "cells": [cell.to_dict() for cell in self.cells],
            "code": self.code.to_dict(),
            "comparisons": [list(pair) for pair in self.comparisons],
            "margin": self.margin,
        }
        if self.tuning is not None:
            found["tuning"] = self.tuning.to_dict()
        if self.masking_check is not None:
            found["masking_check"] = self.masking_check.record()
        if self.paper is not None:
            found["paper"] = self.paper
        if self.cost is not None:
            found["cost"] = self.cost.to_dict()
        return found


def collect(definition: Definition, sweep_dir: str) -> Report:
    """The sweep's report data: every cell's record, the tuning stage and the paper's numbers,
    if any."""
    tuning.refresh(definition, sweep_dir)
    cells = tuple(cell_record(definition, c, sweep_dir) for c in expand(definition))
    here = os.path.dirname(definition.path)
    return Report(
        sweep=definition.name,
        definition=_portable(definition.path),
        description=definition.description,
        flags=definition.flags,
        evaluations=tuple(definition.evaluations),
        batch_size=definition.batch_size,
        overrides=definition.overrides,
        estimate=estimate.estimate(definition),
        eps_values=tuple(definition.eps_values()),
        cells=cells,
        code=code_summary(cells),
        comparisons=tuple(tuple(pair) for pair in definition.comparisons),
        margin=definition.margin,
        tuning=tuning.report_section(definition, sweep_dir),
        masking_check=definition.masking_check,
        paper=load_paper(os.path.join(here, definition.paper)) if definition.paper else None,
        cost=load_cost(os.path.join(here, definition.cost)) if definition.cost else None,
    )


@dataclasses.dataclass(frozen=True)
class CostBench:
    """A bench/step_time.py result as the report uses it (`load_cost`): each variant's step
    seconds and those of each round, with the setting and machine they were measured on and
    the command that measured them, as the file gives them."""

    source: str  # the file, relative to the working directory where it lies below it
    setting: dict[str, Any]  # the file's "setting" (model, width, device, machine, load...)
    command: str | None
    step_seconds: dict[str, float]  # by cost variant
    round_step_seconds: dict[str, list[float]]  # by cost variant, a time per round

    def to_dict(self) -> dict[str, Any]:
        """As sweep.json holds it (its "cost")."""
        return {
            "source": self.source,
            "setting": self.setting,
            "command": self.command,
            "step_seconds": self.step_seconds,
            "round_step_seconds": self.round_step_seconds,
        }


def load_cost(path: str) -> CostBench:
    """A bench/step_time.py result as the report uses it: each variant's step seconds, and
    the setting and machine they were measured on."""
    bench = _read(path)
    if bench is None or "methods" not in bench:
        raise DefinitionError(f"{path} is not a bench/step_time.py result with 'methods'")
    return CostBench(
        source=_portable(path),
        setting=bench.get("setting", {}),
        command=bench.get("command"),
        step_seconds={name: m["step_seconds"] for name, m in bench["methods"].items()},
        round_step_seconds={
            name: m.get("round_step_seconds", [m["step_seconds"]])
            for name, m in bench["methods"].items()
        },
    )


def load_paper(path: str) -> dict[str, Any]:
    """Published numbers: {"source": ..., "notes": ..., "rows": [{"table", "label", "method",
    "eps", "attacked_eps" (where it is not eps), "flags" (the train.py flags of the row's
    setting), metric: [mean, std]}]} with metrics among clean, pgd, autoattack (percent) and
    seconds_per_epoch."""
    paper = _read(path)
    if paper is None:
        raise DefinitionError(f"the paper numbers file {path} does not exist")
    return paper
