"""Paired comparisons over seeds (and, where the evaluations recorded them, over test images):
how far variant A's robust accuracy is from B's, with a 95 % interval, p-values and a computed
verdict, and Holm's correction over a family of such comparisons (DESIGN.md §5.5).

    found = compare({0: 0.731, 1: 0.742, 2: 0.725}, {0: 0.720, 1: 0.733, 2: 0.719})
    found.mean, found.interval, found.p, found.verdict   # points, (low, high), ., "a"

Runs of one seed share their initial weights, data order and evaluation points whatever the
method (DESIGN.md §2.4), so a seed's effect is common to the variants and the paired differences
(percentage points) carry less noise than two separate means. The mean difference d̄ has a
standard error se with df degrees of freedom from one of two models:

- Seeds only (the accuracies alone): d_s = A_s − B_s over the n seeds both have, with sample
  std s_d; se = s_d/√n, df = n − 1. The test images are held fixed: the interval speaks of these
  images, not of the distribution they were drawn from.
- Seeds × images (`crossed`, where every cell's evaluation recorded which test points it got
  right, the same points for all): the S×I matrix d[s, i] = 100·(a[s, i] − b[s, i]) under the
  two-way crossed random-effects model d_si = μ + seed_s + image_i + e_si, with variances σ_s²,
  σ_i², σ_e². Then Var(d̄) = σ_s²/S + σ_i²/I + σ_e²/(S·I); from the ANOVA mean squares
  (E MS_seed = σ_e² + I·σ_s², E MS_image = σ_e² + S·σ_i², E MS_resid = σ_e²) its unbiased
  estimate is (MS_seed + MS_image − MS_resid)/(S·I), with Satterthwaite's degrees of freedom.
  That estimate can fall below what the data allow (a negative variance component); each
  component is taken as at least 0, i.e. a mean square smaller than MS_resid is replaced by
  MS_resid in the sum. The se is then never below MS_resid/(S·I), nor below the seeds-only se
  of the same matrix (MS_seed/(S·I), before the step floor below). The interval can still be
  narrower than the seeds-only one: its degrees of freedom are Satterthwaite's, not S − 1, and
  where a component is clipped its stand-in MS_resid brings the residual's (S − 1)(I − 1)
  (both clipped: the se is MS_resid's alone, with all of them). Such an interval rests on the
  clipping, so the seeds-only analysis of the same comparison is kept beside it (`seeds_only`)
  and a verdict stands only where both show it (below).
  It needs at least CROSSED_MIN_SEEDS = 3 seeds: with two, MS_seed has one degree of freedom,
  and where it falls below MS_resid the replacement gives the seed term the residual's many
  degrees of freedom, so that the 95 % interval held the true difference in 87-93 % of
  simulated draws with a seed effect (bench/records/interval_coverage.py; 93-98 % from three
  seeds on). Two seeds are compared over seeds only, with their outcomes left aside.

In both, an accuracy on N test points moves in steps of 100/N points (`resolution`), and the
standard error is taken as at least step/√n: differences that agree to the step (two equal
differences of two seeds, or two variants that get the same points right) are not known more
finely than it, and do not make a zero-width interval. Where this floor binds, df = n − 1.

With t = d̄/se: the 95 % interval is d̄ ± t(0.975, df)·se; p, the two-sided p-value of d̄ ≠ 0;
p_equivalence, the p-value of two one-sided tests of |δ| < margin (the larger of the two
one-sided p-values; below 5 % exactly when the 90 % interval d̄ ± t(0.95, df)·se lies inside
(−margin, margin)). The verdict from p-values at α = 5 %:

- "a" (A ahead) or "b" (B ahead) where p < α, by the sign of d̄ (the 95 % interval excludes 0);
- else "equivalent" where p_equivalence < α: A and B within ±margin points;
- else "undecided": the seeds cannot tell, which is a finding too.

Where the model is the crossed one, the verdict is that of both analyses by the
intersection-union rule (`verdict_of`): a side ahead only where the crossed and the seeds-only
analyses both put it ahead, else equivalent only where both show equivalence, else undecided,
i.e. the rule above on the larger of each pair of p-values. Each claim is then tested at 5 %
under either model, whichever holds, and no verdict rests on a clipped variance component.

One seed decides nothing (no interval, no p-value). `correct` applies Holm's step-down
correction to a family of comparisons: the p-values of "A ≠ B" and those of equivalence are
adjusted separately within the family, the seeds-only analyses' apart again (the same
hypotheses, a comparison over seeds only standing as itself), and the verdict is taken again
from the adjusted ones; the uncorrected verdict is kept beside it (`raw_verdict`), and a
crossed comparison's verdict from its own p-values alone as `crossed_verdict`. The intervals
stay uncorrected.

The t distribution is computed in study/student_t.py (regularized incomplete beta function by
its continued fraction), for real degrees of freedom: no SciPy.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from study.student_t import t_quantile, t_tail

MARGIN = 1.0  # points: the default equivalence margin
ALPHA = 0.05  # the level of every test, and of each one-sided test of equivalence
MIN_SEEDS = 2
CROSSED_MIN_SEEDS = 3  # the seeds × images model from this many seeds (above)
VERDICTS = ("a", "b", "equivalent", "undecided")
SEEDS_ONLY, CROSSED = "seeds only", "seeds × images"

Interval = tuple[float, float]


@dataclasses.dataclass
class Analysis:
    """A comparison's analysis over seeds alone, kept beside its crossed one (`seeds_only`):
    what `compare` found over the per-seed differences, and what Holm's correction adds."""

    mean: float | None
    se: float | None
    df: float | None
    interval: Interval | None
    interval90: Interval | None
    p: float | None
    p_equivalence: float | None
    verdict: str
    raw_verdict: str
    p_holm: float | None = None
    p_equivalence_holm: float | None = None

    def to_dict(self, corrected: bool) -> dict[str, Any]:
        """As sweep.json holds it: the adjusted p-values once a correction set them."""
        found = dataclasses.asdict(self)
        if not corrected:
            del found["p_holm"], found["p_equivalence_holm"]
        return found


@dataclasses.dataclass
class Comparison:
    """A against B over seeds (and images): `compare`'s numbers and verdict; the variants, ε and
    marks `study.comparisons` names it by, its verdicts in words; and what Holm's correction
    sets (`correct`, `settle`)."""

    seeds: list[int]
    differences: list[float]
    margin: float
    model: str = SEEDS_ONLY
    images: int | None = None
    mean: float | None = None
    se: float | None = None
    df: float | None = None
    interval: Interval | None = None
    interval90: Interval | None = None
    p: float | None = None
    p_equivalence: float | None = None
    verdict: str = "undecided"
    raw_verdict: str = "undecided"
    correction: str | None = None
    seeds_only: Analysis | None = None  # where the model is the crossed one: over seeds alone
    mean_squares: dict[str, float] | None = None  # the crossed model's (seed, image, residual)
    eps: float | None = None
    a: str | None = None
    b: str | None = None
    marks: list[str] | None = None
    says: str | None = None  # the verdict in words (describe)
    raw_says: str | None = None
    p_holm: float | None = None
    p_equivalence_holm: float | None = None
    family: int | None = None  # the size of the family it was corrected in
    crossed_verdict: str | None = None  # the crossed model's own, after the correction

    def to_dict(self) -> dict[str, Any]:
        """As sweep.json holds it: each part only once something set it (the crossed model's
        mean squares, the names, the words, the correction)."""
        corrected = self.correction is not None
        found: dict[str, Any] = {name: getattr(self, name) for name in _ALWAYS}
        found["seeds_only"] = self.seeds_only and self.seeds_only.to_dict(corrected)
        parts = {
            ("mean_squares",): self.mean_squares is not None,
            ("eps", "a", "b", "marks"): self.a is not None,
            ("says", "raw_says"): self.says is not None,
            ("p_holm", "p_equivalence_holm", "family"): corrected,
            ("crossed_verdict",): self.crossed_verdict is not None,
        }
        for names, present in parts.items():
            found.update({name: getattr(self, name) for name in names if present})
        return found


# What every comparison in sweep.json holds, in its order, before its seeds-only analysis.
_ALWAYS = (
    *("seeds", "differences", "margin", "model", "images", "mean", "se", "df"),
    *("interval", "interval90", "p", "p_equivalence", "verdict", "raw_verdict", "correction"),
)


class Crossed(NamedTuple):
    """The seeds × images model of a matrix of differences (`crossed`)."""

    mean: float
    seeds: int
    images: int
    mean_squares: dict[str, float]  # seed, image, residual
    se: float
    df: float
    floored: bool  # the step floor set the se


def outcome_matrix(a: Mapping[int, str], b: Mapping[int, str], seeds: Sequence[int]):
    """d[s][i] = 100·(a[s][i] − b[s][i]), points, from per-point outcomes ('1': right)."""
    rows = []
    for seed in seeds:
        x, y = a[seed], b[seed]
        if len(x) != len(y) or not set(x + y) <= {"0", "1"}:
            raise ValueError(f"seed {seed}: outcomes of unequal length or not of 0 and 1")
        rows.append([100.0 * ((p == "1") - (q == "1")) for p, q in zip(x, y, strict=True)])
    if len({len(row) for row in rows}) > 1:
        raise ValueError("the seeds' outcomes cover different numbers of points")
    return rows


def crossed(matrix: Sequence[Sequence[float]], resolution: float = 0.0) -> Crossed:
    """The two-way crossed random-effects model of an S×I matrix of differences (seeds × images,
    points): the grand mean, the ANOVA mean squares, se of the mean and Satterthwaite's df (see
    the module's docstring for the model and the floors)."""
    seeds, images = len(matrix), len(matrix[0])
    if seeds < MIN_SEEDS or images < 2:
        raise ValueError(f"need at least {MIN_SEEDS} seeds and 2 images, got {seeds}×{images}")
    rows = [math.fsum(row) / images for row in matrix]
    columns = [math.fsum(row[i] for row in matrix) / seeds for i in range(images)]
    grand = math.fsum(rows) / seeds
    df_seed, df_image = seeds - 1, images - 1
    df_resid = df_seed * df_image
    ms_seed = images * math.fsum((r - grand) ** 2 for r in rows) / df_seed
    ms_image = seeds * math.fsum((c - grand) ** 2 for c in columns) / df_image
    ms_resid = (
        math.fsum(
            (value - row_mean - column + grand) ** 2
            for row, row_mean in zip(matrix, rows, strict=True)
            for value, column in zip(row, columns, strict=True)
        )
        / df_resid
    )
    # Each variance component at least 0: a mean square below MS_resid stands in as MS_resid,
    # so the sum is max(MS_seed, MS_resid) + max(MS_image, MS_resid) − MS_resid.
    use_seed, use_image = float(ms_seed > ms_resid), float(ms_image > ms_resid)
    terms = [
        (use_seed * ms_seed, df_seed),
        (use_image * ms_image, df_image),
        ((1.0 - use_seed - use_image) * ms_resid, df_resid),
    ]
    total = math.fsum(term for term, _ in terms)
    variance = total / (seeds * images)
    floor = resolution**2 / seeds
    floored = variance < floor
    if floored or total == 0.0:
        variance, df = max(variance, floor), float(df_seed)
    else:
        df = total**2 / math.fsum(term**2 / df for term, df in terms if term)
    squares = {"seed": ms_seed, "image": ms_image, "residual": ms_resid}
    return Crossed(grand, seeds, images, squares, math.sqrt(variance), df, floored)


def _tests(mean: float, se: float, df: float, margin: float) -> tuple[float, float]:
    """The two-sided p-value of d̄ ≠ 0, and that of equivalence within ±margin (two one-sided
    tests: the larger of their p-values)."""
    if se == 0.0:
        return (1.0 if mean == 0 else 0.0), (0.0 if abs(mean) < margin else 1.0)
    p = min(1.0, 2.0 * t_tail(abs(mean) / se, df))
    above_lower = t_tail((mean + margin) / se, df)  # H0: δ ≤ −margin
    below_upper = t_tail((margin - mean) / se, df)  # H0: δ ≥ +margin
    return p, max(above_lower, below_upper)


def decide(mean: float, margin: float, p: float | None, p_equivalence: float | None) -> str:
    """The verdict from the p-values: a side ahead where p < α, else equivalent where the two
    one-sided tests' p < α, else undecided."""
    if p is None or p_equivalence is None:
        return "undecided"
    if p < ALPHA:
        return "a" if mean > 0 else "b"
    if p_equivalence < ALPHA:
        return "equivalent"
    return "undecided"


def compare(
    a: Mapping[int, float],
    b: Mapping[int, float],
    margin: float = MARGIN,
    resolution: float = 0.0,
    outcomes: tuple[Mapping[int, str], Mapping[int, str]] | None = None,
    min_crossed_seeds: int = CROSSED_MIN_SEEDS,
) -> Comparison:
    """A against B over the seeds both have (accuracies as fractions, keyed by seed): the
    differences in points, their mean, its standard error and df, 95 % and 90 % intervals,
    p-values and the verdict. `resolution`: the step of the accuracies in points (100 / test
    points). `outcomes`: A's and B's per-point outcomes by seed (strings of '0' and '1', the same
    points for every seed), which select the seeds × images model from `min_crossed_seeds`
    seeds on; without them, or with fewer seeds, seeds only."""
    seeds = sorted(set(a) & set(b))
    differences = [100.0 * (a[s] - b[s]) for s in seeds]
    found = Comparison(
        seeds, differences, margin, mean=statistics.fmean(differences) if differences else None
    )
    n = len(differences)
    if n < MIN_SEEDS:
        return found
    if outcomes is not None and n >= min_crossed_seeds:
        model = crossed(outcome_matrix(*outcomes, seeds), resolution)
        found.model, found.images = CROSSED, model.images
        found.mean, found.mean_squares = model.mean, model.mean_squares
        se, df = model.se, model.df
    else:
        se, df = max(statistics.stdev(differences), resolution) / math.sqrt(n), float(n - 1)
    mean = found.mean
    wide, narrow = t_quantile(0.975, df) * se, t_quantile(0.95, df) * se
    found.se, found.df = se, df
    found.interval, found.interval90 = (mean - wide, mean + wide), (mean - narrow, mean + narrow)
    found.p, found.p_equivalence = _tests(mean, se, df, margin)
    if found.model == CROSSED:
        # The same comparison over seeds alone: a verdict stands only where both show it.
        alone = compare(a, b, margin, resolution)
        found.seeds_only = Analysis(**{key: getattr(alone, key) for key in SEEDS_ONLY_KEYS})
    found.verdict = found.raw_verdict = verdict_of(found, adjusted=False)
    return found


# What a crossed comparison keeps of its seeds-only analysis (`seeds_only`), beside what Holm's
# correction adds to it (`p_holm`, `p_equivalence_holm`, its own `verdict`).
SEEDS_ONLY_KEYS = (
    *("mean", "se", "df", "interval", "interval90", "p", "p_equivalence"),
    *("verdict", "raw_verdict"),
)


def verdict_of(found: Comparison, adjusted: bool = True) -> str:
    """The verdict of a comparison from its p-values (Holm-adjusted, or as computed): where it
    has a seeds-only analysis beside the crossed one (`seeds_only`), by the intersection-union
    rule: a side ahead only where both analyses show it ahead, else equivalent only where both
    show equivalence, else undecided; that is, `decide` on the larger of each pair of p-values,
    with both means of one sign."""
    names = ("p_holm", "p_equivalence_holm") if adjusted else ("p", "p_equivalence")
    analyses = [found, *([found.seeds_only] if found.seeds_only else [])]
    tests = [(analysis.mean, *(getattr(analysis, name) for name in names)) for analysis in analyses]
    if any(value is None for test in tests for value in test):
        return "undecided"
    p = max(p for _, p, _ in tests)
    if len({mean > 0 for mean, _, _ in tests}) > 1:
        p = 1.0  # the two analyses put different sides ahead: neither is shown
    return decide(found.mean, found.margin, p, max(q for _, _, q in tests))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of a family's p-values (None: not tested, left out of the
    family): sorted ascending, p_(k) becomes max over j ≤ k of min(1, (m − j + 1)·p_(j))."""
    tested = sorted((p, k) for k, p in enumerate(p_values) if p is not None)
    m = len(tested)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for j, (p, k) in enumerate(tested, start=1):
        running = max(running, min(1.0, (m - j + 1) * p))
        adjusted[k] = running
    return adjusted


def correct(family: Sequence[Comparison]) -> int:
    """Holm's correction over `family` (comparisons from `compare`, changed in place): each
    gets `p_holm` and `p_equivalence_holm`, its verdict from them (`verdict_of`; the
    uncorrected one stays in `raw_verdict`), and the family's size m (the comparisons with a
    p-value). The seeds-only analyses are a family of their own, the same m hypotheses (a
    comparison over seeds only stands in it as itself), adjusted apart: each crossed
    comparison's `seeds_only` gets its `p_holm`, `p_equivalence_holm` and `verdict` from them."""
    size = sum(found.p is not None for found in family)
    alone = [found.seeds_only or found for found in family]
    for analyses in (alone, family):  # the comparisons' own last: `verdict_of` reads both
        adjusted = holm([found.p for found in analyses])
        adjusted_equivalence = holm([found.p_equivalence for found in analyses])
        for found, p, p_equivalence in zip(analyses, adjusted, adjusted_equivalence, strict=True):
            found.p_holm, found.p_equivalence_holm = p, p_equivalence
    for found in family:
        found.correction, found.family = "holm", size
        settle(found)
    return size


def settle(found: Comparison) -> None:
    """The verdicts of a comparison from its Holm-adjusted p-values (changed in place): where it
    has a seeds-only analysis, that one's own (`seeds_only["verdict"]`) and the crossed model's
    alone (`crossed_verdict`), then the verdict in force from both (`verdict_of`)."""
    seeds_only = found.seeds_only
    if seeds_only:
        seeds_only.verdict = decide(
            seeds_only.mean, found.margin, seeds_only.p_holm, seeds_only.p_equivalence_holm
        )
        found.crossed_verdict = decide(
            found.mean, found.margin, found.p_holm, found.p_equivalence_holm
        )
    found.verdict = verdict_of(found)


def describe(found: Comparison, a: str, b: str, verdict: str | None = None) -> str:
    """The verdict (default: the one in force) in words: "A ahead", "B ahead", "equivalent
    within ±1 point", "undecided"."""
    verdict = verdict or found.verdict
    if verdict == "a":
        return f"{a} ahead"
    if verdict == "b":
        return f"{b} ahead"
    if verdict == "equivalent":
        return f"equivalent within ±{found.margin:g} point{'s' if found.margin != 1 else ''}"
    return "undecided"


def signed_points(value: float) -> str:
    """A difference in points with its sign, one decimal: "+1.2", "-0.4", and "+0.0" for a
    difference that rounds to zero from either side (never "-0.0")."""
    text = f"{value:+.1f}"
    return "+0.0" if text == "-0.0" else text


def p_words(p: float | None) -> str:
    """A p-value as a table shows it: "0.342", "0.0496" (four decimals under 0.1, so that one
    just under 0.05 does not read as 0.050), "<0.001", "–" where there is none."""
    if p is None:
        return "–"
    if p < 0.001:
        return "<0.001"
    return f"{p:.4f}" if p < 0.1 else f"{p:.3f}"
