"""bench/harness.py's bookkeeping: method variants by name, turns, and medians over rounds."""

from __future__ import annotations

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
