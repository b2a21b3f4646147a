"""Transfer attacks: adversarial examples crafted on a source model, then fed to the model under
evaluation (a black-box check of gradient masking).

    attack = transfer_pgd(8 / 255, steps=50, restarts=10, source=other_model)
    x_adv, _ = attack(model, x, y, seed=0)     # crafted on other_model, whatever `model` is
    replay = ReplayedAttack(source, PGD(8 / 255, 50, 10))   # the source's own examples, replayed
    x_adv, _ = replay(artifact, x, y, seed=0)  # and replay.agreement[-1]: same class on each?
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
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
        self.norm = getattr(attack, "norm", "linf")

    def __call__(self, model, x: tf.Tensor, y: tf.Tensor, seed) -> tuple[tf.Tensor, Breakdown]:
        return self.attack(self.source, x, y, seed)


class ReplayedAttack(TransferAttack):
    """The source model's own adversarial examples, replayed on a model that should compute the
    same function (an exported ONNX or LiteRT file of it). Each call also records, per example,
    whether the two models give the adversarial point the same class (`agreement`, one bool
    array a call, in call order) and whether the source classifies it correctly (`source_right`).
    An ensemble's breakdown is the source's and is not passed on."""

    def __init__(self, source: Callable, attack: Attack):
        super().__init__(source, attack)
        self.agreement: list[np.ndarray] = []
        self.source_right: list[np.ndarray] = []

    def __call__(self, model, x: tf.Tensor, y: tf.Tensor, seed) -> tuple[tf.Tensor, Breakdown]:
        x_adv, _ = self.attack(self.source, x, y, seed)
        source = np.argmax(np.asarray(self.source(x_adv, training=False)), -1)
        target = np.argmax(np.asarray(model(x_adv, training=False)), -1)
        self.agreement.append(source == target)
        self.source_right.append(source == np.asarray(y))
        return x_adv, {}


def transfer_pgd(
    eps: float,
    steps: int = catalog.PGD_STEPS,
    restarts: int = catalog.PGD_RESTARTS,
    *,
    source: Callable,
    norm: str = "linf",
) -> TransferAttack:
    """PGD-K-R crafted on `source` (the registry's "transfer"), in the L∞ or L2 ball."""
    return TransferAttack(source, PGD(eps, steps, restarts, norm=norm))
