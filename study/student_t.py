"""Student's t distribution for real degrees of freedom, without SciPy: its tail from the
regularized incomplete beta function (by its continued fraction), and its quantiles by
bisection. Satterthwaite's degrees of freedom (study/paired.py) are seldom whole."""

from __future__ import annotations

import functools
import math


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300

    def nonzero(value: float) -> float:
        return value if abs(value) > tiny else tiny

    c, d = 1.0, 1.0 / nonzero(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, 10_000):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d, c = 1.0 / nonzero(1.0 + even * d), nonzero(1.0 + even / c)
        h *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d, c = 1.0 / nonzero(1.0 + odd * d), nonzero(1.0 + odd / c)
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"need df > 0, got {df}")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    upper = 0.5 * incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return upper if t >= 0 else 1.0 - upper


@functools.cache
def t_quantile(probability: float, df: float) -> float:
    """The `probability` quantile (> 0.5) of Student's t with `df` degrees of freedom."""
    if not 0.5 < probability < 1 or df <= 0:
        raise ValueError(f"need 0.5 < probability < 1 and df > 0, got {probability}, {df}")
    tail = 1.0 - probability
    low, high = 0.0, 1.0
    while t_tail(high, df) > tail:
        low, high = high, 2 * high
    while high - low > 1e-13 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if t_tail(middle, df) > tail else (low, middle)
    return (low + high) / 2
