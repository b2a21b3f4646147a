"""bench/harness.py's bookkeeping: method variants by name, turns, medians over rounds, and the
files a script publishes."""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
)

import harness  # noqa: E402


def test_a_variant_names_its_method_and_options():
    assert harness.parse_variant("fastbat") == ("fastbat", {})
    assert harness.parse_variant("fastbat:ig=none") == ("fastbat", {"ig": "none"})
    assert harness.parse_variant("free:replays=4:alpha=0.01:x=true") == (
        "free",
        {"replays": 4, "alpha": 0.01, "x": True},
    )
    assert harness.variant_label("fastbat:ig=none") == "fastbat ig=none"
    assert harness.variant_label("fastat") == "fastat"
    with pytest.raises(ValueError, match="name:key=value"):
        harness.parse_variant("fastbat:ig")


def test_calls_take_turns_and_alternate_on_request():
    order = []
    calls = {name: (lambda name=name: order.append(name) or len(order)) for name in "ab"}
    assert harness.in_turns(calls, rounds=2) == {"a": [1, 3], "b": [2, 4]}
    assert order == ["a", "b", "a", "b"]
    order.clear()
    assert harness.in_turns(calls, rounds=2, alternate=True) == {"a": [1, 4], "b": [2, 3]}
    assert order == ["a", "b", "b", "a"]


def test_numbers_are_medians_over_rounds_and_the_rest_the_first_round():
    rounds = [{"s": 3.0, "n": 1, "ok": True}, {"s": 1.0, "n": 1, "ok": False}, {"s": 2.0, "n": 1}]
    assert harness.median_of(rounds) == {"s": 2.0, "n": 1, "ok": True}


def test_a_table_has_its_heading_columns_and_rows():
    assert harness.table("Heading", ["method", "s"], [["fastat", "0.41"], ["free", ""]]) == (
        "Heading\n\n| method | s |\n|---|---|\n| fastat | 0.41 |\n| free | |"
    )
    assert harness.table(None, ["a"], [[1]]) == "| a |\n|---|\n| 1 |"


def test_publish_prints_the_table_and_writes_the_record_and_the_table_beside_it(tmp_path, capsys):
    record = {"command": "python bench/x.py", "rows": [{"method": "fastat", "s": 0.41}], "ok": True}
    markdown = harness.table("A heading", ["method", "s"], [["fastat", "0.41"]])
    folder = tmp_path / "results"  # not there yet: made for the JSON
    harness.publish(markdown, record, str(folder / "x.json"), markdown_path=str(folder / "x.md"))
    assert capsys.readouterr().out == markdown + "\n"
    written = (folder / "x.json").read_text()
    assert json.loads(written) == record
    assert written == json.dumps(record, indent=2)  # as the committed records: indent 2, no newline
    table = (folder / "x.md").read_text()
    assert table == "A heading\n\n| method | s |\n|---|---|\n| fastat | 0.41 |\n"
    # Without a Markdown path only the JSON is written; without either, the table is only printed.
    harness.publish(markdown, {"n": 1}, str(folder / "y.json"))
    harness.publish(markdown, {"n": 2}, None)
    assert capsys.readouterr().out == 2 * (markdown + "\n")
    assert sorted(os.listdir(folder)) == ["x.json", "x.md", "y.json"]
    assert json.loads((folder / "y.json").read_text()) == {"n": 1}
