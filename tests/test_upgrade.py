"""Older files read as today's, in one place (fbat_tf/upgrade.py, and records/upgrade.py for
what needs the records alone): every committed results.json, eval-*.json, sweep.json and sweep
definition reads through it into today's records, which read again give the same records and
hold no older key; and each older schema, in a small example written out here, reads into
today's form with the numbers worked out by hand."""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import pytest

from fbat_tf import upgrade
from fbat_tf.records import (
    CellResult,
    EvaluationResult,
    MethodRecord,
    RunRecord,
    TrainConfig,
    eps_key,
)
from fbat_tf.records import upgrade as records_upgrade
from fbat_tf.sweeps import evaluations
from fbat_tf.sweeps.definition import load_definition
from fbat_tf.sweeps.errors import DefinitionError
from tests.committed import by_folder, check_each

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "study", "results")


def _results_files(pattern: str) -> list[str]:
    """The results' files of this name, not those of a checkout a sweep pinned (under its
    code/ folder, a copy of the tree at its revision, never committed)."""
    found = glob.glob(os.path.join(RESULTS, "**", pattern), recursive=True)
    return sorted(p for p in found if "code" not in os.path.relpath(p, RESULTS).split(os.sep))


RECORDS = _results_files("results.json")
EVALUATIONS = _results_files("eval-*.json")
SWEEPS = sorted(glob.glob(os.path.join(RESULTS, "*", "sweep.json")))
DEFINITIONS = sorted(
    glob.glob(os.path.join(ROOT, "configs", "sweeps", "*.json"))
    + glob.glob(os.path.join(ROOT, "study", "definitions", "*.json"))
)

# The keys of a final test that today's evaluation schema no longer has.
OLDER_FINAL_KEYS = {
    "test_examples",
    "test_clean_accuracy",
    "test_pgd_robust_accuracy",
    "eval_time_s",
    "test_aa_robust_accuracy",
    "test_aa_per_attack",
    "aa_time_s",
    "aa_version",
}
PLAIN = {"second_order": 0, "tangent": 0}


def _saved(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def test_the_committed_files_hold_each_older_schema_they_are_read_from():
    """What the tests below read through the upgrade: many files, and among them each older
    schema the upgrade reads (a run's history always marked its best epoch in them)."""
    assert len(RECORDS) >= 250 and len(EVALUATIONS) >= 350 and len(SWEEPS) >= 4
    saved = [_saved(path) for path in RECORDS]
    older_final = [s for s in saved if "test_examples" in (s.get("final") or {})]
    assert len(older_final) >= 150
    assert sum("passes" not in s["method"] for s in saved) >= 50
    zero = [s for s in saved if s["method"].get("ig_coef") == 0 and s["method"]["ig"] != "none"]
    assert len(zero) == 2
    older_blocks = [p for p in DEFINITIONS if "attacks" not in _saved(p).get("evaluation", {})]
    assert len(older_blocks) == 2


@pytest.mark.parametrize("folder", sorted(by_folder(RECORDS)))
def test_every_committed_record_reads_through_the_upgrade_as_today_s(folder):
    check_each(by_folder(RECORDS)[folder], _reads_as_today_s)


def _reads_as_today_s(path: str) -> None:
    record = upgrade.read_run(path)
    written = record.to_dict()
    # Today's schema: read again, through the records alone or the whole upgrade, it is the
    # same record, written the same.
    for again in (RunRecord.from_dict(written), upgrade.run(RunRecord.from_dict(written))):
        assert json.dumps(again.to_dict()) == json.dumps(written)
        assert again.final == record.final and again.method == record.method
    # No older key survives, and what today's records hold is there.
    if record.final is not None:
        assert "robust_accuracy" in written["final"]
        assert not OLDER_FINAL_KEYS & set(written["final"])
    assert {"name", "cost_variant", "passes"} <= set(written["method"])
    assert written["method"]["name"] == record.config.method
    for epoch in written["history"]:
        assert ("val_robust_accuracy" in epoch) <= ("val_best" in epoch)
    config = record.method.config
    if config.get("ig_coef") == 0:
        assert config["ig"] == "none" and record.method.cost_variant == "fastbat ig=none"


def test_every_committed_evaluation_reads_as_today_s():
    """evaluate.py's schema has not changed (fbat_tf/upgrade.py): each file reads into an
    EvaluationResult written as it was, and read again the same."""
    for path in EVALUATIONS:
        result = EvaluationResult.load(path)
        assert result.to_dict() == _saved(path), path
        assert EvaluationResult.from_dict(result.to_dict()) == result, path


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_committed_sweep_says_what_its_files_read_through_the_upgrade_say(path):
    """Each trained cell of sweep.json: its training as its record in today's form says (the
    cost variant and passes derived for older runs, the selected epoch), and each evaluation's
    robust accuracy by ε as the file it names."""
    trained = 0
    for saved in _saved(path)["cells"]:
        cell = CellResult.from_dict(saved)
        if cell.train is None or cell.train.status not in ("complete", "diverged"):
            continue  # a running sweep's report holds a snapshot of its cells in training
        trained += 1
        record = upgrade.read_run(os.path.join(ROOT, cell.train.source))
        selected = record.selected_epoch()
        assert (cell.train.cost_variant, cell.train.passes) == (
            record.method.cost_variant,
            record.method.passes,
        )
        assert cell.train.selected_epoch == (None if selected is None else selected.epoch)
        assert cell.title == record.method.title and cell.train.status == record.status
        for evaluation in cell.evaluations.values():
            for eps, source in evaluation.sources.items():
                if evaluation.is_checked(eps):
                    continue  # the masking check's combined accuracy replaced the file's
                found = EvaluationResult.load(os.path.join(ROOT, source))
                robust = {eps_key(r.eps): r.robust_accuracy for r in found.robust}
                assert evaluation.robust_accuracy.get(eps, robust[eps]) == robust[eps]
    # A tuned sweep's final cells train after its tuning stage: none may have trained yet.
    assert trained or _saved(path).get("tuning") is not None


@pytest.mark.parametrize("path", DEFINITIONS, ids=os.path.basename)
def test_every_committed_definition_s_evaluation_reads_as_today_s(path):
    given = _saved(path).get("evaluation", {})
    today = upgrade.evaluation_block(given)
    assert "attacks" in today and upgrade.evaluation_block(today) == today
    definition = load_definition(path)
    assert evaluations.parse_evaluations(path, today) == (
        definition.batch_size,
        definition.evaluations,
    )


# ------------------------------------------------------------------ each older schema


# A run's final test as train.py wrote it before it was an evaluation's result (ε 16/255).
OLDER_FINAL = {
    "test_examples": 500,
    "test_clean_accuracy": 0.836,
    "test_pgd_robust_accuracy": 0.738,
    "pgd_steps": 10,
    "pgd_restarts": 1,
    "eval_time_s": 5.0,
    "test_aa_robust_accuracy": 0.714,
    "aa_version": "standard",
    "aa_time_s": 3.5,
    "test_aa_per_attack": {"clean": 0.836, "apgd-ce": 0.72, "square": 0.714},
}


def test_a_final_test_from_before_the_evaluation_schema():
    config = TrainConfig(workdir="w", eps=16 / 255, dataset="fashion_mnist")
    older = OLDER_FINAL
    today = records_upgrade.final_test(older, config)
    assert today == {
        "examples": 500,
        "clean_accuracy": 0.836,
        "robust_accuracy": {"pgd@16": 0.738, "autoattack@16": 0.714},
        # 5.0 s for both attacks, of which AutoAttack took 3.5.
        "time_s": {"pgd@16": 1.5, "autoattack@16": 3.5},
        "dataset": "fashion_mnist",
        "pgd_steps": 10,
        "pgd_restarts": 1,
        "aa_version": "standard",
        "autoattack_per_attack": {
            "autoattack@16": {"clean": 0.836, "apgd-ce": 0.72, "square": 0.714}
        },
    }
    assert records_upgrade.final_test(today, config) is today
    # PGD alone, its time not recorded, at the default ε (8/255) and dataset.
    bare = {"test_examples": 4, "test_clean_accuracy": 0.5, "test_pgd_robust_accuracy": 0.25}
    assert records_upgrade.final_test(bare, TrainConfig(workdir="w")) == {
        "examples": 4,
        "clean_accuracy": 0.5,
        "robust_accuracy": {"pgd@8": 0.25},
        "time_s": {"pgd@8": None},
        "dataset": "cifar10",
        "autoattack_per_attack": {},
    }
    final = RunRecord.from_dict({"config": {"workdir": "w"}, "final": bare}).final
    assert final.robust_accuracy("pgd", 8) == 0.25 and final.examples == 4


def test_a_history_from_before_validation_marked_its_best_epoch():
    older = [
        {"epoch": 1, "val_robust_accuracy": 0.2},
        {"epoch": 2, "val_robust_accuracy": None},  # NaN, written as null
        {"epoch": 3, "val_robust_accuracy": 0.35},
        {"epoch": 4, "val_robust_accuracy": 0.3},
        {"epoch": 5, "val_robust_accuracy": 0.35},  # a tie: not better
        {"epoch": 6, "val_nonfinite_examples": 3.0},  # validation met non-finite logits
    ]
    record = RunRecord.from_dict({"config": {"workdir": "w"}, "history": older})
    assert [e.get("val_best") for e in record.history] == [1.0, 0.0, 1.0, 0.0, 0.0, None]
    assert record.selected_epoch().epoch == 3
    # The accuracies themselves as written.
    assert [e.logs.get("val_robust_accuracy") for e in record.history] == [
        o.get("val_robust_accuracy") for o in older
    ]
    # Today's marks stay as validation wrote them, even where they say another epoch.
    marked = [{**e, "val_best": float(e["epoch"] == 4)} for e in older[:5]]
    again = RunRecord.from_dict({"config": {"workdir": "w"}, "history": marked})
    assert again.selected_epoch().epoch == 4
    epochs = again.history
    assert records_upgrade.history(epochs) is epochs
    nothing = RunRecord.from_dict({"config": {"workdir": "w"}, "history": [older[-1]]})
    assert nothing.selected_epoch() is None and "val_best" not in nothing.history[0].logs


def test_a_method_record_from_before_its_cost_variant_and_passes():
    older = MethodRecord.from_dict({"name": "pgd", "eps": 8 / 255, "alpha": 4 / 255, "steps": 3})
    today = upgrade.method(older, "pgd")
    # PGD-3-AT: three input gradients, then the weight gradient.
    assert today.passes == {"forward": 4, "backward": 4, **PLAIN}
    assert today.cost_variant == "pgd steps=3"
    assert (today.name, today.title, today.config) == ("pgd", None, older.config)
    assert upgrade.method(today, "pgd") == today
    # What a run recorded is kept as it recorded it, not derived again.
    recorded = dataclasses.replace(today, passes={"forward": 9}, cost_variant="pgd steps=8")
    assert upgrade.method(recorded, "pgd") == recorded
    # A record with no method block: the method its config trained, at its defaults.
    bare = upgrade.run(RunRecord(TrainConfig(workdir="w", method="fastat")))
    assert bare.method == MethodRecord(
        "fastat", None, "fastat", {"forward": 2, "backward": 2, **PLAIN}, {}
    )


def test_a_fast_bat_config_from_before_ig_coef_0_was_recorded_as_first_order():
    written = {
        "name": "fastbat",
        "eps": 16 / 255,
        "lambda_inv": 2500 / 255,
        "ig_coef": 0.0,
        "ig": "hessian_free",
        "linearization": "pgd_nosign",
        "cg_steps": 3,
    }
    today = upgrade.method(MethodRecord.from_dict(written), "fastbat")
    assert today.config == {**MethodRecord.from_dict(written).config, "ig": "none"}
    # First-order Fast-BAT: step 1's gradient at the start, step 2's and step 3's.
    assert today.passes == {"forward": 3, "backward": 3, **PLAIN}
    assert today.cost_variant == "fastbat ig=none"
    # A coefficient above 0 is the full method: one more backward pass, and a second-order one.
    full = upgrade.method(MethodRecord.from_dict({**written, "ig_coef": 0.1}), "fastbat")
    assert full.config["ig"] == "hessian_free" and full.cost_variant == "fastbat"
    assert full.passes == {"forward": 3, "backward": 4, "second_order": 1, "tangent": 0}


def test_a_sweep_definition_s_evaluation_from_before_it_listed_its_attacks():
    older = {"pgd_steps": 20, "pgd_examples": 200, "batch_size": 100}
    assert upgrade.evaluation_block(older) == {
        "attacks": [
            {
                "attack": "pgd",
                "eps": "grid",
                "options": {"steps": 20, "restarts": 10},  # the catalog's restarts
                "examples": 200,
            },
            {"attack": "autoattack", "eps": "own"},
        ],
        "batch_size": 100,
    }
    batch_size, (pgd, autoattack) = evaluations.parse_evaluations("d.json", older)
    assert batch_size == 100
    assert (pgd.name, pgd.eps, pgd.examples, pgd.options) == (
        "pgd",
        "grid",
        200,
        {"steps": 20, "restarts": 10},
    )
    assert (autoattack.name, autoattack.eps, autoattack.examples) == ("autoattack", "own", 1000)
    # No "evaluation" at all: the older form's defaults, PGD-50-10.
    assert evaluations.parse_evaluations("d.json", {})[1][0].options == {
        "steps": 50,
        "restarts": 10,
    }
    with pytest.raises(DefinitionError, match=r"d.json: unknown evaluation keys \['pgd_step'\]"):
        evaluations.parse_evaluations("d.json", {"pgd_step": 3})
    with pytest.raises(DefinitionError, match="d.json: evaluation 'pgd_examples' must be an"):
        evaluations.parse_evaluations("d.json", {"pgd_examples": 0})


def test_an_older_results_file_reads_through_the_upgrade_whole(tmp_path):
    """A results.json as the first runs wrote it, each older part at once, read from its file."""
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps(
            {
                "config": {"workdir": str(tmp_path), "method": "fastbat", "eps": 8 / 255},
                "status": "complete",
                "history": [
                    {"epoch": 1, "val_robust_accuracy": 0.4},
                    {"epoch": 2, "val_robust_accuracy": 0.38},
                ],
                "method": {"name": "fastbat", "eps": 8 / 255, "ig_coef": 0.0},
                "final": {
                    "test_examples": 10,
                    "test_clean_accuracy": 0.7,
                    "test_pgd_robust_accuracy": 0.3,
                    "eval_time_s": 2.0,
                },
            }
        )
    )
    record = upgrade.read_run(str(path))
    assert record.selected_epoch().epoch == 1
    assert record.final.attacked("pgd", 8).seconds == 2.0
    assert record.method.cost_variant == "fastbat ig=none"
    assert sum(record.method.passes.values()) == 6
    assert upgrade.read_run(str(tmp_path / "absent.json")) is None
