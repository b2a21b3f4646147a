"""The masking check of a sweep (fbat_tf/sweeps/masking.py): the trigger against a hand
calculation and its edge cases, the per-point combination of two attacks' outcomes, the
definition's key refused where it is wrong, the cell's state with a check that is required only
where its finished AutoAttack triggered it (the launcher planning it after AutoAttack), and the
report's marks, on a sweep directory of cells written by the project's own writers. Last,
evaluate.py with the stronger Square's options on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from fractions import Fraction

import pytest

import study
from fbat_tf import catalog, sweeps
from fbat_tf.attacks.masking import combined_outcomes, exceeds, gap_points, masking_gap
from fbat_tf.records import (
    AttackResult,
    Epoch,
    EvaluationResult,
    MethodRecord,
    RunRecord,
    TrainConfig,
)
from fbat_tf.sweeps import masking, revision, scheduler
from fbat_tf.sweeps.errors import DefinitionError
from study import costs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
STRONG = {"attack": "square", "options": {"n_queries": 10000, "restarts": 5}}
CHECK = {"of": "autoattack", "threshold": 1.0, "attack": STRONG}


# The trigger -----------------------------------------------------------------------------------


def parts(square: float) -> dict[str, float]:
    """AutoAttack standard's robust accuracy after each part, as an evaluation records them."""
    return {"clean": 0.80, "apgd-ce": 0.30, "apgd-t": 0.250, "fab-t": 0.250, "square": square}


def test_the_trigger_is_more_than_the_threshold_in_points_compared_exactly():
    # 25.0 % after FAB-T, 24.0 % after Square: Square removed 1.0 point, not more than 1.0.
    assert gap_points(parts(0.240), 1000) == Fraction(1)
    assert masking.decide(parts(0.240), 1000, 1.0) == (Fraction(1), False)
    # In floating point the same gap is above 1.0: the rule reads the counts behind it.
    assert 100 * masking_gap(parts(0.240)) > 1.0
    # 23.8 %: 1.2 points > 1.0.
    found = masking.decide(parts(0.238), 1000, 1.0)
    assert (found.gap, found.triggered) == (Fraction(6, 5), True)
    # On 500 points a point is 0.2: 12 robust examples after FAB-T... 5 fewer is 1.0 point.
    assert gap_points(parts(0.240), 500) == Fraction(1)
    assert exceeds(Fraction(1), 0.999) and not exceeds(Fraction(0), 0.0)
    assert exceeds(Fraction(6, 5), 1.1) and not exceeds(Fraction(6, 5), 1.2)


def test_no_gap_without_square_last_after_another_part():
    no_square = {"clean": 0.8, "apgd-ce": 0.3, "apgd-dlr": 0.28}  # AutoAttack "rand"
    assert gap_points(no_square, 1000) is None and masking_gap(no_square) is None
    square_first = {"clean": 0.8, "square": 0.4, "apgd-ce": 0.3, "apgd-t": 0.2}
    assert gap_points(square_first, 1000) is None  # later parts may have broken what it broke
    alone = {"clean": 0.8, "square": 0.5}
    assert gap_points(alone, 1000) is None
    # Square right after APGD-CE (a custom ensemble): what it broke beyond APGD-CE.
    assert gap_points({"clean": 0.8, "apgd-ce": 0.3, "square": 0.29}, 100) == Fraction(1)
    assert masking.decide(square_first, 1000, 0.0) == (None, False)
    # An accuracy that is no count of the examples (a mean) is read to 1e-9 of a point.
    assert gap_points({"apgd-t": 1 / 3, "square": 1 / 3 - 0.0125}, 7) == Fraction("1.25")


# The per-point combination ----------------------------------------------------------------------


def test_a_point_is_robust_only_if_it_survived_both_attacks():
    autoattack = "1101100110"  # 6 of 10
    strong = "1011100111"  # 7 of 10
    assert combined_outcomes(autoattack, strong) == "1001100110"  # 5 of 10
    first = masking._Found(0.6, "a/eval-autoattack.json", 10, autoattack, "1" * 10, {}, None)
    second = masking._Found(0.7, "a/eval-masking.json", 10, strong, "1" * 10, {}, None)
    assert masking.combine(first, second) == (0.5, "per point")  # below the lower of 0.6, 0.7
    # A file without outcomes (written before they were): the lower accuracy, said so.
    older = masking._Found(0.7, "a/eval-masking.json", 10, None, None, {}, None)
    accuracy, how = masking.combine(first, older)
    assert accuracy == 0.6 and "eval-masking.json holds no per-point outcomes" in how
    # Outcomes of other points are not combined.
    other = masking._Found(0.7, "a/eval-masking.json", 10, strong, "0" + "1" * 9, {}, None)
    assert masking.combine(first, other)[0] == 0.6
    with pytest.raises(ValueError, match="cannot be combined"):
        combined_outcomes("10", "101")


# The definition ---------------------------------------------------------------------------------

EVALUATION = {
    "batch_size": 20,
    "attacks": [{"attack": "autoattack", "eps": "own", "examples": 20}],
}


def definition_file(directory, check, grid=None, **extra) -> str:
    path = os.path.join(directory, "masked.json")
    with open(path, "w") as f:
        json.dump(
            {
                "description": "a masking check",
                "flags": {"dataset": "fashion_mnist", "model": "small_cnn", "epochs": 1},
                "grid": grid or [{"method": ["fastbat"], "eps": [16], "seed": [0]}],
                "evaluation": EVALUATION,
                **({} if check is None else {"masking_check": check}),
                **extra,
            },
            f,
        )
    return path


@pytest.mark.parametrize(
    ("check", "named"),
    [
        ([1.0], "masking_check: give an object"),
        ({**CHECK, "when": "always"}, "masking_check: unknown keys ['when']"),
        ({**CHECK, "of": "pgd"}, "masking_check.of: 'pgd' names no evaluation"),
        ({**CHECK, "threshold": "1"}, "masking_check.threshold"),
        ({**CHECK, "threshold": -0.5}, "masking_check.threshold"),
        ({"of": "autoattack", "attack": STRONG}, "masking_check.threshold"),
        ({**CHECK, "attack": "square"}, "masking_check.attack: give an object"),
        ({**CHECK, "attack": {**STRONG, "examples": 1000}}, "masking_check.attack.examples"),
        ({**CHECK, "attack": {**STRONG, "examples": 21}}, "first 20 or fewer of them; got 21"),
        ({**CHECK, "attack": {**STRONG, "examples": 0}}, "masking_check.attack.examples"),
        ({**CHECK, "attack": {**STRONG, "examples": True}}, "masking_check.attack.examples"),
        ({**CHECK, "attack": {**STRONG, "examples": 10.0}}, "masking_check.attack.examples"),
        ({**CHECK, "on": "always"}, "masking_check.on: give one of ['triggered', 'every cell']"),
        ({**CHECK, "on": True}, "masking_check.on"),
        ({**CHECK, "attack": {**STRONG, "eps": [16]}}, "masking_check.attack: unknown keys"),
        ({**CHECK, "attack": {"attack": "squares"}}, "masking_check.attack: unknown attack"),
        (
            {**CHECK, "attack": {"attack": "square", "options": {"p_init": 0.5}}},
            "masking_check.attack: attack 'square' takes no option(s) ['p_init']",
        ),
        (
            {**CHECK, "attack": {**STRONG, "name": "autoattack"}},
            "masking_check.attack.name: 'autoattack' is an evaluation's name",
        ),
    ],
)
def test_a_wrong_masking_check_is_refused_at_load_naming_its_key(tmp_path, check, named):
    with pytest.raises(DefinitionError) as refused:
        sweeps.load_definition(definition_file(tmp_path, check))
    assert named in str(refused.value)


def test_the_check_reads_an_autoattack_standard_evaluation(tmp_path):
    path = os.path.join(tmp_path, "pgd.json")
    with open(definition_file(tmp_path, CHECK)) as f:
        raw = json.load(f)
    raw["evaluation"]["attacks"] = [{"attack": "pgd", "eps": "own", "examples": 20}]
    with open(path, "w") as f:
        json.dump({**raw, "masking_check": {**CHECK, "of": "pgd"}}, f)
    with pytest.raises(DefinitionError, match="masking_check.of: 'pgd' must be an AutoAttack"):
        sweeps.load_definition(path)
    check = sweeps.load_definition(definition_file(tmp_path, CHECK)).masking_check
    # On the AutoAttack evaluation's points: its examples and budgets; into eval-masking.json.
    assert (check.of.name, check.threshold, check.name) == ("autoattack", 1.0, "masking")
    assert (check.evaluation.examples, check.evaluation.eps) == (20, "own")
    assert check.evaluation.label == "Square-10000×5"
    assert sweeps.load_definition(definition_file(tmp_path, None)).masking_check is None


# Cells written by the project's writers ---------------------------------------------------------

CODE = {"package": "fbat-tf", "revision": "0" * 40, "dirty": False}


def write_cell(sweep_dir: str, name: str, eps: float = 16.0) -> str:
    """A finished training run, as train.py records it, with 100 optimizer steps of a method
    that makes 2 forward and 2 backward passes a step."""
    cell = os.path.join(sweep_dir, name)
    os.makedirs(cell)
    history = [
        {"val_robust_accuracy": 0.3, "val_clean_accuracy": 0.8, "epoch_time": 2.0},
        {"val_robust_accuracy": 0.4, "val_clean_accuracy": 0.8, "epoch_time": 2.0},
    ]
    RunRecord(
        TrainConfig(workdir=cell, method=name.split("-")[0], eps=eps / 255),
        status="complete",
        history=[Epoch(i + 1, logs) for i, logs in enumerate(history)],
        epochs=2,
        optimizer_steps=100,
        method=MethodRecord(passes=catalog.counts(2, 2)),
        code=CODE,
    ).save(os.path.join(cell, sweeps.RESULTS))
    with open(os.path.join(cell, sweeps.FLAGS_FILE), "w") as f:
        f.write(f"--method={name.split('-')[0]}\n")
    return cell


def write_evaluation(cell: str, file: str, attack: str, eps: float, robust: float, **more):
    """An evaluation's result of 20 test points as evaluate.py saves it; `parts` for an
    ensemble, `outcomes` ({"clean": ..., attack: ...}) where the file holds them."""
    outcomes = more.get("outcomes")
    kept = {}
    if outcomes is not None:  # a whole record of them, as evaluate.py keeps: each part's too
        key = f"{attack}@{eps:g}"
        kept = {"clean": outcomes["clean"], key: outcomes[attack]}
        for part, accuracy in more.get("parts", {}).items():
            if part != "clean":
                right = round(accuracy * 20)
                same = right == outcomes[attack].count("1")
                kept[f"{key}/{part}"] = (
                    outcomes[attack] if same else "1" * right + "0" * (20 - right)
                )
    EvaluationResult(
        20,
        0.8,
        robust=[AttackResult(attack, eps, robust, 10.0, more.get("parts", {}))],
        code=CODE,
        outcomes=kept,
    ).save(os.path.join(cell, file))


CLEAN = "1" * 16 + "0" * 4
ONE_PER_POINT = 0.05  # of 20 test points


def test_the_check_is_required_only_where_the_finished_autoattack_triggers_it(tmp_path):
    definition = sweeps.load_definition(definition_file(tmp_path, CHECK))
    (cell,) = sweeps.expand(definition)
    out = str(tmp_path / "out")
    cell_dir = write_cell(out, cell.name)
    code = revision.Pinned(tree=ROOT, revision=None)

    # Before AutoAttack has run the check is undecided: not in the plan, not required.
    assert sweeps.cell_state(cell_dir, definition) == "trained"
    assert [s.part for s in scheduler.plan(definition, cell, out, code)] == ["autoattack"]
    assert "masking" not in sweeps.commands(definition, cell, out)

    # AutoAttack removed one point of 20 after FAB-T: 5 points > 1.0.
    triggering = {**parts(0.40), "fab-t": 0.45, "apgd-t": 0.45}
    write_evaluation(cell_dir, "eval-autoattack.json", "autoattack", 16, 0.40, parts=triggering)
    assert sweeps.cell_state(cell_dir, definition) == "check pending"
    assert sweeps.missing_budgets(definition, cell, cell_dir) == {"masking": [16.0]}
    (step,) = scheduler.plan(definition, cell, out, code)
    words = sweeps.commands(definition, cell, out, {"masking": [16.0]})["masking"]
    assert step.part == "masking" and step.command[2:] == words[1:]
    for word in (
        "--attacks=square",
        "--eps=16",
        "--square_n_queries=10000",
        "--square_restarts=5",
        "--n_examples=20",
        "--batch_size=20",
        f"--results={os.path.join(cell_dir, 'eval-masking.json')}",
    ):
        assert word in words, word
    checks = study.cell_record(definition, cell, out).masking_check
    assert checks[16.0].state == "pending" and checks[16.0].gap == 5.0

    write_evaluation(cell_dir, "eval-masking.json", "square", 16, 0.40)
    assert sweeps.cell_state(cell_dir, definition) == "done"
    assert scheduler.plan(definition, cell, out, code) == []

    # Where Square removed nothing, no check is asked for: done without eval-masking.json.
    os.remove(os.path.join(cell_dir, "eval-masking.json"))
    os.remove(os.path.join(cell_dir, "eval-autoattack.json"))
    write_evaluation(cell_dir, "eval-autoattack.json", "autoattack", 16, 0.45, parts=parts(0.25))
    assert sweeps.cell_state(cell_dir, definition) == "done"
    assert study.cell_record(definition, cell, out).to_dict()["masking_check"]["16"] == {
        "triggered": False,
        "gap": 0.0,
        "threshold": 1.0,
        "autoattack": 0.45,
        "source": os.path.join(cell_dir, "eval-autoattack.json"),
        "state": "not triggered",
    }


def write_check(cell: str, eps: float, outcomes: str, clean: str) -> None:
    """The stronger attack's result on the first len(outcomes) test points, as evaluate.py
    --n_examples=N saves it."""
    n = len(outcomes)
    EvaluationResult(
        n,
        clean.count("1") / n,
        robust=[AttackResult("square", eps, outcomes.count("1") / n, 10.0, {})],
        code=CODE,
        outcomes={"clean": clean, f"square@{eps:g}": outcomes},
    ).save(os.path.join(cell, "eval-masking.json"))


EVERY_CELL = {**CHECK, "on": "every cell", "attack": {**STRONG, "examples": 10}}


def test_on_every_cell_the_check_runs_on_the_first_points_whatever_autoattack_showed(tmp_path):
    definition = sweeps.load_definition(definition_file(tmp_path, EVERY_CELL))
    assert (definition.masking_check.on, definition.masking_check.evaluation.examples) == (
        "every cell",
        10,
    )
    (cell,) = sweeps.expand(definition)
    out = str(tmp_path / "out")
    cell_dir = write_cell(out, cell.name)
    code = revision.Pinned(tree=ROOT, revision=None)
    # AutoAttack's Square removed nothing (no trigger), and the check is due all the same.
    robust = "1" * 10 + "0" * 10
    found = {**parts(0.50), "apgd-t": 0.50, "fab-t": 0.50}
    write_evaluation(
        cell_dir,
        "eval-autoattack.json",
        "autoattack",
        16,
        0.50,
        parts=found,
        outcomes={"clean": CLEAN, "autoattack": robust},
    )
    assert sweeps.cell_state(cell_dir, definition) == "check pending"
    # Not finished, though every evaluation of the definition is in.
    assert not sweeps.finished(definition, out) and sweeps.finished(definition, out, checks=False)
    # The dry run says why, without the threshold that a gap of 0 did not pass.
    assert masking.pending_reason(definition.masking_check, cell_dir) == (
        "masking check pending (run on every cell; ε = 16: Square removed 0.0 points after the "
        "white-box parts)"
    )
    assert sweeps.missing_budgets(definition, cell, cell_dir) == {"masking": [16.0]}
    (step,) = scheduler.plan(definition, cell, out, code)
    assert step.part == "masking" and "--n_examples=10" in step.command

    # Square-10000 broke 2 of the first 10 points AutoAttack left robust: by hand, 8 of 20
    # survive both (the last 10 as AutoAttack left them), and black-box attacks broke
    # 0 (Square's gap in AutoAttack) + 100 * 2/10 = 20 points beyond the white-box parts.
    write_check(cell_dir, 16, "1111111100", CLEAN[:10])
    assert sweeps.cell_state(cell_dir, definition) == "done"
    record = study.cell_record(definition, cell, out)
    entry = record.masking_check[16.0]
    assert (entry.state, entry.triggered, entry.combined_by) == ("checked", False, "per point")
    assert entry.combined == pytest.approx(8 / 20) and entry.checked_examples == 10
    assert entry.residual == pytest.approx(20.0) and entry.masked is True
    assert entry.combined_outcomes == "1111111100" + "0" * 10
    assert record.evaluation("autoattack").robust_accuracy == {16.0: pytest.approx(0.40)}
    assert masking.footnote(record, 16.0, entry).endswith(
        "(Square-10000×5 on the first 10 points alone 80.0; Square removed 0.0 points after the "
        "white-box parts; black-box attacks broke 20.0 points beyond them, masked §)"
    )
    table = study.markdown(study.collect(definition, out))
    assert f"| fastbat {masking.MARK} {masking.MASKED_MARK} |" in table.replace("  ", " ")


# AutoAttack left the first 10 of 20 points robust.
HALF_ROBUST = "1" * 10 + "0" * 10


def _half_robust_cell(tmp_path, check, found):
    """A one-cell sweep with `check`, whose AutoAttack at 16 (parts `found`) left HALF_ROBUST:
    (definition, cell, sweep folder, cell folder)."""
    definition = sweeps.load_definition(definition_file(tmp_path, check))
    (cell,) = sweeps.expand(definition)
    out = str(tmp_path / "out")
    cell_dir = write_cell(out, cell.name)
    outcomes = {"clean": CLEAN, "autoattack": HALF_ROBUST}
    write_evaluation(
        cell_dir, "eval-autoattack.json", "autoattack", 16, 0.5, parts=found, outcomes=outcomes
    )
    return definition, cell, out, cell_dir


@pytest.mark.parametrize(
    ("threshold", "broke", "masked"),
    [
        (15.0, 1, False),
        (14.999, 1, True),
        (25.0, 2, False),
        (24.9, 2, True),
        (5.0, 0, False),
        (4.9, 0, True),
    ],
)
def test_masked_is_more_than_the_threshold_with_squares_gap_counted_exactly(
    tmp_path, threshold, broke, masked
):
    """AutoAttack's Square broke 1 of 20 points (5 points), the check `broke` of the first 10
    AutoAttack left robust (10 points each): masked only beyond the threshold, exactly."""
    found = {**parts(0.50), "apgd-t": 0.55, "fab-t": 0.55}
    definition, cell, out, cell_dir = _half_robust_cell(
        tmp_path, {**EVERY_CELL, "threshold": threshold}, found
    )
    write_check(cell_dir, 16, "1" * (10 - broke) + "0" * broke, CLEAN[:10])
    entry = study.cell_record(definition, cell, out).masking_check[16.0]
    assert entry.residual == pytest.approx(5.0 + 10.0 * broke)
    assert entry.masked is masked
    assert entry.combined == pytest.approx((10 - broke) / 20)
    assert masking.residual(
        masking._Found(0.5, "a", 20, HALF_ROBUST, CLEAN, found, None),
        masking._Found(0.8, "b", 10, "1" * (10 - broke) + "0" * broke, CLEAN[:10], {}, None),
        Fraction(5),
        masking.PER_POINT,
    ) == Fraction(5 + 10 * broke)


def test_a_check_of_other_points_is_not_combined_point_by_point(tmp_path):
    found = {**parts(0.50), "apgd-t": 0.50, "fab-t": 0.50}
    definition, cell, out, cell_dir = _half_robust_cell(tmp_path, EVERY_CELL, found)
    # Its clean outcomes are not those of AutoAttack's first 10 points: other test points.
    write_check(cell_dir, 16, "0111111100", "0" + "1" * 9)
    entry = study.cell_record(definition, cell, out).masking_check[16.0]
    assert entry.combined_by.startswith("the lower of the two accuracies: the files' clean")
    assert entry.combined == pytest.approx(0.5) and entry.combined_outcomes is None


def test_a_cell_runs_its_check_after_the_autoattack_that_triggers_it(tmp_path, monkeypatch):
    """The launcher plans a cell, runs it, and plans it again where the AutoAttack it just ran
    triggered the check: a second round of the check alone. A killed sweep resumes the same
    way, from the files."""
    definition = sweeps.load_definition(definition_file(tmp_path, CHECK))
    (cell,) = sweeps.expand(definition)
    out = str(tmp_path / "out")
    cell_dir = write_cell(out, cell.name)
    rounds = []

    def run_steps(steps, cwd):
        rounds.append([step.part for step in steps])
        for step in steps:  # what evaluate.py would write
            if step.part == "autoattack":
                found = {**parts(0.40), "fab-t": 0.45, "apgd-t": 0.45}
                write_evaluation(
                    cell_dir, "eval-autoattack.json", "autoattack", 16, 0.4, parts=found
                )
            elif step.part == "masking":
                write_evaluation(cell_dir, "eval-masking.json", "square", 16, 0.35)
        return {"train": 0.0, "evaluate": 1.0}

    monkeypatch.setattr(scheduler, "run_steps", run_steps)
    code = revision.Pinned(tree=ROOT, revision=None)
    spent = scheduler.run_cell(definition, cell, out, code)
    assert rounds == [["autoattack"], ["masking"]] and spent["evaluate"] == 2.0
    assert sweeps.cell_state(cell_dir, definition) == "done"
    record = study.cell_record(definition, cell, out)
    # Without outcomes in these files: the lower accuracy, said so.
    assert record.evaluation("autoattack").robust_accuracy == {16.0: 0.35}
    assert "holds no per-point outcomes" in record.masking_check[16.0].combined_by


def trained_cell(out: str, cell) -> str:
    """`cell` trained, its flags.txt as train.py writes them (ε in its own units)."""
    cell_dir = write_cell(out, cell.name)
    with open(os.path.join(cell_dir, sweeps.FLAGS_FILE), "w") as f:
        f.write("\n".join(sweeps.flag_words({**cell.flags, "eps": "16.0"})) + "\n")
    return cell_dir


def dry_run(*words: str, cwd: str = ROOT) -> subprocess.CompletedProcess:
    """`python sweep.py WORDS --dry_run` from `cwd`, as a user types it; it must succeed."""
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "sweep.py"), *words, "--dry_run"],
        cwd=cwd,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_dry_run_shows_a_pending_check_and_its_command(tmp_path):
    definition = sweeps.load_definition(definition_file(tmp_path, CHECK))
    (cell,) = sweeps.expand(definition)
    out = str(tmp_path / "out")
    cell_dir = trained_cell(out, cell)
    found = {**parts(0.40), "fab-t": 0.45, "apgd-t": 0.45}
    write_evaluation(cell_dir, "eval-autoattack.json", "autoattack", 16, 0.4, parts=found)
    done = dry_run(f"--sweep={definition.path}", f"--sweep_dir={out}")
    lines = done.stdout.splitlines()
    at = lines.index(f"{cell.name}: check pending")
    assert lines[at + 1] == (
        "  masking check pending (ε = 16: Square removed 5.0 points after the white-box parts; "
        "more than 1)"
    )
    assert lines[at + 2].startswith("  train: python train.py")
    (masking_line,) = [line for line in lines if line.startswith("  masking: ")]
    assert "--attacks=square" in masking_line and "--square_restarts=5" in masking_line
    assert "1 cells: 1 check pending" in done.stdout


def test_the_dry_run_times_a_cell_whose_check_alone_is_left_by_the_checks_done(tmp_path):
    """A cell whose masking check is all it lacks is timed at the mean of the checks done cells
    ran (10 s here), not at a whole cell's training and attacks (24 s); the check's file is read
    where the report names it, from where sweep.py runs."""
    grid = [{"method": ["fastbat"], "eps": [16], "seed": [0, 1]}]
    definition = sweeps.load_definition(definition_file(tmp_path, EVERY_CELL, grid=grid))
    out = str(tmp_path / "out")
    found = {**parts(0.50), "apgd-t": 0.50, "fab-t": 0.50}
    cells = sweeps.expand(definition)
    for cell in cells:
        cell_dir = trained_cell(out, cell)
        robust = {"clean": CLEAN, "autoattack": "1" * 10 + "0" * 10}
        write_evaluation(
            cell_dir, "eval-autoattack.json", "autoattack", 16, 0.5, parts=found, outcomes=robust
        )
    write_check(os.path.join(out, cells[0].name), 16, "1111111100", CLEAN[:10])
    # Run from the folder that holds the sweep, named relative to it.
    done = dry_run(f"--sweep={definition.path}", "--sweep_dir=out", cwd=str(tmp_path))
    assert done.stdout.splitlines()[-1].startswith(
        "2 cells: 1 done, 1 check pending; the 1 to run would take about 0m10s of one process"
    ), done.stdout[-1000:]


def fake_ray(monkeypatch) -> None:
    """A Ray that runs each task at once in this process, on a cluster of one CPU."""
    cloudpickle = types.SimpleNamespace(register_pickle_by_value=lambda module: None)

    class Ref:
        def __init__(self, function, args):
            self.value = function(*args)

    ray = types.ModuleType("ray")
    ray.cloudpickle = cloudpickle
    ray.init = lambda **kwargs: types.SimpleNamespace(dashboard_url=None)
    ray.cluster_resources = lambda: {"CPU": 1.0}
    ray.remote = lambda **asks: lambda f: types.SimpleNamespace(remote=lambda *a: Ref(f, a))
    ray.wait = lambda refs, num_returns, timeout=None: (refs[:1], refs[1:])
    ray.get = lambda ref: ref.value
    ray.shutdown = lambda: None
    ray.exceptions = types.SimpleNamespace(RayError=RuntimeError, NodeDiedError=ConnectionError)
    ray.nodes = lambda: [{"NodeID": "0" * 56, "NodeManagerAddress": "127.0.0.1", "Alive": True}]
    monkeypatch.setitem(sys.modules, "ray", ray)


def test_the_ray_launcher_sends_a_triggered_check_as_a_second_task(tmp_path, monkeypatch):
    from fbat_tf.sweeps import cluster, steps

    definition = sweeps.load_definition(definition_file(tmp_path, CHECK))
    (cell,) = sweeps.expand(definition)
    out = str(tmp_path / "out")
    cell_dir = write_cell(out, cell.name)
    tasks = []

    def run_steps(planned, cwd, paths=None, where=None):
        tasks.append([step.part for step in planned])
        for step in planned:
            if step.part == "autoattack":
                found = {**parts(0.40), "fab-t": 0.45, "apgd-t": 0.45}
                write_evaluation(
                    cell_dir, "eval-autoattack.json", "autoattack", 16, 0.4, parts=found
                )
            elif step.part == "masking":
                write_evaluation(cell_dir, "eval-masking.json", "square", 16, 0.35)
        return {"train": 0.0, "evaluate": 1.0}

    fake_ray(monkeypatch)
    monkeypatch.setattr(steps, "run_steps", run_steps)
    said = []
    outcome = cluster.run_cells_on_ray(
        definition,
        [cell],
        out,
        revision.Pinned(tree=ROOT, revision=None),
        cluster.Resources(),
        study.rewrite,
        say=said.append,
        complain=said.append,
    )
    assert tasks == [["autoattack"], ["masking"]]
    assert not outcome.failed and sweeps.cell_state(cell_dir, definition) == "done"
    assert any("masking check next" in line for line in said), said
    assert any(line.startswith("[1/1]") and "evaluated in 0m02s" in line for line in said), said


# The report -------------------------------------------------------------------------------------


def checked_sweep(tmp_path):
    """fastbat, fastat and pgd at ε = 16, seeds 0 and 1, AutoAttack on 20 points. fastbat seed
    0: Square removed one point (5 points) after the white-box parts; the stronger Square,
    checked per point, leaves 7 of the 8 points AutoAttack left, and breaks none of its own
    beyond 9: AutoAttack 40.0 → 35.0. pgd seed 1 triggered too, its check not yet run."""
    path = definition_file(
        tmp_path,
        CHECK,
        grid=[{"method": ["fastbat", "fastat", "pgd"], "eps": [16], "seed": [0, 1]}],
        comparisons=[["fastbat", "fastat"], ["pgd", "fastat"]],
    )
    definition = sweeps.load_definition(path)
    out = str(tmp_path / "out")
    survived = "1" * 8 + "0" * 12  # 8 of 20 after AutoAttack
    strong = "0" + "1" * 7 + "11" + "0" * 10  # 9 of 20, 7 of them among AutoAttack's 8
    found = {
        # name: (AutoAttack's robust accuracy, after FAB-T)
        "fastbat-eps16-seed0": (0.40, 0.45),
        "fastbat-eps16-seed1": (0.45, 0.45),
        "fastat-eps16-seed0": (0.30, 0.30),
        "fastat-eps16-seed1": (0.25, 0.25),
        "pgd-eps16-seed0": (0.30, 0.30),
        "pgd-eps16-seed1": (0.30, 0.35),
    }
    for name, (robust, gradient) in found.items():
        cell = write_cell(out, name)
        after = {**parts(robust), "apgd-t": gradient, "fab-t": gradient}
        outcomes = {"clean": CLEAN, "autoattack": survived} if robust == 0.40 else None
        write_evaluation(
            cell, "eval-autoattack.json", "autoattack", 16, robust, parts=after, outcomes=outcomes
        )
    write_evaluation(
        os.path.join(out, "fastbat-eps16-seed0"),
        "eval-masking.json",
        "square",
        16,
        9 * ONE_PER_POINT,
        outcomes={"clean": CLEAN, "square": strong},
    )
    return definition, out


def test_checked_numbers_enter_every_table_and_each_row_they_enter_is_marked(tmp_path):
    definition, out = checked_sweep(tmp_path)
    report = study.collect(definition, out)
    paths = study.write_report(report, out)
    cells = {c.name: c for c in report.cells}

    # sweep.json: each cell's trigger, gap, the stronger attack's and the combined accuracy.
    saved = {c["name"]: c for c in json.load(open(paths["json"]))["cells"]}
    checked = saved["fastbat-eps16-seed0"]["masking_check"]["16"]
    assert checked["triggered"] and checked["state"] == "checked"
    assert checked["gap"] == pytest.approx(5.0)
    assert (checked["autoattack"], checked["strong"]) == (0.40, 0.45)
    assert checked["combined"] == pytest.approx(0.35) and checked["combined_by"] == "per point"
    assert saved["fastbat-eps16-seed0"]["autoattack"]["robust_accuracy"] == {"16": 0.35}
    assert saved["fastbat-eps16-seed0"]["autoattack"]["unchecked_robust_accuracy"] == {"16": 0.4}
    assert saved["fastbat-eps16-seed1"]["masking_check"]["16"]["triggered"] is False
    assert saved["pgd-eps16-seed1"]["masking_check"]["16"]["state"] == "pending"
    assert saved["pgd-eps16-seed1"]["autoattack"]["robust_accuracy"] == {"16": 0.30}
    assert json.load(open(paths["json"]))["masking_check"]["label"] == "Square-10000×5"

    table = open(paths["markdown"]).read()
    rows = {line.split(" | ")[0]: line for line in table.splitlines() if "| 16 | 2/2 |" in line}
    # The main table: fastbat's mean is of 35 and 45, its label marked; the others are not.
    # fastbat seed 0 is masked too: black-box attacks broke 5 points after the white-box parts
    # inside AutoAttack and the stronger Square 1 of AutoAttack's 8 (5 more): 10 > 1.
    assert "| 40.0 ± 7.1 |" in rows["| fastbat ‡ §"]
    assert "| fastat" in rows and "| pgd" in rows
    assert (
        "masking check: where Square, run last in AutoAttack, removed more than 1 point beyond"
        in (table)
    )
    assert (
        "- fastbat-eps16-seed0 at ε = 16: AutoAttack 40.0 → 35.0 (Square-10000×5 on the first "
        "20 points alone 45.0; Square removed 5.0 points after the white-box parts; black-box "
        "attacks broke 10.0 points beyond them, masked §)"
    ) in table
    assert checked["residual"] == pytest.approx(10.0) and checked["masked"] is True
    assert "not yet run (their AutoAttack numbers stand until it does): pgd-eps16-seed1" in table

    # Paired comparisons: the checked number enters fastbat − fastat, marked; pgd − fastat not.
    listed = {(p["a"], p["b"]): p for p in json.load(open(paths["json"]))["paired_comparisons"]}
    assert listed["fastbat", "fastat"]["differences"] == pytest.approx([5.0, 20.0])
    # Only one cell kept per-point outcomes: the comparisons are over the seeds alone, said so.
    assert listed["fastbat", "fastat"]["marks"] == [
        "masking check ‡",
        "masked §: fastbat in 1 of 2 runs",
        "seeds only",
    ]
    assert listed["pgd", "fastat"]["marks"] == ["seeds only"]
    compared = [line for line in table.splitlines() if line.startswith("| 16 | fastbat | fastat")]
    assert len(compared) == 1 and compared[0].endswith(
        "| masking check ‡, masked §: fastbat in 1 of 2 runs, seeds only |"
    )
    assert [line for line in table.splitlines() if line.startswith("| 16 | pgd | fastat")][
        0
    ].endswith("| seeds only |")

    # Cost rows: fastbat's own number is checked, and every other row is compared with it.
    rows = {r.key: r for r in costs.cost_rows(report)[16.0]}
    assert rows["fastbat"].robust == pytest.approx(0.40) and rows["fastbat"].most_robust
    assert rows["fastbat"].marks == ["masking check ‡", "masked §: fastbat in 1 of 2 runs"]
    assert rows["pgd"].marks == []
    assert rows["pgd"].versus_best.marks == [
        "masking check ‡",
        "masked §: fastbat in 1 of 2 runs",
        "seeds only",
    ]
    section = table.split("## Robustness against cost")[1].split("## Paired comparisons")[0]
    priced = [line for line in section.splitlines() if line.startswith("| 16 |")]
    assert len(priced) == 3 and all("masking check ‡" in line for line in priced), priced
    assert "most robust (masking check ‡, masked §: fastbat in 1 of 2 runs)" in table
    assert "most robust fastbat ‡ § (40.0%" in table
    assert cells["fastat-eps16-seed0"].evaluation("autoattack").checked == ()


def test_a_report_says_where_no_cell_triggered_the_check(tmp_path):
    definition = sweeps.load_definition(definition_file(tmp_path, CHECK))
    (cell,) = sweeps.expand(definition)
    out = str(tmp_path / "out")
    cell_dir = write_cell(out, cell.name)
    write_evaluation(cell_dir, "eval-autoattack.json", "autoattack", 16, 0.24, parts=parts(0.24))
    table = study.markdown(study.collect(definition, out))
    assert "No cell's AutoAttack triggered the masking check; the largest gap is 1.0 points." in (
        table
    )
    assert "‡ |" not in table


# evaluate.py with the stronger Square -----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist")
def test_evaluate_py_runs_square_with_its_queries_and_restarts(tmp_path, monkeypatch):
    """evaluate.py's main, in this process: Square with its flags' queries and restarts."""
    import keras

    from tests import in_process

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    path = str(tmp_path / "model.keras")
    model.save(path)
    results = tmp_path / "eval-masking.json"
    done = in_process.evaluate(
        f"--model_path={path}",
        "--dataset=fashion_mnist",
        "--attacks=square",
        "--square_n_queries=20",
        "--square_restarts=3",
        "--n_examples=16",
        "--eps=8",
        f"--results={results}",
        monkeypatch=monkeypatch,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| Square-20×3 | 8 |" in done.stdout
    evaluated = json.loads(results.read_text())
    assert (evaluated["square_n_queries"], evaluated["square_restarts"]) == (20, 3)
    assert evaluated["robust_accuracy"]["square@8"] <= evaluated["clean_accuracy"]
