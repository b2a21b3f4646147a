"""Paired comparisons over seeds: how far variant A's robust accuracy is from B's, with a 95 %
interval, and a computed verdict.

    found = compare({0: 0.731, 1: 0.742, 2: 0.725}, {0: 0.720, 1: 0.733, 2: 0.719})
    found["mean"], found["interval"], found["verdict"]      # points, (low, high), "a"

Runs of one seed share their initial weights, data order and evaluation points whatever the
method (DESIGN.md §2.4), so a seed's effect is common to the variants and the paired differences
d_s = A_s − B_s (percentage points, over the seeds both have) carry less noise than two separate
means. With n seeds, mean d̄ and sample std s_d, the 95 % interval is d̄ ± t(0.975, n − 1)·s_d/√n,
and the verdict is:

- "a" (A ahead) when the 95 % interval lies above 0, "b" (B ahead) when it lies below;
- else "equivalent" when A and B are shown within ±margin points of each other by two one-sided
  tests at the 5 % level each (the 90 % interval d̄ ± t(0.95, n − 1)·s_d/√n inside
  (−margin, margin));
- else "undecided": the seeds cannot tell, which is a finding too.

One seed decides nothing. An accuracy on N test points moves in steps of 100/N points, so s_d
is taken as at least that step (`resolution`): differences that agree to the step (two equal
differences of two seeds, say) are not known more finely than it, and do not make a
zero-width interval.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping
from typing import Any

MARGIN = 1.0  # points: the default equivalence margin
MIN_SEEDS = 2
VERDICTS = ("a", "b", "equivalent", "undecided")


def _t_density(x: float, df: int) -> float:
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))


def _t_cdf(x: float, df: int, intervals: int = 4000) -> float:
    """P(T ≤ x) for x ≥ 0, by Simpson's rule on the density over [0, x]."""
    h = x / intervals
    total = _t_density(0.0, df) + _t_density(x, df)
    for i in range(1, intervals):
        total += (4 if i % 2 else 2) * _t_density(i * h, df)
    return 0.5 + total * h / 3


@functools.cache
def t_quantile(probability: float, df: int) -> float:
    """The `probability` quantile (> 0.5) of Student's t with `df` degrees of freedom."""
    if not 0.5 < probability < 1 or df < 1:
        raise ValueError(f"need 0.5 < probability < 1 and df >= 1, got {probability}, {df}")
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < probability:
        low, high = high, 2 * high
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if _t_cdf(middle, df) < probability else (low, middle)
    return (low + high) / 2


def compare(
    a: Mapping[int, float],
    b: Mapping[int, float],
    margin: float = MARGIN,
    resolution: float = 0.0,
) -> dict[str, Any]:
    """A against B over the seeds both have (accuracies as fractions, keyed by seed): the
    differences in points, their mean, 95 % and 90 % intervals and the verdict. `resolution`:
    the step of the accuracies in points (100 / test points), the least s_d is taken to be."""
    seeds = sorted(set(a) & set(b))
    differences = [100.0 * (a[s] - b[s]) for s in seeds]
    found: dict[str, Any] = {
        "seeds": seeds,
        "differences": differences,
        "margin": margin,
        "mean": statistics.fmean(differences) if differences else None,
        "interval": None,
        "interval90": None,
        "verdict": "undecided",
    }
    n = len(differences)
    if n < MIN_SEEDS:
        return found
    error = max(statistics.stdev(differences), resolution) / math.sqrt(n)
    mean = found["mean"]
    wide, narrow = t_quantile(0.975, n - 1) * error, t_quantile(0.95, n - 1) * error
    found["interval"] = (mean - wide, mean + wide)
    found["interval90"] = (mean - narrow, mean + narrow)
    if mean - wide > 0:
        found["verdict"] = "a"
    elif mean + wide < 0:
        found["verdict"] = "b"
    elif -margin < mean - narrow and mean + narrow < margin:
        found["verdict"] = "equivalent"
    return found


def describe(found: Mapping[str, Any], a: str, b: str) -> str:
    """The verdict in words: "A ahead", "B ahead", "equivalent within ±1 point", "undecided"."""
    verdict = found["verdict"]
    if verdict == "a":
        return f"{a} ahead"
    if verdict == "b":
        return f"{b} ahead"
    if verdict == "equivalent":
        return f"equivalent within ±{found['margin']:g} point{'s' if found['margin'] != 1 else ''}"
    return "undecided"


def signed_points(value: float) -> str:
    """A difference in points with its sign, one decimal: "+1.2", "-0.4", and "+0.0" for a
    difference that rounds to zero from either side (never "-0.0")."""
    text = f"{value:+.1f}"
    return "+0.0" if text == "-0.0" else text
