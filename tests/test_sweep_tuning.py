"""A sweep's tuning stage: candidates trained on tuning seeds, picked by validation alone (never
the test split), the pick's flags given to the final cells, which wait for it under every
launcher, and the report's Tuning section."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import types

import pytest

from fbat_tf import sweeps
from fbat_tf.records import (
    AttackResult,
    DivergenceOutcome,
    Epoch,
    EvaluationResult,
    RunRecord,
    TrainConfig,
)
from fbat_tf.sweeps import tuning, tuning_file
from study import Report, tuning_report
from tests.test_sweep import (
    PGD_OWN,
    ROOT,
    TINY_FLAGS,
    made_cell,
    made_evaluation,
    run_sweep,
    write_definition,
)
from tests.tiny import FASHION_MNIST, fashion_mnist_config

needs_data = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist"
)


# train.py without its final test --------------------------------------------------------------


@pytest.mark.slow
@needs_data
def test_a_run_without_its_final_test_never_builds_the_test_split(tmp_path, monkeypatch):
    """final_test=False: the run trains and validates, records no test numbers, and the data
    loader is never asked for the test split."""
    from fbat_tf import training

    asked = []
    load = training.data.load

    def spy(name, split, **kwargs):
        asked.append(split)
        return load(name, split, **kwargs)

    monkeypatch.setattr(training.data, "load", spy)
    workdir = str(tmp_path / "run")
    record = training.train(fashion_mnist_config(workdir, final_test=False))
    assert "test" not in asked and {"train", "validation"} <= set(asked)
    assert record.status == "complete" and record.final is None
    saved = RunRecord.load(os.path.join(workdir, "results.json"))
    assert saved.final is None and saved.config.final_test is False
    assert saved.selected_epoch().val_robust_accuracy is not None
    with open(os.path.join(workdir, "results.json")) as f:
        assert "final" not in json.load(f)


def test_train_py_refuses_final_test_flags_without_a_final_test(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--nofinal_test",
            "--eval_examples=10",
            "--noeval_autoattack",
            f"--workdir={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: --eval_examples, --eval_autoattack:"), line
    assert "--nofinal_test" in line
    assert not (tmp_path / "run").exists()


# Definitions -------------------------------------------------------------------------------------

TUNED_FLAGS = {**TINY_FLAGS, "epochs": 1}


def tuning_definition(directory, spec: dict | None = None, grid=None) -> str:
    """A grid of Fast-AT, N-FGSM and first-order Fast-BAT at ε = 8 (seed 0), and PGD-AT at 16,
    whose Fast-AT is tuned on two learning rates by default."""
    grid = grid or [
        {"method": ["fastat", "nfgsm"], "eps": [8], "seed": [0]},
        {"method": ["fastbat"], "eps": [8], "ig": ["none"], "seed": [0]},
        {"method": ["pgd"], "eps": [16], "seed": [0, 1]},
    ]
    default = {
        "seeds": [100, 101],
        "groups": [
            {
                "method": "fastat",
                "eps": [8],
                "source": "Wong et al. 2020, Sec. 5.1",
                "candidates": [{"lr_max": 0.2}, {"lr_max": 0.05}],
            }
        ],
    }
    spec = default if spec is None else spec
    return write_definition(directory, grid, TUNED_FLAGS, evaluation=PGD_OWN, tuning=spec)


def _group(**changes) -> dict:
    group = {
        "method": "fastat",
        "eps": [8],
        "source": "a paper, Sec. 5",
        "candidates": [{"lr_max": 0.2}, {"lr_max": 0.1}],
    }
    group.update(changes)
    return {k: v for k, v in group.items() if v is not None}


BAD_TUNING = {
    "released-elsewhere": (
        {"seeds": [100], "groups": [_group(released=[{"lr_max": 0.3}])]},
        "tuning.groups[0].released[0] is not one of the group's candidates",
    ),
    "extend-without-why": (
        {
            "seeds": [100],
            "groups": [_group(extend={"lr_max": {"factor": 2, "min": 0.01, "max": 1, "why": ""}})],
        },
        "tuning.groups[0].extend.lr_max.why: say why",
    ),
    "extend-past-its-bound": (
        {
            "seeds": [100],
            "groups": [
                _group(extend={"lr_max": {"factor": 2, "min": 0.15, "max": 1, "why": "a bound"}})
            ],
        },
        "need 0 < min <= every candidate's value <= max",
    ),
    "not-an-object": ([], "tuning must be an object"),
    "unknown-key": ({"seeds": [100], "groups": [_group()], "metric": "x"}, "tuning: unknown keys"),
    "no-seeds": ({"seeds": [], "groups": [_group()]}, "tuning.seeds must be a non-empty"),
    "seed-not-int": ({"seeds": [1.5], "groups": [_group()]}, "tuning.seeds must be whole"),
    "seed-negative": ({"seeds": [-3], "groups": [_group()]}, "from 0 to 2147483647, got [-3]"),
    "seed-twice": ({"seeds": [100, 100], "groups": [_group()]}, "tuning.seeds lists a seed twice"),
    "final-seed": ({"seeds": [100, 1], "groups": [_group()]}, "tuning.seeds: 1 is also the seed"),
    "no-groups": ({"seeds": [100], "groups": []}, "tuning.groups must be a non-empty"),
    "group-key": (
        {"seeds": [100], "groups": [_group(match_all=True)]},
        "tuning.groups[0]: unknown keys ['match_all']",
    ),
    "unknown-method": (
        {"seeds": [100], "groups": [_group(method="fastatt")]},
        "tuning.groups[0].method: unknown method 'fastatt'",
    ),
    "method-not-in-grid": (
        {"seeds": [100], "groups": [_group(method="free")]},
        "tuning.groups[0].method: no cell of the grid trains free",
    ),
    "match-not-a-grid-key": (
        {"seeds": [100], "groups": [_group(method="fastbat", match={"ig_coef": 0})]},
        "tuning.groups[0].match: 'ig_coef' is not a grid key of fastbat's cells",
    ),
    "match-no-cell": (
        {"seeds": [100], "groups": [_group(method="fastbat", match={"ig": "hessian_aware"})]},
        "tuning.groups[0].match: no cell of fastbat",
    ),
    "no-eps": ({"seeds": [100], "groups": [_group(eps=[])]}, "tuning.groups[0].eps must be"),
    "eps-no-cell": (
        {"seeds": [100], "groups": [_group(eps=[8, 16])]},
        "tuning.groups[0].eps: no cell of fastat at eps 16",
    ),
    "no-source": ({"seeds": [100], "groups": [_group(source=None)]}, "tuning.groups[0].source"),
    "no-candidates": (
        {"seeds": [100], "groups": [_group(candidates=[])]},
        "tuning.groups[0].candidates must be a non-empty list",
    ),
    "empty-candidate": (
        {"seeds": [100], "groups": [_group(candidates=[{"lr_max": 0.1}, {}])]},
        "tuning.groups[0].candidates[1] must set at least one flag",
    ),
    "other-method-flag": (
        {"seeds": [100], "groups": [_group(candidates=[{"lambda_inv": 2500}])]},
        "tuning.groups[0].candidates[0]: 'lambda_inv' is not a flag of fastat",
    ),
    "not-a-flag": (
        {"seeds": [100], "groups": [_group(candidates=[{"learning_rate": 0.1}])]},
        "tuning.groups[0].candidates[0]: 'learning_rate' is not a train.py flag",
    ),
    "test-flag": (
        {"seeds": [100], "groups": [_group(candidates=[{"eval_examples": 10}])]},
        "tuning.groups[0].candidates[0]: 'eval_examples' is not a train.py flag",
    ),
    "grid-key": (
        {
            "seeds": [100],
            "groups": [_group(method="fastbat", candidates=[{"ig": "hessian_free"}])],
        },
        "tuning.groups[0].candidates[0]: 'ig' is a grid key",
    ),
    "seed-override": (
        {"seeds": [100], "groups": [_group(candidates=[{"seed": 3}])]},
        "tuning.groups[0].candidates[0]: 'seed' is a grid key",
    ),
    "duplicate": (
        {"seeds": [100], "groups": [_group(candidates=[{"lr_max": 0.1}, {"lr_max": 0.10}])]},
        "tuning.groups[0].candidates[1] repeats tuning.groups[0].candidates[0]",
    ),
    "two-groups": (
        {"seeds": [100], "groups": [_group(), _group(candidates=[{"weight_decay": 0}])]},
        "tuning.groups[0] and",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_TUNING))
def test_a_bad_tuning_block_is_refused_at_load_naming_its_key(tmp_path, case):
    spec, expected = BAD_TUNING[case]
    grid = [
        {"method": ["fastat"], "eps": [8], "seed": [0, 1]},
        {"method": ["fastbat"], "eps": [8], "ig": ["none"], "seed": [0]},
    ]
    path = tuning_definition(tmp_path, spec, grid)
    with pytest.raises(sweeps.DefinitionError) as raised:
        sweeps.load_definition(path)
    message = str(raised.value)
    assert expected in message and message.startswith(f"{path}: tuning") and "\n" not in message


def test_tuning_cells_are_the_final_cells_without_their_test_on_tuning_seeds(tmp_path):
    definition = sweeps.load_definition(tuning_definition(tmp_path))
    runs = tuning.tuning_cells(definition)
    assert [c.name for c in runs] == [
        "tuning/fastat-eps8-lr_max0.2-seed100",
        "tuning/fastat-eps8-lr_max0.2-seed101",
        "tuning/fastat-eps8-lr_max0.05-seed100",
        "tuning/fastat-eps8-lr_max0.05-seed101",
    ]
    flags = runs[2].flags
    assert flags["lr_max"] == 0.05 and flags["seed"] == 100 and flags["final_test"] is False
    assert not {"eval_examples", "eval_pgd_steps", "eval_autoattack"} & set(flags)
    argv = sweeps.commands(definition, runs[2], "out")
    assert list(argv) == ["train"]  # never evaluated
    assert "--nofinal_test" in argv["train"] and "--lr_max=0.05" in argv["train"]
    cells = {c.name: c for c in sweeps.expand(definition)}
    assert cells["fastat-eps8-seed0"].pending and cells["fastat-eps8-seed0"].unit == "fastat-eps8"
    assert not cells["nfgsm-eps8-seed0"].pending and cells["nfgsm-eps8-seed0"].unit is None


# The pick ----------------------------------------------------------------------------------------


def write_run(run_dir, method, seed, val, *, test=None, status="complete", **options):
    """A finished run's results.json, written by the project's record types: validation robust
    accuracy per epoch, and test numbers (`test`: PGD accuracy) where given."""
    history = []
    for i, value in enumerate(val):
        best = all(value > earlier for earlier in val[:i])
        history.append(Epoch(i + 1, {"val_robust_accuracy": value, "val_best": float(best)}))
    final = None
    if test is not None:
        final = EvaluationResult(
            examples=100, clean_accuracy=0.9, robust=[AttackResult("pgd", 8.0, test)]
        )
    config = TrainConfig(workdir=str(run_dir), method=method, seed=seed, **options)
    os.makedirs(run_dir, exist_ok=True)
    # A diverged run records why, as training does (a record without it is refused).
    divergence = (
        DivergenceOutcome(len(val), "validation", 0, 4, 0.25, 64, None)
        if status == "diverged"
        else None
    )
    RunRecord(
        config=config, status=status, history=history, final=final, divergence=divergence
    ).save(os.path.join(run_dir, "results.json"))


def test_the_pick_is_by_validation_even_where_test_numbers_favour_another(tmp_path):
    definition = sweeps.load_definition(tuning_definition(tmp_path))
    out = str(tmp_path / "out")
    # lr_max 0.2: validation 0.40 and 0.50 at the selected epochs (mean 0.45), test 0.10;
    # lr_max 0.05: validation 0.30 and 0.44 (mean 0.37), test 0.90 (as if a test were run).
    numbers = {
        "lr_max0.2": ([[0.2, 0.4, 0.3], [0.5, 0.1]], 0.10),
        "lr_max0.05": ([[0.3], [0.44]], 0.90),
    }
    for run in tuning.tuning_cells(definition):
        candidate = run.name.split("-")[2]
        vals, test = numbers[candidate]
        write_run(os.path.join(out, run.name), "fastat", run.seed, vals[run.seed - 100], test=test)
    (entry,) = tuning.settle(definition, out)
    assert entry.pick == "lr_max0.2" and entry.flags == {"lr_max": 0.2}
    first = entry.candidates[0]
    assert [r.val_robust_accuracy for r in first.runs] == [0.4, 0.5]
    assert [r.selected_epoch for r in first.runs] == [2, 1]
    assert first.mean == pytest.approx(0.45) and first.passes_per_step == 4
    saved = json.loads((tmp_path / "out" / "tuning.json").read_text())
    assert saved["picks"]["fastat-eps8"]["pick"] == "lr_max0.2" and "test split" in saved["rule"]
    # The final cell now carries the pick's flags under its own name.
    cell = next(c for c in sweeps.expand(definition) if c.name == "fastat-eps8-seed0")
    assert not cell.pending and cell.flags["lr_max"] == 0.2
    assert "--lr_max=0.2" in sweeps.commands(definition, cell, out)["train"]


def test_ties_go_to_fewer_passes_per_step_then_to_the_first_listed(tmp_path):
    tuning_spec = {
        "seeds": [100, 101],
        "groups": [
            {
                "method": "pgd",
                "eps": [16],
                "source": "Madry et al. 2018",
                # Equal means: 3 steps (8 passes a step), 1 step (4), 1 step at another rate (4).
                "candidates": [
                    {"attack_steps": 3},
                    {"attack_steps": 1, "lr_max": 0.1},
                    {"attack_steps": 1, "lr_max": 0.2},
                ],
            }
        ],
    }
    definition = sweeps.load_definition(tuning_definition(tmp_path, tuning_spec))
    out = str(tmp_path / "out")
    for run in tuning.tuning_cells(definition):
        # Means 0.35 for each: 0.3 and 0.4 in either order.
        write_run(os.path.join(out, run.name), "pgd", run.seed, [0.3 if run.seed == 100 else 0.4])
    (entry,) = tuning.settle(definition, out)
    assert [c.passes_per_step for c in entry.candidates] == [8, 4, 4]
    assert entry.pick == "attack_steps1-lr_max0.1"
    assert "listed first" in entry.decided_by
    found = [
        tuning.Candidate(label, {}, passes, (), 0.35)
        for label, passes in (("a", 8), ("b", 4), ("c", 6))
    ]
    assert tuning.decide(found) == (1, "a tie on the mean with c: fewer passes per step")
    found[0] = dataclasses.replace(found[0], mean=0.36)
    assert tuning.decide(found) == (0, "the highest mean")


def test_a_diverged_run_counts_zero_and_no_pick_before_every_run_finished(tmp_path):
    definition = sweeps.load_definition(tuning_definition(tmp_path))
    out = str(tmp_path / "out")
    runs = tuning.tuning_cells(definition)
    for run in runs[:-1]:
        value = [0.9] if "lr_max0.2" in run.name else [0.3]
        status = "diverged" if run.seed == 101 and "lr_max0.2" in run.name else "complete"
        write_run(os.path.join(out, run.name), "fastat", run.seed, value, status=status)
    write_run(os.path.join(out, runs[-1].name), "fastat", 101, [0.3], status="running")
    assert tuning.settle(definition, out) == []
    assert not (tmp_path / "out" / "tuning.json").exists()
    assert next(c for c in sweeps.expand(definition) if c.unit).pending
    write_run(os.path.join(out, runs[-1].name), "fastat", 101, [0.3])
    (entry,) = tuning.settle(definition, out)
    diverged = entry.candidates[0].runs[1]
    assert diverged.diverged and diverged.val_robust_accuracy == 0.0
    assert diverged.recorded_val_robust_accuracy == 0.9
    assert entry.candidates[0].mean == pytest.approx(0.45)
    assert entry.pick == "lr_max0.2"
    table = "\n".join(
        tuning_report.tuning_table(Report(tuning=tuning.report_section(definition, out)))
    )
    assert "| 90.0 | 0.0 (diverged) | 45.0 |" in table


def test_the_criterion_table_sets_each_pick_s_validation_beside_its_test_by_hand():
    """Per tuned row: the pick's mean over the tuning seeds (as tuning.json holds it), the final
    cells' validation robust accuracy at their selected epoch (not the last, not the best of
    another epoch), their test accuracies by evaluation, and validation minus the lowest test
    mean; a cell still training is left out, and a sweep without picks has no table."""

    def cell(seed, val, selected, pgd, aa, state="done"):
        train = dict(val_robust_accuracy=val, selected_epoch=selected, epochs_run=len(val))
        found = made_cell("fastat", seed, train=train, pgd={8.0: pgd}, autoattack={8.0: aa})
        return dataclasses.replace(found, state=state)

    unit = tuning.UnitSection(
        unit="fastat-eps8",
        method="fastat",
        variant="fastat",
        eps=8.0,
        match={},
        source="a paper, Sec. 5",
        cells=("fastat-eps8-seed0", "fastat-eps8-seed1", "fastat-eps8-seed2"),
        candidates=(
            tuning.Candidate("lr_max0.05", {"lr_max": 0.05}, 4, (), 0.9),
            tuning.Candidate("lr_max0.2", {"lr_max": 0.2}, 4, (), 0.55),
        ),
        pick="lr_max0.2",
        flags={"lr_max": 0.2},
        decided_by="the highest mean",
        edges=None,
    )
    section = tuning.Section("a rule", (100,), tuning.FILE, (unit,))
    report = Report(
        evaluations=(made_evaluation("pgd"), made_evaluation("autoattack")),
        tuning=section,
        cells=(
            cell(0, [0.5, 0.6, 0.4], 2, 0.45, 0.30),
            cell(1, [0.7, 0.5], 1, 0.55, 0.40),
            cell(2, [0.9], 1, 0.9, 0.9, state="started"),
        ),
    )
    table = "\n".join(tuning_report.criterion_table(report))
    # Validation 60 and 70 (mean 65.0 ± 7.1); PGD 45, 55 (50.0); AutoAttack 30, 40 (35.0);
    # 65.0 − 35.0 = +30.0.
    row = (
        "| fastat | 8 | lr_max=0.2 | 55.0 | 65.0 ± 7.1 (2 cells) | 50.0 ± 7.1 | 35.0 ± 7.1 "
        "| +30.0 |"
    )
    assert row in table, table
    assert "PGD-10 on 1000 validation images" in table  # train.py's defaults: no flags set
    assert "alone" not in table  # validation was PGD alone: one criterion, one gap

    # Validation with a black-box part after PGD: PGD's own figure at the same selected epoch
    # (seed 0's second, 0.8; seed 1's first, 0.6; not their last) is the criterion without it,
    # and its gap stands last: 70.0 − 35.0 = +35.0.
    cells = list(report.cells)
    for i, pgd_alone in ((0, [0.7, 0.8, 0.5]), (1, [0.6, 0.55])):
        train = dataclasses.replace(cells[i].train, val_pgd_accuracy=pgd_alone)
        cells[i] = dataclasses.replace(cells[i], train=train)
    report = dataclasses.replace(report, cells=tuple(cells))
    table = "\n".join(tuning_report.criterion_table(report))
    assert row + " 70.0 ± 14.1 | +35.0 |" in table, table
    assert "PGD-10 alone (final cells) | PGD-10 alone − lowest test (points) |" in table
    pending = dataclasses.replace(unit, pick=None, flags=None, decided_by=None)
    report = dataclasses.replace(report, tuning=dataclasses.replace(section, units=(pending,)))
    assert tuning_report.criterion_table(report) == []
    assert tuning_report.criterion_table(Report()) == []


def test_a_written_pick_stands_and_changed_candidates_are_refused_naming_the_file(tmp_path):
    path = tuning_definition(tmp_path)
    definition = sweeps.load_definition(path)
    out = str(tmp_path / "out")
    for run in tuning.tuning_cells(definition):
        value = [0.5] if "lr_max0.2" in run.name else [0.4]
        write_run(os.path.join(out, run.name), "fastat", run.seed, [value[0]])
    assert tuning.settle(definition, out)[0].pick == "lr_max0.2"
    # A run rewritten afterwards changes nothing: tuning.json stands.
    for run in tuning.tuning_cells(definition):
        if "lr_max0.05" in run.name:
            write_run(os.path.join(out, run.name), "fastat", run.seed, [0.9])
    again = sweeps.load_definition(path)
    assert tuning.settle(again, out) == []
    assert again.picks == {"fastat-eps8": {"lr_max": 0.2}}
    # Other candidates for a picked unit: refused, naming tuning.json.
    spec = json.loads(open(path).read())
    spec["tuning"]["groups"][0]["candidates"].append({"lr_max": 0.01})
    with open(path, "w") as f:
        json.dump(spec, f)
    changed = sweeps.load_definition(path)
    with pytest.raises(sweeps.DefinitionError, match="tuning.json picked fastat-eps8"):
        tuning.refresh(changed, out)
    os.remove(os.path.join(out, "tuning.json"))
    tuning.refresh(changed, out)
    assert changed.picks == {}


@pytest.mark.parametrize("name", ["fashion_mnist_interior", "fashion_mnist_tuned"])
def test_a_committed_tuning_file_reads_as_records_and_is_written_back_the_same(tmp_path, name):
    """tuning.json read into its records (tuning_file.read) and written again (write) keeps its
    keys, their order and its numbers; a file written before candidates were marked, picks
    held their edges and grids grew (the tuned study's) reads with none of them and is written
    with the empty extensions the stage always adds."""
    with open(os.path.join(ROOT, "study", "results", name, "tuning.json")) as f:
        text = f.read()
    shutil.copy(os.path.join(ROOT, "study", "results", name, "tuning.json"), tmp_path)
    found = tuning_file.read(str(tmp_path))
    raw = json.loads(text)
    assert list(found.picks) == list(raw["picks"])
    entry = next(iter(found.picks.values()))
    assert entry.unit == next(iter(raw["picks"])) and entry.pick in [
        c.label for c in entry.candidates
    ]
    assert all(isinstance(run, tuning.TuningRun) for c in entry.candidates for run in c.runs)
    marked = name == "fashion_mnist_interior"
    assert (entry.edges is not None) == marked and bool(found.extensions) == marked
    assert all((c.origin is not None) == marked for c in entry.candidates)
    tuning_file.write(str(tmp_path), found, raw["rule"])
    written = (tmp_path / "tuning.json").read_text()
    expected = text if marked else json.dumps({**raw, "extensions": {}}, indent=2)
    assert written == expected


def _damaged(tmp_path, damage) -> str:
    """The interior study's tuning.json, its first pick damaged, in a directory of its own."""
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist_interior", "tuning.json")) as f:
        found = json.load(f)
    damage(next(iter(found["picks"].values())))
    (tmp_path / "tuning.json").write_text(json.dumps(found))
    return str(tmp_path)


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda pick: pick.update(note="hand-made"), "has 'note', which sweep.py does not write"),
        (lambda pick: pick.pop("cells"), "has no list of 'cells'"),
        (lambda pick: pick["candidates"][1].pop("mean"), "has no 'candidates[1].mean'"),
        (
            lambda pick: pick["candidates"][0]["runs"][2].update(recorded_val_robust_accuracy=0.1),
            "has 'candidates[0].runs[2].recorded_val_robust_accuracy', which sweep.py does not",
        ),
        (
            lambda pick: pick["candidates"][0]["runs"][0].pop("diverged"),
            "has 'candidates[0].runs[0].selected_epoch', which sweep.py does not write",
        ),
    ],
)
def test_a_pick_that_would_not_be_written_back_as_read_is_refused_naming_the_file(
    tmp_path, damage, said
):
    """A pick of other keys than the stage writes would lose them, or gain some, when
    tuning.json is written again: refused, naming the file, the unit and the key."""
    sweep_dir = _damaged(tmp_path, damage)
    with pytest.raises(sweeps.DefinitionError) as raised:
        tuning_file.read(sweep_dir)
    message = str(raised.value)
    assert message.startswith(f"{sweep_dir}/tuning.json: the pick of fastat_ga-eps48 {said}")
    assert f"delete {sweep_dir}/tuning.json and run the same command again" in message


# The launchers' order ----------------------------------------------------------------------------


def _finish(cell_dir: str, method: str, seed: int, flags: dict) -> None:
    """What a cell's programs leave: a tuning run's record (validation 0.5 at lr_max 0.2, else
    0.3), or a final cell's record and its evaluation."""
    lr = float(flags.get("lr_max", 0.2))
    write_run(cell_dir, method, seed, [0.5 if lr == 0.2 else 0.3])
    if os.path.basename(os.path.dirname(cell_dir)) != tuning.DIRECTORY:
        result = EvaluationResult(
            examples=16, clean_accuracy=0.9, robust=[AttackResult("pgd", 8.0, 0.4)]
        )
        with open(os.path.join(cell_dir, "eval-pgd.json"), "w") as f:
            json.dump(result.to_dict(), f)


def quiet_report(definition, sweep_dir):
    """The report both launchers are handed, here writing nothing."""


def _small(tmp_path):
    grid = [{"method": ["fastat", "standard"], "eps": [8], "seed": [0]}]
    return sweeps.load_definition(tuning_definition(tmp_path, None, grid))


def test_the_local_launcher_runs_tuning_first_and_waits_for_another_process_s_run(
    tmp_path, monkeypatch
):
    """One tuning run is held by another live sweep.py process: the final cell of its unit
    waits (the untuned cell does not), and runs with the pick's flags once that run is done."""
    from fbat_tf.sweeps import claims, scheduler

    definition = _small(tmp_path)
    out = str(tmp_path / "out")
    runs = tuning.tuning_cells(definition)
    other = runs[-1]
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.makedirs(os.path.join(out, "claims", "tuning"))
        with open(os.path.join(out, "claims", f"{other.name}.json"), "w") as f:
            json.dump({"host": __import__("socket").gethostname(), "pid": holder.pid}, f)
        ran = []

        def run_cell(definition, cell, sweep_dir, code):
            ran.append((cell.name, dict(cell.flags)))
            _finish(os.path.join(sweep_dir, cell.name), cell.method, cell.seed, cell.flags)
            return {"train": 1.0, "evaluate": 0.0 if cell.stage == "tuning" else 1.0}

        said = []

        def say(line):
            said.append(line)
            if line.startswith("waiting for 1 cells other sweep.py processes run"):
                # The other process finishes its run and lets go of it.
                _finish(os.path.join(out, other.name), "fastat", other.seed, other.flags)
                os.remove(os.path.join(out, "claims", f"{other.name}.json"))

        monkeypatch.setattr(scheduler, "run_cell", run_cell)
        to_run = [*sweeps.expand(definition), *runs]  # in any order: tuning runs go first
        outcome = scheduler.run_cells(
            definition, to_run, out, None, quiet_report, wait_seconds=0, say=say
        )
    finally:
        holder.kill()
        holder.wait()
    assert outcome.failed == [] and outcome.diverged == []
    names = [name for name, _ in ran]
    assert names == [*(r.name for r in runs[:-1]), "standard-eps8-seed0", "fastat-eps8-seed0"]
    assert any("1 cells wait for the tuning picks of fastat-eps8" in line for line in said)
    assert dict(ran)["fastat-eps8-seed0"]["lr_max"] == 0.2
    assert claims.owner(out, other.name) is None


def test_a_launcher_left_with_final_cells_alone_waits_for_no_finished_tuning_run(
    tmp_path, monkeypatch
):
    """Every tuning run finished and a final cell left (a masking check added later, say): the
    launcher runs that cell and waits for nothing, where it once listed the unit's finished
    runs as cells other sweep.py processes run."""
    from fbat_tf.sweeps import scheduler

    definition = _small(tmp_path)
    out = str(tmp_path / "out")
    runs = tuning.tuning_cells(definition)
    for run in runs:
        _finish(os.path.join(out, run.name), run.method, run.seed, run.flags)
    finals = sweeps.expand(definition)
    assert scheduler.new_runs(definition, finals, out) == []
    assert scheduler.new_runs(definition, finals, str(tmp_path / "empty")) == runs
    ran, said = [], []

    def run_cell(definition, cell, sweep_dir, code):
        ran.append(cell.name)
        _finish(os.path.join(sweep_dir, cell.name), cell.method, cell.seed, cell.flags)
        return {"train": 1.0, "evaluate": 1.0}

    monkeypatch.setattr(scheduler, "run_cell", run_cell)
    outcome = scheduler.run_cells(
        definition, finals, out, None, quiet_report, wait_seconds=0, say=said.append
    )
    assert outcome.failed == [] and sorted(ran) == sorted(c.name for c in finals)
    assert not [line for line in said if line.startswith("waiting for")], said


def test_a_failed_tuning_run_fails_its_final_cells_instead_of_waiting(tmp_path, monkeypatch):
    from fbat_tf.sweeps import scheduler

    definition = _small(tmp_path)
    out = str(tmp_path / "out")
    runs = tuning.tuning_cells(definition)

    def run_cell(definition, cell, sweep_dir, code):
        if cell.name == runs[0].name:
            raise RuntimeError("train.py failed")
        _finish(os.path.join(sweep_dir, cell.name), cell.method, cell.seed, cell.flags)
        return {"train": 1.0, "evaluate": 0.0}

    monkeypatch.setattr(scheduler, "run_cell", run_cell)
    to_run = [*runs, *sweeps.expand(definition)]
    outcome = scheduler.run_cells(
        definition, to_run, out, None, quiet_report, wait_seconds=0, say=print
    )
    assert outcome.failed == [runs[0].name, "fastat-eps8-seed0"]
    assert not os.path.exists(os.path.join(out, "fastat-eps8-seed0"))
    assert os.path.exists(os.path.join(out, "standard-eps8-seed0", "eval-pgd.json"))


def test_the_time_left_counts_the_cells_any_process_finished_and_shares_the_rest(tmp_path):
    """Cells finished by any process are not left; the rest, at the mean of this process's
    cells (of their kind where it ran one, else of their stage, else of all), are shared with
    each other live process holding a claim on one of them."""
    from fbat_tf.sweeps import scheduler

    definition = _small(tmp_path)
    out = str(tmp_path / "out")
    to_run = [*tuning.tuning_cells(definition), *sweeps.expand(definition)]
    assert len(to_run) == 6  # 2 candidates × 2 tuning seeds, and 2 final cells
    for cell in to_run[:2]:  # finished, whichever process ran them
        _finish(os.path.join(out, cell.name), cell.method, cell.seed, cell.flags)
    kind = (to_run[0].stage, to_run[0].unit)  # one tuning unit's runs
    spent = [(kind, 10.0), (kind, 20.0)]  # this process's cells: 15 s each
    assert scheduler.time_left(definition, to_run, out, spent) == pytest.approx(4 * 15.0)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        os.makedirs(os.path.join(out, "claims", "tuning"), exist_ok=True)
        for cell in to_run[2:4]:  # two cells, one other process
            with open(os.path.join(out, "claims", f"{cell.name}.json"), "w") as f:
                json.dump({"host": __import__("socket").gethostname(), "pid": holder.pid}, f)
        assert scheduler.time_left(definition, to_run, out, spent) == pytest.approx(4 * 15.0 / 2)
    finally:
        holder.kill()
        holder.wait()
    # Its process gone, the claims are stale: this process alone again.
    assert scheduler.time_left(definition, to_run, out, spent) == pytest.approx(4 * 15.0)


def test_a_cell_to_run_is_timed_by_its_own_kind_then_its_stage_then_every_cell():
    """Tuning runs train and validate only; final cells are attacked too and take several times
    as long: a final cell left is timed by the final cells of its unit done, else by the final
    cells done, else by every cell done; never by the tuning runs' mean where finals are known."""
    from fbat_tf.sweeps import scheduler

    done = [
        (("tuning", "pgd-eps8"), 100.0),
        (("tuning", "pgd-eps8"), 200.0),
        (("final", "pgd-eps8"), 1000.0),
        (("final", "fastat-eps8"), 600.0),
    ]
    assert scheduler.by_kind(done, [("tuning", "pgd-eps8")]) == pytest.approx(150.0)
    assert scheduler.by_kind(done, [("final", "pgd-eps8")]) == pytest.approx(1000.0)
    assert scheduler.by_kind(done, [("final", "elle-eps8")]) == pytest.approx(800.0)
    assert scheduler.by_kind(done, [("tuning", "elle-eps8")]) == pytest.approx(150.0)
    assert scheduler.by_kind(done[:2], [("final", None)]) == pytest.approx(150.0)
    assert scheduler.by_kind(done, [("final", "pgd-eps8")] * 3) == pytest.approx(3000.0)
    assert scheduler.by_kind([], [("final", None)]) == 0.0


def test_a_report_that_fails_after_a_cell_is_a_warning_and_the_cells_go_on(
    tmp_path, monkeypatch, capsys
):
    """A report another process's half-written run trips up (or any report failure) stops no
    cell: each one runs, stderr says why the report was not rewritten, and the next cell's
    rewrite goes through."""
    from fbat_tf.sweeps import scheduler

    definition = _small(tmp_path)
    out = str(tmp_path / "out")
    runs = tuning.tuning_cells(definition)
    written = []

    def report(definition, sweep_dir):
        written.append(len(written))
        if len(written) == 1:
            raise TypeError("must be real number, not NoneType")

    def run_cell(definition, cell, sweep_dir, code):
        _finish(os.path.join(sweep_dir, cell.name), cell.method, cell.seed, cell.flags)
        return {"train": 1.0, "evaluate": 0.0 if cell.stage == "tuning" else 1.0}

    monkeypatch.setattr(scheduler, "run_cell", run_cell)
    to_run = [*runs, *sweeps.expand(definition)]
    outcome = scheduler.run_cells(definition, to_run, out, None, report, wait_seconds=0, say=print)
    assert outcome.failed == [] and outcome.diverged == []
    assert len(written) == len(to_run)  # tried after every cell, the first attempt failing
    for cell in to_run:
        assert finished(out, cell), cell.name
    err = capsys.readouterr().err
    assert err.count("the report was not rewritten after this cell") == 1
    assert "(TypeError: must be real number, not NoneType)" in err


def finished(out: str, cell) -> bool:
    """Whether the cell's run finished (its results.json complete)."""
    with open(os.path.join(out, cell.name, "results.json")) as f:
        return json.load(f)["status"] == "complete"


class _FakeRay(types.ModuleType):
    """Ray as the launcher uses it, in this process: a task runs when the driver waits for
    it, the first submitted first."""

    class exceptions:  # noqa: N801
        RayError = RuntimeError
        NodeDiedError = ConnectionError

    def __init__(self):
        super().__init__("ray")
        self.cloudpickle = types.SimpleNamespace(register_pickle_by_value=lambda module: None)
        self.results = {}

    def init(self, **kwargs):
        return types.SimpleNamespace(dashboard_url=None)

    def cluster_resources(self):
        return {"CPU": 2.0}

    def nodes(self):
        return [{"NodeID": "0" * 56, "NodeManagerAddress": "127.0.0.1", "Alive": True}]

    def remote(self, **asks):
        def wrap(function):
            def submit(*args):
                ref = object()
                self.results[ref] = lambda: function(*args)
                return ref

            return types.SimpleNamespace(remote=submit)

        return wrap

    def wait(self, refs, num_returns=1, timeout=None):
        first = refs[0]
        try:
            self.results[first] = ("ok", self.results[first]())
        except RuntimeError as error:
            self.results[first] = ("error", error)
        return [first], refs[1:]

    def get(self, ref):
        kind, value = self.results.pop(ref)
        if kind == "error":
            raise value
        return value

    def shutdown(self):
        pass


def test_the_ray_launcher_holds_final_cells_in_its_queue_until_their_pick(tmp_path, monkeypatch):
    """Two cells at a time: the untuned cell passes the tuned final cell, which is submitted
    only once its unit's last tuning run finished, with the pick's flags."""
    from fbat_tf.sweeps import cluster, steps

    monkeypatch.setitem(sys.modules, "ray", _FakeRay())
    definition = _small(tmp_path)
    out = str(tmp_path / "out")
    ran = []

    def run_steps(planned, cwd, paths=None, where=None):
        (train,) = [step for step in planned if step.part == "train"]
        workdir = next(w.split("=", 1)[1] for w in train.command if w.startswith("--workdir="))
        words = dict(w[2:].split("=", 1) for w in train.command if "=" in w)
        ran.append((os.path.relpath(workdir, out), words))
        _finish(workdir, words["method"], int(words["seed"]), words)
        return {"train": 1.0, "evaluate": 0.0}

    monkeypatch.setattr(steps, "run_steps", run_steps)
    code = types.SimpleNamespace(tree=str(tmp_path))
    to_run = [*sweeps.expand(definition), *tuning.tuning_cells(definition)]
    outcome = cluster.run_cells_on_ray(
        definition, to_run, out, code, cluster.Resources(), quiet_report, say=print, wait_seconds=0
    )
    assert outcome.failed == []
    names = [name for name, _ in ran]
    runs = [c.name for c in tuning.tuning_cells(definition)]
    # Queued after it, the untuned cell runs before the tuned final cell.
    assert names == [*runs, "standard-eps8-seed0", "fastat-eps8-seed0"]
    assert dict(ran)["fastat-eps8-seed0"]["lr_max"] == "0.2"
    assert "eval" not in " ".join(n for n in os.listdir(os.path.join(out, runs[0])))


# End to end --------------------------------------------------------------------------------------


def test_a_candidate_s_bad_value_is_refused_before_any_run_naming_its_tuning_cell(tmp_path):
    spec = {"seeds": [100], "groups": [_group(candidates=[{"lr_max": 0.1}, {"lr_max": -1}])]}
    path = tuning_definition(tmp_path, spec, [{"method": ["fastat"], "eps": [8], "seed": [0]}])
    done = run_sweep(f"--sweep={path}", f"--sweep_dir={tmp_path / 'out'}", "--dry_run")
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: cell tuning/fastat-eps8-lr_max-1-seed100: ") and "lr_max" in line
    assert not (tmp_path / "out").exists()


def test_a_value_of_the_wrong_type_is_refused_before_any_run_naming_its_cell_and_flag(tmp_path):
    """A definition's "epochs": "2" (a string where train.py's TrainConfig holds an int) passes
    absl's parse of the cell's words, and is refused by sweep.py before anything runs, naming
    the cell and the flag, not read again as a number later."""
    spec = {"seeds": [100], "groups": [_group(candidates=[{"lr_max": 0.1}])]}
    grid = [{"method": ["fastat"], "eps": [8], "seed": [0], "epochs": ["2"]}]
    path = tuning_definition(tmp_path, spec, grid)
    done = run_sweep(f"--sweep={path}", f"--sweep_dir={tmp_path / 'out'}", "--dry_run")
    assert done.returncode != 0
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: cell ") and "--epochs is '2', not an int" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@needs_data
def test_a_tiny_tuned_sweep_end_to_end(tmp_path, committed_tree):
    """Fashion-MNIST, small_cnn at width 4, one epoch on 256 images: Fast-AT's two learning
    rates on one tuning seed (means over two are tested above on written runs), then its final
    cell with the pick. The dry run shows the final cell waiting for tuning; the tuning
    runs hold no test numbers and no evaluation; the final cell ran with the pick's flags and
    was evaluated; the report has its Tuning section."""
    grid = [{"method": ["fastat"], "eps": [8], "seed": [0]}]
    spec = {
        "seeds": [100],
        "groups": [
            {
                "method": "fastat",
                "eps": [8],
                "source": "Wong et al. 2020, Sec. 5.1",
                "candidates": [{"lr_max": 0.2}, {"lr_max": 0.05}],
            }
        ],
    }
    path = tuning_definition(tmp_path, spec, grid)
    out = tmp_path / "out"
    data = f"--data_dir={FASHION_MNIST}"
    dry = run_sweep(f"--sweep={path}", f"--sweep_dir={out}", data, "--dry_run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "fastat-eps8-seed0: waiting for tuning" in dry.stdout
    assert "tuning/fastat-eps8-lr_max0.05-seed100: new" in dry.stdout
    assert dry.stdout.strip().splitlines()[-1] == "3 cells: 2 new, 1 waiting for tuning"

    done = run_sweep(f"--sweep={path}", f"--sweep_dir={out}", data, tree=committed_tree)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    order = [line.split("] ")[1].split(":")[0] for line in lines if line.startswith("[")]
    assert order[-1] == "fastat-eps8-seed0" and all(n.startswith("tuning/") for n in order[:-1])
    picks = json.loads((out / "tuning.json").read_text())["picks"]
    entry = picks["fastat-eps8"]
    means = {c["label"]: c["mean"] for c in entry["candidates"]}
    assert entry["pick"] == max(means, key=means.get)  # no tie among two real runs' numbers
    for run in (out / "tuning").iterdir():
        results = json.loads((run / "results.json").read_text())
        assert results["status"] == "complete" and "final" not in results
        assert results["config"]["final_test"] is False
        assert [n for n in os.listdir(run) if n.startswith("eval-")] == []
    started = [
        line
        for log in (out / "logs" / "tuning").iterdir()
        for line in log.read_text().splitlines()
        if line.startswith("$ python")
    ]
    assert len(started) == 2 and all("/train.py " in line for line in started)
    assert all("--nofinal_test" in line for line in started)
    final = out / "fastat-eps8-seed0"
    flags = (final / "flags.txt").read_text().splitlines()
    assert f"--lr_max={entry['flags']['lr_max']:g}" in flags
    assert json.loads((final / "results.json").read_text())["config"]["lr_max"] == pytest.approx(
        entry["flags"]["lr_max"]
    )
    assert (final / "eval-pgd.json").exists()
    report = json.loads((out / "sweep.json").read_text())
    assert [c["name"] for c in report["cells"]] == ["fastat-eps8-seed0"]
    assert report["tuning"]["units"][0]["pick"] == entry["pick"]
    table = (out / "sweep.md").read_text()
    assert "## Tuning" in table and "Wong et al. 2020, Sec. 5.1" in table
    assert "**picked**" in table and f"[tuned: lr_max={entry['flags']['lr_max']:g}]" in table

    # The pick's validation number beside its final cell's test number, from the runs' files.
    def at_selected(run_dir):
        history = json.loads((run_dir / "results.json").read_text())["history"]
        best = [epoch for epoch in history if epoch["val_best"] == 1.0][-1]
        return 100 * best["val_robust_accuracy"]

    tuned = at_selected(out / "tuning" / f"fastat-eps8-{entry['pick']}-seed100")
    validation = at_selected(final)
    test = 100 * json.loads((final / "eval-pgd.json").read_text())["robust_accuracy"]["pgd@8"]
    row = (
        f"| fastat | 8 | lr_max={entry['flags']['lr_max']:g} | {tuned:.1f} | {validation:.1f} "
        f"(1 cell) | {test:.1f} | {validation - test:+.1f} |"
    )
    assert "## The tuning criterion against the test" in table and row in table, table
    # Started again: nothing runs, the pick stands.
    again = run_sweep(f"--sweep={path}", f"--sweep_dir={out}", data, tree=committed_tree)
    assert again.returncode == 0 and "3 cells (2 of them tuning runs), 3 done" in again.stdout


def test_a_pick_at_its_grid_s_edge_extends_the_grid_until_interior_or_at_a_bound(tmp_path):
    """Validation accuracy as a function of the learning rate, peaking at 0.4 (a hand-made
    curve): from candidates 0.1 and 0.2 the best sits at the top edge, so 0.4 is added; then
    at 0.4, still the top, so 0.8; now 0.4 is interior and is picked. With a bound of 0.4 the
    grid stops there and the pick says it stands at the bound, and why; with a bound of 0.7,
    between 0.4 and the next step, the pick says that step would pass it."""
    curve = {0.1: 0.30, 0.2: 0.40, 0.4: 0.50, 0.8: 0.45}

    def spec(maximum):
        group = _group(candidates=[{"lr_max": 0.1}, {"lr_max": 0.2}], released=[{"lr_max": 0.2}])
        group["extend"] = {
            "lr_max": {"factor": 2, "min": 0.01, "max": maximum, "why": "a stated bound"}
        }
        return {"seeds": [100], "groups": [group]}

    for maximum, added, picked, edge in (
        (1.0, ["lr_max0.4", "lr_max0.8"], 0.4, "interior"),
        (0.4, ["lr_max0.4"], 0.4, "the largest tried, at the bound 0.4 (a stated bound)"),
        (
            0.7,
            ["lr_max0.4"],
            0.4,
            "the largest tried: the next, 0.8, would pass the bound 0.7 (a stated bound)",
        ),
    ):
        folder = tmp_path / f"max{maximum:g}"
        folder.mkdir()
        definition = sweeps.load_definition(tuning_definition(folder, spec(maximum)))
        out = str(folder / "out")
        grown = []
        for _ in range(5):
            for run in tuning.tuning_cells(definition):
                if not os.path.exists(os.path.join(out, run.name, "results.json")):
                    rate = run.flags["lr_max"]
                    write_run(os.path.join(out, run.name), "fastat", run.seed, [curve[rate]])
            before = {c.name for c in tuning.tuning_cells(definition)}
            picks = tuning.settle(definition, out)
            grown += sorted({c.name for c in tuning.tuning_cells(definition)} - before)
            if picks:
                break
        (entry,) = picks
        assert [name.split("-")[2] for name in grown] == added
        assert entry.flags == {"lr_max": picked} and entry.edges == {"lr_max": edge}
        origins = {c.label: c.origin for c in entry.candidates}
        assert origins["lr_max0.2"] == "released" and origins["lr_max0.1"] == "extrapolated"
        assert all(origins[name] == "extrapolated" for name in added)
        saved = json.loads((folder / "out" / "tuning.json").read_text())
        assert [c["lr_max"] for c in saved["extensions"]["fastat-eps8"]] == [
            float(a.removeprefix("lr_max")) for a in added
        ]
        # A later start reads the grown grid back: the same runs, the pick standing.
        again = sweeps.load_definition(tuning_definition(folder, spec(maximum)))
        tuning.refresh(again, out)
        assert again.picks["fastat-eps8"] == {"lr_max": picked}
        assert len(tuning.tuning_cells(again)) == 2 + len(added)
