"""The paired verdicts a report states, on synthetic records, against a hand calculation with
Student's t from a printed table (t(0.975, 4) = 2.7764, t(0.95, 4) = 2.1318)."""

from __future__ import annotations

import math

import pytest

from fbat_tf.sweeps import paired

T975_4, T95_4 = 2.776445, 2.131847


def records(base: dict[int, float], differences_in_points: list[float]):
    """B's accuracies, and A's = B's + the differences (points), by seed."""
    b = dict(base)
    a = {seed: b[seed] + d / 100 for seed, d in zip(sorted(b), differences_in_points, strict=True)}
    return a, b


BASE = {0: 0.50, 1: 0.47, 2: 0.55, 3: 0.49, 4: 0.52}  # seed effects, shared by A and B


def test_t_quantiles_match_the_printed_table():
    assert paired.t_quantile(0.975, 4) == pytest.approx(T975_4, abs=1e-5)
    assert paired.t_quantile(0.95, 4) == pytest.approx(T95_4, abs=1e-5)
    assert paired.t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-3)
    assert paired.t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-4)


def test_a_ahead_when_the_95_interval_excludes_zero():
    a, b = records(BASE, [2.0, 2.5, 1.5, 2.0, 2.0])
    found = paired.compare(a, b)
    # By hand: mean 2.0, s_d = sqrt(0.5 / 4), half-width t(0.975, 4)·s_d/√5.
    half = T975_4 * math.sqrt(0.5 / 4) / math.sqrt(5)
    assert found["mean"] == pytest.approx(2.0)
    assert found["interval"] == pytest.approx((2.0 - half, 2.0 + half), abs=1e-4)
    assert found["verdict"] == "a" and paired.describe(found, "N-FGSM", "Fast-AT") == (
        "N-FGSM ahead"
    )
    # The same the other way round.
    assert paired.compare(b, a)["verdict"] == "b"


def test_equivalent_when_the_90_interval_lies_within_the_margin():
    a, b = records(BASE, [0.2, -0.1, 0.1, 0.0, -0.2])
    found = paired.compare(a, b)
    s_d = math.sqrt((0.04 + 0.01 + 0.01 + 0.0 + 0.04) / 4)
    half90 = T95_4 * s_d / math.sqrt(5)
    assert found["mean"] == pytest.approx(0.0, abs=1e-9)
    assert found["interval90"] == pytest.approx((-half90, half90), abs=1e-4)
    assert found["interval"][0] < 0 < found["interval"][1]  # no side is ahead
    assert found["verdict"] == "equivalent"
    assert paired.describe(found, "A", "B") == "equivalent within ±1 point"
    # A margin narrower than the 90 % interval leaves it undecided.
    assert paired.compare(a, b, margin=0.1)["verdict"] == "undecided"


def test_not_ahead_when_only_the_90_interval_excludes_zero():
    a, b = records(BASE, [1.0, 2.2, -0.2, 1.6, 0.4])
    found = paired.compare(a, b)
    # By hand: mean 1.0, s_d = sqrt(3.6 / 4), standard error s_d/√5.
    error = math.sqrt(3.6 / 4) / math.sqrt(5)
    assert found["interval"] == pytest.approx((1.0 - T975_4 * error, 1.0 + T975_4 * error))
    assert found["interval"][0] < 0 < found["interval90"][0]  # -0.18 and +0.10
    assert found["interval90"][1] > 1  # 1.90: not within the margin either
    assert found["verdict"] == "undecided"


def test_undecided_when_the_seeds_cannot_tell():
    a, b = records(BASE, [3.0, -2.0, 1.0, -3.0, 1.0])
    found = paired.compare(a, b)
    half90 = T95_4 * math.sqrt(24 / 4) / math.sqrt(5)  # 2.33 > 1: not within the margin
    assert found["interval90"][1] == pytest.approx(half90, abs=1e-4)
    assert found["verdict"] == "undecided"


def test_pairing_uses_only_the_seeds_both_have_and_one_seed_decides_nothing():
    a, b = records(BASE, [2.0, 2.5, 1.5, 2.0, 2.0])
    del a[4], b[0]
    found = paired.compare(a, b)
    assert found["seeds"] == [1, 2, 3]
    assert found["differences"] == pytest.approx([2.5, 1.5, 2.0])
    single = paired.compare({0: 0.6}, {0: 0.5})
    assert single["verdict"] == "undecided" and single["interval"] is None
    assert single["mean"] == pytest.approx(10.0)


def test_pairing_is_sharper_than_comparing_means():
    """Seed effects of several points, shared by A and B, do not hide a 1-point difference
    that the paired test finds."""
    base = {0: 0.40, 1: 0.46, 2: 0.43, 3: 0.49, 4: 0.45}
    a, b = records(base, [1.0, 1.2, 0.8, 1.1, 0.9])
    assert paired.compare(a, b)["verdict"] == "a"
    spread = math.sqrt(sum((v - sum(base.values()) / 5) ** 2 for v in base.values()) / 4)
    assert 100 * spread > 3  # an unpaired comparison would see 1 point inside 3 points of noise


def test_the_accuracy_step_bounds_the_spread_of_the_differences():
    """Two equal differences of one step of a 500-point accuracy (0.2 points) would give a
    zero-width interval: s_d is taken as that step, 0.2 ± t(0.975, 1)·0.2/√2, undecided. With
    five such seeds: 0.2 ± t(0.975, 4)·0.2/√5 = [-0.05, +0.45], equivalent, not ahead."""
    a, b = records({0: 0.5, 1: 0.4}, [0.2, 0.2])
    found = paired.compare(a, b, resolution=0.2)
    half = 12.706205 * 0.2 / math.sqrt(2)
    assert found["interval"] == pytest.approx((0.2 - half, 0.2 + half), abs=1e-3)
    assert found["verdict"] == "undecided"
    a, b = records(BASE, [0.2] * 5)
    found = paired.compare(a, b, resolution=0.2)
    half = T975_4 * 0.2 / math.sqrt(5)
    assert found["interval"] == pytest.approx((0.2 - half, 0.2 + half), abs=1e-4)
    assert found["verdict"] == "equivalent"
    assert paired.compare(a, b)["verdict"] == "a"  # without the bound: a spurious lead


def test_a_difference_that_rounds_to_zero_is_written_without_a_minus():
    from fbat_tf.sweeps.paired import signed_points

    assert [signed_points(v) for v in (-0.04, 0.04, 0.0, -0.05, 1.25, -2.0)] == [
        "+0.0",
        "+0.0",
        "+0.0",
        "-0.1",
        "+1.2",
        "-2.0",
    ]
