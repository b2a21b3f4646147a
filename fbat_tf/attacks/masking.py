"""Signs of gradient masking in an ensemble's parts, without TensorFlow (a sweep reads them from
evaluation files).

    masking_gap({"clean": 0.8, "apgd-ce": 0.3, "apgd-t": 0.25, "fab-t": 0.25, "square": 0.24})
    # 0.01: Square, the black-box part run last, broke 1 % of the examples the white-box
    # parts before it had left robust
    gap_points(parts, examples=1000)          # Fraction(1): the same in points, exactly

A model whose gradients mislead the gradient-based parts (APGD, FAB) keeps examples that a
search reading only its outputs (Square) still breaks: above 0, the gap is that sign.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

BLACK_BOX = "square"
# The ensembles whose parts end with the black-box one after white-box ones: AutoAttack
# standard (its "rand" version runs no Square).
_ENDS_BLACK_BOX = {("autoattack", "standard")}


def ends_with_black_box(attack: str, options: Mapping[str, object]) -> bool:
    """Whether the registry's `attack` with `options` is an ensemble whose last part is the
    black-box one, run after white-box parts: one whose records show the masking gap."""
    return (attack, options.get("version", "standard")) in _ENDS_BLACK_BOX


def _before_square(robust_after: Mapping[str, float]) -> str | None:
    """The part run just before Square, where Square ran last after at least one other part
    (the ensemble's order is the mapping's, "clean" aside); else None."""
    parts = [name for name in robust_after if name != "clean"]
    if len(parts) < 2 or parts[-1] != BLACK_BOX:
        return None
    return parts[-2]


def masking_gap(robust_after: Mapping[str, float]) -> float | None:
    """How many more examples (a fraction of all) Square, the black-box part, broke than the
    white-box parts had left robust: above 0, a sign of gradient masking. None unless Square
    ran last, after another part (where it ran earlier, the parts after it might have broken
    what it broke). `robust_after`: the robust accuracy after each part, in the ensemble's
    order ("clean" first, as an evaluation records them)."""
    before = _before_square(robust_after)
    if before is None:
        return None
    return robust_after[before] - robust_after[BLACK_BOX]


def gap_points(robust_after: Mapping[str, float], examples: int) -> Fraction | None:
    """`masking_gap` in percentage points, exactly: 100 · (k_before − k_square) / examples with
    k the counts of robust examples behind the accuracies, so that a rule "more than 1.0
    point" reads 25.0 % − 24.0 % as 1.0, not as the 1.0000000000000009 that 100 · (0.25 −
    0.24) is in floating point. Accuracies that are no count of `examples` (a mean of other
    evaluations) are taken to 1e-9 of a point. None where `masking_gap` is."""
    before = _before_square(robust_after)
    if before is None:
        return None
    counts = [robust_after[name] * examples for name in (before, BLACK_BOX)]
    if examples > 0 and all(abs(count - round(count)) < 1e-6 for count in counts):
        return Fraction(100 * (round(counts[0]) - round(counts[1])), examples)
    gap = 100 * (robust_after[before] - robust_after[BLACK_BOX])
    return Fraction(f"{gap:.9f}")


def exceeds(gap: Fraction | None, threshold: float) -> bool:
    """Whether a gap in points is strictly above `threshold` points (a number as written: 1.2
    means 12/10), exactly; no gap never is."""
    return gap is not None and gap > Fraction(repr(float(threshold)))


def combined_outcomes(first: str, second: str) -> str:
    """Two attacks' per-point outcomes ('1': still classified correctly) on the same points in
    the same order, combined: a point is robust only where it survived both."""
    if len(first) != len(second):
        raise ValueError(f"outcomes of {len(first)} and {len(second)} points cannot be combined")
    if set(first + second) - {"0", "1"}:
        raise ValueError("outcomes are strings of '0' and '1'")
    return "".join("1" if a == b == "1" else "0" for a, b in zip(first, second, strict=True))
