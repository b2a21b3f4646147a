"""Transfer attacks: adversarial examples crafted on a source model, then fed to the model under
evaluation (a black-box check of gradient masking).

    attack = transfer_pgd(8 / 255, steps=50, restarts=10, source=other_model)
    x_adv, _ = attack(model, x, y, seed=0)     # crafted on other_model, whatever `model` is
    replay = ReplayedAttack(source, PGD(8 / 255, 50, 10))   # the source's own examples, replayed
    x_adv, _ = replay(artifact, x, y, seed=0)  # and replay.agreement[-1]: same class on each?
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from fbat_tf import catalog
from fbat_tf.attacks.base import Attack, Breakdown
from fbat_tf.attacks.losses import correct, robust_hits
from fbat_tf.attacks.pgd import PGD


class TransferAttack(Attack):
    """Adversarial examples crafted on a source model, whatever model they are then fed to."""

    needs_gradients = False  # the source's gradients, never those of the model attacked

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
    array a call, in call order) and whether the source is robust there (`source_right`: right
    on the clean point and the adversarial one, losses.robust_hits).
    An ensemble's breakdown is the source's and is not passed on.

    `kept`, a dict shared by the replays of one source's attack on several files, holds the
    points crafted on each batch, by the batch's examples, labels and seed: a replay given the
    same ones takes its points from there instead of crafting them again."""

    def __init__(self, source: Callable, attack: Attack, kept: dict | None = None):
        super().__init__(source, attack)
        self.agreement: list[np.ndarray] = []
        self.source_right: list[np.ndarray] = []
        self.kept = kept

    def crafted(self, x: tf.Tensor, y: tf.Tensor, seed) -> tf.Tensor:
        """The source's points for this batch: crafted, or taken from `kept`."""
        if self.kept is None:
            return self.attack(self.source, x, y, seed)[0]
        asked = (_digest(x), _digest(y), _digest(seed))
        if asked not in self.kept:
            self.kept[asked] = self.attack(self.source, x, y, seed)[0]
        return self.kept[asked]

    def __call__(self, model, x: tf.Tensor, y: tf.Tensor, seed) -> tuple[tf.Tensor, Breakdown]:
        x_adv = self.crafted(x, y, seed)
        source_logits = self.source(x_adv, training=False)
        source = np.argmax(np.asarray(source_logits), -1)
        target = np.argmax(np.asarray(model(x_adv, training=False)), -1)
        self.agreement.append(source == target)
        clean = self.source(x, training=False)
        self.source_right.append(np.asarray(robust_hits(correct(clean, y), source_logits, y)) > 0.5)
        return x_adv, {}


def _digest(value) -> str:
    """A batch's (or seed's) identity: its dtype, shape and bytes, hashed."""
    array = np.ascontiguousarray(np.asarray(value))
    return hashlib.sha256(str((array.dtype, array.shape)).encode() + array.tobytes()).hexdigest()


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
