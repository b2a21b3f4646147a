"""The units of a perturbation budget ε, per threat model, converted here and nowhere else.

    to_pixels(8, "linf")        # 0.0313...: the command line's L∞ ε is in 1/255 units
    to_pixels(0.5, "l2")        # 0.5: an L2 ε is in [0, 1]-pixel units already
    in_flag_units(8 / 255, "linf")      # 8.0, as results name it
    shown(8 / 255, "linf"), shown(0.5, "l2")    # "8/255", "0.5 (L2)"
    key("pgd", 8.0, "linf"), key("pgd", 0.5, "l2")   # "pgd@8", "pgd@l2:0.5"
    split_key("pgd@l2:0.5")     # ("pgd", 0.5, "l2")

Library APIs take ε in pixel units ([0, 1] images) under both norms. On the command line and in
results, an L∞ ε is in 1/255 units (8 means 8/255, as papers quote it) and an L2 ε in pixel
units over the whole image (0.5 is RobustBench's CIFAR-10 budget, as papers quote it).
"""

from __future__ import annotations

from fbat_tf.catalog import check_norm as _check

# What one unit of the command line's ε is, per norm, in pixel units.
_UNIT = {"linf": 1.0 / 255, "l2": 1.0}
# How RobustBench (its model_info/<dataset>/<Linf|L2> folders), the reference AutoAttack's
# `norm=` and model cards name each norm.
REFERENCE_NAMES = {"linf": "Linf", "l2": "L2"}
# How results and help texts name the units.
UNIT_NAMES = {"linf": "1/255", "l2": "[0, 1] pixels, L2 norm over the image"}


def from_per_255(value: float) -> float:
    """A value the command line gives in 1/255 units (an L∞ ε, Fast-BAT's 1/λ) in pixel units."""
    return value / 255  # divided, not times 1/255: the same float as a flag has always given


def to_pixels(value: float, norm: str = "linf") -> float:
    """ε as the command line gives it (1/255 units for L∞, pixel units for L2), in pixel units."""
    return from_per_255(value) if _check(norm) == "linf" else float(value)


def in_flag_units(eps: float, norm: str = "linf") -> float:
    """ε in pixel units as results and the command line name it: 8/255 -> 8.0 (L∞), 0.5 ->
    0.5 (L2); rounded to 6 significant digits, so that 8/255 comes back as 8."""
    return float(f"{eps / _UNIT[_check(norm)]:g}")


def shown(eps: float, norm: str = "linf") -> str:
    """ε in pixel units as a person reads it: "8/255" (L∞), "0.5 (L2)"."""
    if _check(norm) == "l2":
        return f"{in_flag_units(eps, norm):g} (L2)"
    return f"{in_flag_units(eps, norm):g}/255"


def unit_name(norm: str) -> str:
    """How results and help texts name a norm's units ("1/255")."""
    return UNIT_NAMES[_check(norm)]


def heading(norms: set[str] | frozenset[str]) -> str:
    """A table's ε column heading for budgets of these norms: "ε (/255)" (L∞ only, or none),
    "ε (L2, pixels)" (L2 only), else "ε"."""
    if set(norms) <= {"linf"}:
        return "ε (/255)"
    return "ε (L2, pixels)" if set(norms) == {"l2"} else "ε"


def key(attack: str, eps: float, norm: str = "linf") -> str:
    """The name of an attack's result at ε (in flag units): "pgd@8" (L∞), "pgd@l2:0.5"."""
    return f"{attack}@{eps:g}" if _check(norm) == "linf" else f"{attack}@{norm}:{eps:g}"


def split_key(name: str) -> tuple[str, float, str]:
    """(attack, ε in flag units, norm) of a result's name made by `key`."""
    attack, _, budget = name.rpartition("@")
    norm, _, eps = budget.rpartition(":")
    return attack, float(eps), _check(norm or "linf")
