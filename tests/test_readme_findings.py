"""README's findings quote the committed reports' paired verdicts: every quoted difference, its
95 % interval and its verdict is the one the report computed (results/<sweep>/sweep.json), so
that no finding is written by hand."""

from __future__ import annotations

import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBER = r"([+-]\d+\.\d)"
# `A` − `B`, ε = 64: +0.2 [-1.6, +2.0], undecided   (names may be left out after the first
# quote of a pair: "and at ε = 76: ...")
QUOTE = re.compile(
    r"(?:`([^`]+)` − `([^`]+)`, )?(?:at )?ε = (\d+): "
    + NUMBER
    + r" \["
    + NUMBER
    + ", "
    + NUMBER
    + r"\], (.+?)(?=[;.]\s|[;.]$|\s\(|\)|,\s|$)"
)


def sections() -> dict[str, str]:
    """README's sections by heading, each with its text on one line."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    parts = re.split(r"^#+ (.+)$", text, flags=re.M)
    return {
        heading: " ".join(body.split())
        for heading, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def verdicts(sweep: str) -> dict[tuple[str, str, float], dict]:
    """Every paired comparison the report states: its listed ones and each variant against the
    most robust at its ε."""
    with open(os.path.join(ROOT, "results", sweep, "sweep.json")) as f:
        report = json.load(f)
    found = {(c["a"], c["b"], c["eps"]): c for c in report["paired_comparisons"]}
    for rows in report["robust_vs_cost"].values():
        for row in rows:
            if row["versus_best"]:
                pair = row["versus_best"]
                found[pair["a"], pair["b"], pair["eps"]] = pair
    return found


def quotes(text: str):
    """(report, a, b, ε, mean, low, high, verdict) of each quote, names carried to unnamed ones.
    A quote belongs to the report the section links last before it (its first link if none
    comes before)."""
    links = [(m.start(), m.group(1)) for m in re.finditer(r"results/(\w+)/sweep\.md", text)]
    a = b = None
    for match in QUOTE.finditer(text):
        if match.group(1):
            a, b = match.group(1), match.group(2)
        before = [name for start, name in links if start < match.start()]
        report = before[-1] if before else links[0][1] if links else None
        yield report, a, b, float(match.group(3)), *match.group(4, 5, 6), match.group(7).strip()


def test_every_quoted_paired_verdict_is_the_reports():
    checked = 0
    for heading, text in sections().items():
        for sweep, a, b, eps, mean, low, high, says in quotes(text):
            assert sweep, f"README section {heading!r} quotes verdicts without naming its report"
            assert a is not None, (heading, eps)
            report = verdicts(sweep)
            if (a, b, eps) in report:
                pair = report[a, b, eps]
                expected = (pair["mean"], *pair["interval"])
            else:  # quoted the other way round
                pair = report[b, a, eps]
                expected = (-pair["mean"], -pair["interval"][1], -pair["interval"][0])
            # One decimal with its sign; a zero is "+0.0" from either side.
            shown = tuple(f"{value:+.1f}".replace("-0.0", "+0.0") for value in expected)
            assert (mean, low, high) == shown, (heading, a, b, eps)
            assert says == pair["says"], (heading, a, b, eps)
            checked += 1
    assert checked >= 7  # the findings of fashion_mnist (2) and fashion_mnist_ig (5)


def test_the_implicit_term_comparisons_are_as_the_readme_counts_them():
    """'Of the fourteen comparisons one is shown equivalent ... and none finds a side ahead.'"""
    with open(os.path.join(ROOT, "results", "fashion_mnist_ig", "sweep.json")) as f:
        listed = json.load(f)["paired_comparisons"]
    assert len(listed) == 14
    assert [c["verdict"] for c in listed].count("equivalent") == 1
    assert not [c for c in listed if c["verdict"] in ("a", "b")]
    text = sections()["Where Fast-BAT's implicit term pays (Fashion-MNIST)"]
    assert "Of the fourteen comparisons one is shown equivalent" in text
