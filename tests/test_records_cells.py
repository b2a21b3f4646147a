"""A sweep's cells as types: every cell of every committed sweep.json reads into a CellResult
and is written back as it was, key for key and in the same order, ε keys as numbers in between;
a cell of another shape is refused naming what is amiss."""

from __future__ import annotations

import dataclasses
import glob
import json
import os

import pytest

from fbat_tf.records import CellResult, EvaluationSummary, MaskingEntry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEPS = sorted(glob.glob(os.path.join(ROOT, "study", "results", "*", "sweep.json")))


def test_the_committed_sweeps_are_there():
    names = {os.path.basename(os.path.dirname(path)) for path in SWEEPS}
    assert {"fashion_mnist", "fashion_mnist_fast", "fashion_mnist_ig", "fashion_mnist_tuned"} <= (
        names
    )


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_committed_cell_reads_and_is_written_back_as_it_was(path):
    with open(path) as f:
        cells = json.load(f)["cells"]
    assert cells
    for saved in cells:
        cell = CellResult.from_dict(saved)
        assert cell.to_dict() == saved
        assert json.dumps(cell.to_dict()) == json.dumps(saved)  # the same order
        assert cell.name == saved["name"] and cell.eps == float(saved["eps"])
        for name, evaluation in cell.evaluations.items():
            assert all(isinstance(eps, float) for eps in evaluation.robust_accuracy)
            for eps, value in saved[name]["robust_accuracy"].items():
                assert evaluation.robust(float(eps)) == value


def _saved_cell() -> dict:
    with open(os.path.join(ROOT, "study", "results", "fashion_mnist", "sweep.json")) as f:
        return next(c for c in json.load(f)["cells"] if c["name"] == "fastbat-eps8-seed0")


def test_a_cell_reads_by_attribute_and_its_budgets_are_numbers():
    saved = _saved_cell()
    cell = CellResult.from_dict(saved)
    assert cell.train.selected_epoch == saved["train"]["selected_epoch"]
    assert cell.train.ig_norm_ratio == saved["train"]["ig_norm_ratio"]
    pgd = cell.evaluation("pgd")
    assert pgd.robust(8) == pgd.robust(8.0) == saved["pgd"]["robust_accuracy"]["8"]
    assert pgd.robust(7) is None and cell.evaluation("fgsm") is None
    assert list(pgd.robust_accuracy) == [8.0, 16.0, 32.0, 48.0, 64.0, 76.0]
    with pytest.raises(AttributeError):
        cell.train.val_robust_acuracy  # noqa: B018 (a misspelt field fails at once)
    with pytest.raises(TypeError):
        cell["train"]  # noqa: B018


def test_checked_numbers_outcomes_and_masking_entries_round_trip():
    """The parts no committed sweep holds yet: a masking check at each state, the checked
    accuracies with the unchecked ones kept, per-point outcomes, numbers that are no accuracy."""
    saved = _saved_cell()
    parts = saved["autoattack"]
    evaluation = {  # in the order results.py writes them
        **{key: parts[key] for key in ("source", "label", "examples", "clean_accuracy")},
        "robust_accuracy": {"8": 0.35},
        "unusable": {"16": "eval-autoattack.json: robust accuracy nan ..., left out"},
        **{key: parts[key] for key in ("sources", "time_s", "per_part", "part_seconds", "code")},
        "outcomes": {"8": {"points": "1101", "split": "test"}},
        "unchecked_robust_accuracy": {"8": 0.4},
        "checked": ["8"],
    }
    entries = {
        "8": {
            "triggered": True,
            "gap": 5.0,
            "threshold": 1.0,
            "autoattack": 0.4,
            "source": "a/eval-autoattack.json",
            "label": "Square-10000×5",
            "combined_outcomes": "1100",
            "state": "checked",
            "strong": 0.45,
            "strong_source": "a/eval-masking.json",
            "combined": 0.35,
            "combined_by": "per point",
            "code": None,
        },
        "16": {
            "triggered": True,
            "gap": 3.0,
            "threshold": 1.0,
            "autoattack": 0.2,
            "source": "a/eval-autoattack.json",
            "label": "Square-10000×5",
            "state": "pending",
            "strong": None,
            "combined": None,
        },
        "32": {
            "triggered": False,
            "gap": None,
            "threshold": 1.0,
            "autoattack": 0.1,
            "source": "a/eval-autoattack.json",
            "state": "not triggered",
        },
    }
    head = {k: v for k, v in saved.items() if k != "code"}
    given = {**head, "autoattack": evaluation, "masking_check": entries, "code": saved["code"]}
    cell = CellResult.from_dict(given)
    assert json.dumps(cell.to_dict()) == json.dumps(given)
    checked = cell.evaluation("autoattack")
    assert checked.is_checked(8) and not checked.is_checked(16)
    assert checked.outcome(8).points == "1101" and checked.unchecked_robust_accuracy == {8.0: 0.4}
    assert [entry.state for entry in cell.masking_check.values()] == [
        "checked",
        "pending",
        "not triggered",
    ]
    assert isinstance(cell.masking_check[16.0], MaskingEntry)


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda c: c["train"].update(val_robust_acuracy=[]), "holds ['val_robust_acuracy']"),
        (lambda c: c["train"].pop("passes"), "lacks ['passes']"),
        (lambda c: c["pgd"].update(robust_accuracy={"eight": 0.5}), "not budgets"),
        (lambda c: c["pgd"].update(robust_accuracy={"8.0": 0.5}), "as results name them"),
        (lambda c: c.pop("title"), "holds one of train and title"),
        (lambda c: c.update(tuning={"unit": "x"}), "tuning or code of another shape"),
        (
            lambda c: c.update(autoatack={"robust_accuracy": {}}),
            "cell fastbat-eps8-seed0.autoatack",
        ),
    ],
)
def test_a_cell_of_another_shape_is_refused_naming_what_is_amiss(edit, says):
    saved = _saved_cell()
    edit(saved)
    with pytest.raises(ValueError) as refused:
        CellResult.from_dict(saved)
    assert says in str(refused.value), str(refused.value)


def test_an_evaluation_summary_is_frozen_its_budgets_numbers():
    summary = EvaluationSummary.from_dict(_saved_cell()["pgd"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        summary.label = "other"  # type: ignore[misc]
    assert summary.time_s[8.0] == _saved_cell()["pgd"]["time_s"]["8"]
