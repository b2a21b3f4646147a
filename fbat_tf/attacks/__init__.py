"""Adversarial attacks and their losses: `attack(model, x, y, seed) -> (x_adv, breakdown)`
(DESIGN.md §4, attacks/base.py).

    from fbat_tf import attacks
    attack = attacks.create("pgd", eps=8 / 255, steps=50, restarts=10)
    x_adv, _ = attack(model, x, y, seed=0)
    attack = attacks.create("autoattack", eps=8 / 255, version="standard")
    x_adv, breakdown = attack(model, x, y, seed=0)    # breakdown["robust"]["apgd-ce"], ...

The names are `catalog.ATTACKS`; APGD-T, FAB-T and Square are AutoAttack standard's own
configurations of them.
"""

from __future__ import annotations

from typing import Any

from fbat_tf import catalog
from fbat_tf.attacks.apgd import APGD
from fbat_tf.attacks.autoattack import AutoAttack, standard_attacks
from fbat_tf.attacks.base import Attack, Breakdown
from fbat_tf.attacks.pgd import PGD


def create(name: str, eps: float, **options: Any) -> Attack:
    """The attack `name` at budget ε (pixel units) with its constructor's options."""
    if name == "pgd":
        return PGD(eps, **options)
    if name == "apgd-ce":
        return APGD(eps, loss="ce", **options)
    if name == "autoattack":
        return AutoAttack(eps, **options)
    if name in catalog.ATTACKS:
        if options:
            raise ValueError(f"{name} runs AutoAttack standard's configuration; got {options}")
        return standard_attacks(eps)[name]
    raise ValueError(f"unknown attack {name!r}; choose one of {catalog.ATTACKS}")


__all__ = ["Attack", "Breakdown", "create"]
