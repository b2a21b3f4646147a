"""The interior study (results/fashion_mnist_interior/) holds what its definition promises: every
tuning pick interior to its grid or at a bound the definition states, each candidate marked as an
author's released value or extrapolated, worked out here from the candidates and the definition
alone, not from the words the sweep wrote."""

from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = "fashion_mnist_interior"


def _json(*path: str):
    with open(os.path.join(ROOT, *path)) as f:
        return json.load(f)


def _groups() -> dict[str, dict]:
    """The definition's tuning groups by unit prefix (method, and the match's `ig`)."""
    definition = _json("configs", "sweeps", f"{SWEEP}.json")
    found = {}
    for group in definition["tuning"]["groups"]:
        ig = (group.get("match") or {}).get("ig")
        found[group["method"] + (f"-ig{ig}" if ig else "")] = group
    return found


def _next(value: float, factor: float, up: bool) -> float:
    """The grid's next value past `value`, as the definition's factor makes it (4 digits)."""
    return float(f"{value * factor if up else value / factor:.4g}")


def test_every_pick_is_interior_or_at_a_stated_bound():
    """For every flag a unit's grid extends: among the candidates that agree with the pick on
    its other flags, the pick's value has a larger and a smaller neighbour (interior), or the
    next value in the direction it is at the edge lies outside the definition's bounds; the
    sweep's words for it say the same."""
    picks = _json("results", SWEEP, "tuning.json")["picks"]
    groups = _groups()
    interior, bounded = 0, []
    for unit, entry in picks.items():
        group = groups[unit.rsplit("-eps", 1)[0]]
        chosen = entry["flags"]
        for flag, spec in group["extend"].items():
            line = [
                c["flags"][flag]
                for c in entry["candidates"]
                if {k: v for k, v in c["flags"].items() if k != flag}
                == {k: v for k, v in chosen.items() if k != flag}
            ]
            value = chosen[flag]
            up, down = value >= max(line), value <= min(line)
            if not (up or down):
                interior += 1
                assert entry["edges"][flag] == "interior", (unit, flag)
                continue
            beyond = _next(value, spec["factor"], up)
            assert not spec["min"] <= beyond <= spec["max"], (unit, flag, beyond)
            assert spec["why"] in entry["edges"][flag], (unit, flag)
            bounded.append((unit, flag))
    assert sorted(bounded) == [
        ("fastbat-ighessian_free-eps76", "ig_coef"),
        ("fgsm_pgi-eps48", "fgsm_pgi_lambda"),
        ("fgsm_pgi-eps76", "fgsm_pgi_lambda"),
    ]
    assert interior == 15


def test_every_candidate_is_marked_released_or_extrapolated_as_the_definition_says():
    """A candidate is released exactly where the definition lists its flags among the group's
    released settings; one the grid gained is extrapolated and marked added; the report's tuning
    table shows both."""
    picks = _json("results", SWEEP, "tuning.json")["picks"]
    groups = _groups()
    with open(os.path.join(ROOT, "results", SWEEP, "sweep.md")) as f:
        section = f.read().split("## Tuning\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split(" | ") for line in section.splitlines() if line.startswith("| ")]
    heading, rows = [cell.strip() for cell in rows[0]], rows[1:]
    column = heading.index("value")
    for unit, entry in picks.items():
        group = groups[unit.rsplit("-eps", 1)[0]]
        listed = [dict(c) for c in group["candidates"]]
        for candidate in entry["candidates"]:
            released = any(candidate["flags"] == dict(r) for r in group["released"])
            assert candidate["origin"] == ("released" if released else "extrapolated"), unit
            assert candidate["added"] == (candidate["flags"] not in listed), unit
            assert not (candidate["added"] and released), unit
    shown = [row[column].strip() for row in rows]
    expected = [
        c["origin"] + (", added" if c["added"] else "")
        for entry in picks.values()
        for c in entry["candidates"]
    ]
    assert sorted(shown) == sorted(expected) and len(shown) == len(expected) > 0
