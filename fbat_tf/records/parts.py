"""The parts of a record's dict as the cells' records read them: ε as a key, objects keyed
by ε, and the required and optional parts of an object, each refused in one line naming where.

    eps_key(8.0000001)                          # 8.0: ε as results name it (6 digits)
    by_eps({"8": 0.5}, "cell.pgd")              # {8.0: 0.5}
    parts_of(payload, ("a",), "train", ("b",))  # {"a": ..., "b": None where absent}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def eps_key(eps: float) -> float:
    """ε as cells key it: the number its text in results (f"{eps:g}") names."""
    return float(f"{eps:g}")


def by_eps(mapping: Any, where: str) -> dict[float, Any]:
    """An object keyed by ε's text ("8"), keyed by the number."""
    if not isinstance(mapping, dict):
        raise ValueError(f"{where} is {mapping!r}, not an object keyed by ε")
    try:
        found = {eps_key(float(key)): value for key, value in mapping.items()}
    except ValueError:
        raise ValueError(f"{where} has keys {list(mapping)}, not budgets") from None
    if [f"{eps:g}" for eps in found] != list(mapping):
        raise ValueError(f"{where} has keys {list(mapping)}, not budgets as results name them")
    return found


def texts(mapping: Mapping[float, Any]) -> dict[str, Any]:
    """An object keyed by ε, keyed by ε's text as results name it ("8")."""
    return {f"{eps:g}": value for eps, value in mapping.items()}


def parts_of(payload: Any, required: Sequence[str], where: str, optional: Sequence[str] = ()):
    """The object's values of `required` (each present) and `optional` (None where absent);
    ValueError naming `where` for one that is no object, lacks a part or holds another."""
    if not isinstance(payload, dict):
        raise ValueError(f"{where} is {payload!r}, not an object")
    lacking = [key for key in required if key not in payload]
    unknown = [key for key in payload if key not in (*required, *optional)]
    problems = [f"lacks {lacking}"] if lacking else []
    problems += [f"holds {unknown}, which it does not have"] if unknown else []
    if problems:
        raise ValueError(f"{where} {' and '.join(problems)}")
    return {key: payload.get(key) for key in (*required, *optional)}
