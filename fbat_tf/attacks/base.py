"""The attack interface: `attack(model, x, y, seed) -> (x_adv, breakdown)`.

    x_adv, breakdown = attack(model, x, y, seed=0)

`seed` is an int or an int32 tensor of shape [2] (`constraints.as_seed`); every random draw of
the call comes from it, so the result is a function of the arguments alone, whatever was
called before. An evaluation passes each batch its own seed. `breakdown` is {} for a single
attack; an ensemble (AutoAttack) fills it with {"robust": {part: bool [batch]}, "seconds":
{part: float}}, what is still robust after each of its parts and the time each took.

An attack that `pools` (AutoAttack) is given many batches joined by `evaluation.evaluate`, as
`attack.in_slices(B, progress)`: the same attack, whose own calls take at most B examples each
(the evaluation batch size), with the same call signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from fbat_tf import constraints

Breakdown = dict[str, dict[str, Any]]


def for_any_batch(function: Any, *args: Any, batched: int) -> Any:
    """`function(*args)`, a tf.function traced once for every batch size: its first `batched`
    arguments after the model (args[1:1 + batched]) are batch-first tensors, traced with the
    batch dimension unknown. Without it the first call traces for its batch size and the first
    other size (the last batch, the survivors of a restart) traces again, a few tenths of a
    second each."""
    specs = [
        tf.TensorSpec([None, *value.shape[1:]], value.dtype) if 1 <= i <= batched else value
        for i, value in enumerate(args)
    ]
    function.get_concrete_function(*specs)
    return function(*args)


class Loop:
    """An attack's graph: `python_function` as a tf.function without AutoGraph (its loops are
    tf.while_loops written out), traced once for every batch size (`for_any_batch`, `batched`
    as there) and compiled by XLA if `jit_compile`. Where XLA cannot compile it (the model holds
    an op XLA lacks) the first call logs a warning naming the op and runs it as a plain graph
    from then on, with the same results up to rounding."""

    def __init__(self, python_function: Callable[..., Any], jit_compile: bool, batched: int):
        self.python_function = python_function
        self.batched = batched
        self._build(jit_compile)

    def _build(self, jit_compile: bool) -> None:
        self.jit_compile = jit_compile
        self.function = tf.function(
            self.python_function, jit_compile=jit_compile, reduce_retracing=True, autograph=False
        )
        # Until XLA has compiled one call, a compilation failure falls back to a plain graph.
        self._compiled_once = not jit_compile

    def __call__(self, *args: Any) -> Any:
        try:
            result = for_any_batch(self.function, *args, batched=self.batched)
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
            if self._compiled_once or "XLA" not in str(error):
                raise
            logging.warning(
                "XLA cannot compile %s; running it without XLA: %s",
                getattr(self.python_function, "__qualname__", "the attack"),
                str(error).splitlines()[0],
            )
            self._build(False)
            return self(*args)
        self._compiled_once = True
        return result

    def padded(self, index: tf.Tensor, n: int) -> tf.Tensor:
        """The rows `index` (of a batch of n) that a call attacks, as the call gives them: under
        XLA, which compiles once per batch size, padded with repeats of the first to the
        smallest of n, ⌈n/2⌉, ⌈n/4⌉, … that holds them (at most log2(n) + 1 sizes, under twice
        the rows); as they are otherwise. The results of the first len(index) rows are theirs."""
        count = int(tf.size(index))
        if not self.jit_compile or count == 0:
            return index
        length = n
        while length > 1 and -(-length // 2) >= count:
            length = -(-length // 2)
        return tf.concat([index, tf.repeat(index[:1], length - count)], 0)


class Attack:
    """Base class: a subclass writes `perturb`, the adversarial batch for one stateless seed."""

    eps: float
    # True for an ensemble that re-batches what is still robust before each part, as the
    # reference does over its whole set (AutoAttack): an evaluation then gives it many batches
    # joined, in one call of `in_slices(batch size)`.
    pools: bool = False

    def __call__(
        self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: int | tf.Tensor
    ) -> tuple[tf.Tensor, Breakdown]:
        return self.perturb(model, x, y, constraints.as_seed(seed)), {}

    def perturb(self, model: keras.Model, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        """x_adv ∈ x + C for the batch (x, y)."""
        raise NotImplementedError

    def in_slices(self, size: int, progress: bool = False) -> Attack:
        """This attack for inputs of many batches joined, attacked at most `size` examples at a
        time, showing its progress if `progress`. An attack that does not pool is given one
        batch at a time and is returned as it is."""
        return self
