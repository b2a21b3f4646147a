"""The sweep report marks ¶ every cell whose evaluation at its ε an indicator of attack failure
or a reference AutoAttack check touched, and says what fired: checked here against the committed
evaluation files read as raw JSON, apart from the code that wrote the report."""

from __future__ import annotations

import glob
import json
import os

import pytest

from fbat_tf.records import CellResult, EvaluationResult
from study import readings
from study.cells import _indicated
from tests.conftest import ROOT

SWEEP = os.path.join(ROOT, "study", "results", "fashion_mnist_interior")


def _fired_in_file(path: str, eps: float) -> set[str]:
    """What fired on the attack at ε in an evaluate.py file, read from its JSON alone."""
    with open(path) as f:
        saved = json.load(f)
    held = saved.get("indicators")
    if held is None:
        return set()
    keys = [key for key in saved["robust_accuracy"] if float(key.split("@")[1]) == eps]
    fired = set()
    for key in keys:
        for name, count in (held["attacks"].get(key) or {}).items():
            if count is not None and count["points"] > 0:
                fired.add(name)
        for name, check in held["checks"].items():
            if check["fired"] and (not check["keys"] or key in check["keys"]):
                fired.add(name)
    return fired


def _committed_cells() -> list[dict]:
    with open(os.path.join(SWEEP, "sweep.json")) as f:
        return json.load(f)["cells"]


def test_every_cell_an_indicator_touched_is_listed_with_what_fired_and_no_other():
    with open(os.path.join(SWEEP, "sweep.md")) as f:
        table = f.read()
    footnote = table[table.index("¶ An indicator of attack failure") :].split("\n\n")[1]
    listed = {}
    for line in footnote.splitlines():
        name, _, said = line.removeprefix("- ").partition(", ")
        listed.setdefault(name, []).append(said)
    expected = {}
    for cell in _committed_cells():
        for path in glob.glob(os.path.join(SWEEP, cell["name"], "eval-*.json")):
            if "masking" in os.path.basename(path):
                continue  # the masking check's own Square, reported in its footnote
            fired = _fired_in_file(path, cell["eps"])
            if fired:
                expected.setdefault(cell["name"], set()).update(fired)
    assert expected, "the committed study holds no evaluation an indicator touched"
    assert set(listed) == set(expected)
    for name, fired in expected.items():
        said = " ".join(listed[name])
        assert {f.replace("_", " ") for f in fired} == {
            words for part in listed[name] for words in part.split(": ", 1)[1].split(", ")
        }, (name, said)


def test_a_variant_is_marked_in_the_table_where_one_of_its_cells_was_touched():
    with open(os.path.join(SWEEP, "sweep.json")) as f:
        saved = json.load(f)
    cells = [CellResult.from_dict(c) for c in saved["cells"]]
    touched = readings.indicated(cells)
    assert touched
    with open(os.path.join(SWEEP, "sweep.md")) as f:
        rows = [line for line in f.read().splitlines() if line.startswith("| ") and " | " in line]
    named = [e["name"] for e in saved["evaluation"]["attacks"]]
    for (variant, eps), group in readings.groups(cells).items():
        # The table's figures and marks are over the cells with every evaluation; a cell between
        # its attacks (an interim report) joins when its last attack is in.
        done = [c for c in group if all(name in c.evaluations for name in named)]
        row = next(
            (r for r in rows if r.startswith(f"| {variant} (") and f" | {eps:g} | " in r), None
        )
        if row is None or not done:
            continue
        label = row.split(" | ")[0]
        assert ("¶" in label) == any(c.name in touched for c in done), row


def test_what_fired_is_read_per_attack_and_a_check_for_all_touches_each():
    result = EvaluationResult.from_dict(
        {
            "examples": 4,
            "clean_accuracy": 0.5,
            "loss": 1.0,
            "robust_accuracy": {"pgd@8": 0.25, "square@8": 0.25, "pgd@16": 0.0},
            "time_s": {},
            "indicators": {
                "points": 4,
                "attacks": {
                    "pgd@8": {"incomplete_optimization": {"points": 1, "of": 4}},
                    "square@8": {"incomplete_optimization": {"points": 0, "of": 4}},
                    "pgd@16": {"silent_success": None},
                },
                "checks": {"square_beats_white_box": {"fired": True, "keys": ["pgd@16"]}},
            },
        }
    )
    assert _indicated(result) == {
        8.0: ("incomplete_optimization",),
        16.0: ("square_beats_white_box",),
    }
    result.indicators = None
    assert _indicated(result) == {}


@pytest.mark.parametrize("fired", [(), ("zero_gradients",)])
def test_the_words_of_a_comparison_name_the_runs_touched(fired):
    with open(os.path.join(SWEEP, "sweep.json")) as f:
        saved = json.load(f)
    cell = CellResult.from_dict(next(c for c in saved["cells"] if c.get("autoattack")))
    evaluation = cell.evaluations["autoattack"]
    changed = {k: v for k, v in evaluation.to_dict().items() if k != "indicated"}
    if fired:
        changed["indicated"] = {f"{cell.eps:g}": list(fired)}
    again = type(evaluation).from_dict(changed)
    assert type(evaluation).from_dict(again.to_dict()) == again
    pgd = {k: v for k, v in cell.evaluations["pgd"].to_dict().items() if k != "indicated"}
    other = CellResult.from_dict({**cell.to_dict(), "autoattack": changed, "pgd": pgd})
    words = readings.indicated_words([other])
    if fired:
        assert words == f"indicators ¶: {cell.variant} in 1 of 1 runs (zero gradients)"
    else:
        assert words is None


def test_a_cost_verdict_names_each_kind_of_mark_once():
    """The cost table's verdict carries the marks of its comparison, over the runs it pairs on
    both sides; its own row's marks repeated beside them would name a variant twice over
    different runs (in the committed reports, read as the user reads them)."""
    rows = 0
    for path in glob.glob(os.path.join(ROOT, "study", "results", "*", "sweep.md")):
        with open(path) as f:
            text = f.read()
        if "## Robustness against cost" not in text:
            continue
        table = text.split("## Robustness against cost", 1)[1].split("\n## ", 1)[0]
        for line in table.splitlines():
            if not line.startswith("| ") or "verdict (Holm)" in line:
                continue
            rows += 1
            for kind in ("masked §:", "indicators ¶:", "masking check ‡"):
                assert line.count(kind) <= 1, (path, kind, line[:200])
    assert rows > 0
