"""The attack interface: `attack(model, x, y, seed) -> (x_adv, breakdown)`.

    x_adv, breakdown = attack(model, x, y, seed=0)

`seed` is an int or an int32 tensor of shape [2] (`constraints.as_seed`); every random draw of
the call comes from it, so the result is a function of the arguments alone, whatever was
called before. An evaluation passes each batch its own seed. `breakdown` is {} for a single
attack; an ensemble (AutoAttack) fills it with {"robust": {part: bool [batch]}, "seconds":
{part: float}}, what is still robust after each of its parts and the time each took.

An attack with `batches_itself = True` (AutoAttack) is given many batches at once by
`evaluation.evaluate`, and is called as `attack(model, x, y, seed, batch_size=B, progress=P)`:
it runs its own calls on at most B examples each (the evaluation batch size).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from fbat_tf import constraints

Breakdown = dict[str, dict[str, Any]]


class Attack:
    """Base class: a subclass writes `perturb`, the adversarial batch for one stateless seed."""

    eps: float
    batches_itself: bool = False

    def __call__(
        self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: int | tf.Tensor
    ) -> tuple[tf.Tensor, Breakdown]:
        return self.perturb(model, x, y, constraints.as_seed(seed)), {}

    def perturb(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """x_adv ∈ x + C for the batch (x, y)."""
        raise NotImplementedError
