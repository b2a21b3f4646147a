"""Transfer attacks: adversarial examples crafted on a source model, then fed to the model under
evaluation (a black-box check of gradient masking).

    attack = transfer_pgd(8 / 255, steps=50, restarts=10, source=other_model)
    x_adv, _ = attack(model, x, y, seed=0)     # crafted on other_model, whatever `model` is
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from fbat_tf import catalog
from fbat_tf.attacks.base import Attack, Breakdown
from fbat_tf.attacks.pgd import PGD


class TransferAttack(Attack):
    """Adversarial examples crafted on a source model, whatever model they are then fed to."""

    def __init__(self, source: Callable, attack: Attack):
        self.source = source
        self.attack = attack
        self.eps = attack.eps

    def __call__(self, model, x: tf.Tensor, y: tf.Tensor, seed) -> tuple[tf.Tensor, Breakdown]:
        return self.attack(self.source, x, y, seed)


def transfer_pgd(
    eps: float,
    steps: int = catalog.PGD_STEPS,
    restarts: int = catalog.PGD_RESTARTS,
    *,
    source: Callable,
) -> TransferAttack:
    """PGD-K-R crafted on `source` (the registry's "transfer")."""
    return TransferAttack(source, PGD(eps, steps, restarts))
