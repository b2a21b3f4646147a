"""Adversarial attacks and their losses: `attack(model, x, y) -> x_adv` (DESIGN.md §4).

    from fbat_tf import attacks
    attack = attacks.create("pgd", eps=8 / 255, steps=50, restarts=10, seed=0)
    attack = attacks.create("autoattack", eps=8 / 255, version="standard")

The names are `catalog.ATTACKS`; APGD-T, FAB-T and Square are AutoAttack standard's own
configurations of them.
"""

from __future__ import annotations

from typing import Any

from fbat_tf import catalog
from fbat_tf.attacks.apgd import APGD
from fbat_tf.attacks.autoattack import Attack, AutoAttack, standard_attacks
from fbat_tf.attacks.pgd import PGD


def create(name: str, eps: float, seed: int = 0, **options: Any) -> Attack:
    """The attack `name` at budget ε (pixel units) with its constructor's options."""
    if name == "pgd":
        return PGD(eps, seed=seed, **options)
    if name == "apgd-ce":
        return APGD(eps, loss="ce", seed=seed, **options)
    if name == "autoattack":
        return AutoAttack(eps, seed=seed, **options)
    if name in catalog.ATTACKS:
        if options:
            raise ValueError(f"{name} runs AutoAttack standard's configuration; got {options}")
        return standard_attacks(eps, seed)[name]
    raise ValueError(f"unknown attack {name!r}; choose one of {catalog.ATTACKS}")


__all__ = ["Attack", "create"]
