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

import sys
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
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


def graph_ops(model: Callable, x: tf.Tensor) -> set[str]:
    """The op types of the model's inference graph on inputs like `x`, its functions' included."""
    function = getattr(model, "function", None)  # classifiers.InferenceGraph: already a graph
    if not hasattr(function, "graph"):
        spec = tf.TensorSpec([None, *x.shape[1:]], x.dtype)
        trace = tf.function(lambda x: model(x, training=False), autograph=False)
        function = trace.get_concrete_function(spec)
    graph = function.graph.as_graph_def()
    ops = {node.op for node in graph.node}
    ops.update(node.op for f in graph.library.function for node in f.node_def)
    return ops


def has_convolutions(model: Callable, x: tf.Tensor) -> bool:
    """Whether the model's inference graph on inputs like `x` holds a convolution (any op whose
    type names one: Conv2D, its fused and depthwise forms)."""
    return any("Conv" in op for op in graph_ops(model, x))


def xla_pays(model: Callable, x: tf.Tensor, dense_on_cpu: bool) -> bool:
    """An attack's own choice of XLA: on a GPU, yes; on a CPU, only with `dense_on_cpu` (FAB-T,
    Square) and for a model without convolutions. There XLA fuses those attacks' element-wise
    work (0.62× and 0.67× their plain time on an MLP), but its CPU convolutions are far slower
    than TensorFlow's oneDNN kernels (FAB-T 7.7× and Square 2.4× slower on the small CNN:
    bench/records/attack_xla.py)."""
    from fbat_tf import device

    if device.gpu_compute_capability() is not None:
        return True
    return dense_on_cpu and not has_convolutions(model, x)


def padded_rows(rows: tf.Tensor | np.ndarray, length: int) -> tf.Tensor | np.ndarray:
    """`rows` (row indices, not empty) padded to `length` with repeats of the first: a call on
    them has the batch size `length`, and its results for the first len(rows) are theirs."""
    count = int(rows.shape[0])
    if isinstance(rows, np.ndarray):
        return np.concatenate([rows, np.repeat(rows[:1], length - count)])
    return tf.concat([rows, tf.repeat(rows[:1], length - count)], 0)


class Loop:
    """An attack's graph: `python_function` as a tf.function without AutoGraph (its loops are
    tf.while_loops written out), traced once for every batch size (`for_any_batch`, `batched`
    as there) and compiled by XLA if `jit_compile` (None: as `xla_pays(..., dense_on_cpu)`
    decides for the model of the first call). Calls take the model first. Where XLA cannot
    compile it (the model holds an op XLA lacks) the first call logs a warning naming the op and
    runs it as a plain graph from then on, with the same results up to rounding; so does the
    call for which one of XLA's own internal checks fails as it compiles (`_cannot_compile`),
    at any batch size."""

    def __init__(
        self,
        python_function: Callable[..., Any],
        jit_compile: bool | None,
        batched: int,
        dense_on_cpu: bool = False,
    ):
        self.python_function = python_function
        self.batched = batched
        self.dense_on_cpu = dense_on_cpu
        self.jit_compile = jit_compile
        self.function = None
        if jit_compile is not None:
            self._build(jit_compile)

    def _build(self, jit_compile: bool) -> None:
        self.jit_compile = jit_compile
        self.function = tf.function(
            self.python_function, jit_compile=jit_compile, reduce_retracing=True, autograph=False
        )
        # Until XLA has compiled one call, a compilation failure falls back to a plain graph.
        self._compiled_once = not jit_compile

    def resolve(self, model: Callable, x: tf.Tensor) -> bool:
        """Whether calls on this model (with inputs like x) compile with XLA; decided once."""
        if self.function is None:
            self._build(xla_pays(model, x, self.dense_on_cpu))
        return self.jit_compile

    def __call__(self, model: Callable, *args: Any) -> Any:
        self.resolve(model, args[0])
        try:
            result = for_any_batch(self.function, model, *args, batched=self.batched)
        except (
            tf.errors.InvalidArgumentError,
            tf.errors.UnimplementedError,
            tf.errors.InternalError,
        ) as error:
            if not self.jit_compile or not self._cannot_compile(error):
                raise
            logging.warning(
                "XLA cannot compile %s; running it without XLA: %s",
                getattr(self.python_function, "__qualname__", "the attack"),
                str(error).splitlines()[0],
            )
            self._build(False)
            return self(model, *args)
        self._compiled_once = True
        return result

    def _cannot_compile(self, error: tf.errors.OpError) -> bool:
        """Whether XLA failed to compile the call that raised `error`: one of its own internal
        checks, raised from its compiler passes (xla/service/), at any batch size (XLA 2.21's
        dynamic padder on a Square L2 search of a single point, for one); an op it lacks,
        before it has compiled a call (later, "XLA" in an error may be the computation's)."""
        if isinstance(error, tf.errors.InternalError):
            return "xla/service/" in str(error)
        return not self._compiled_once and "XLA" in str(error)

    def padded(self, model: Callable, x: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
        """The rows `index` of the batch x that a call on `model` attacks, as the call gives
        them: under XLA, which compiles once per batch size, padded with repeats of the first to
        the smallest of n, ⌈n/2⌉, ⌈n/4⌉, … that holds them (n = len(x): at most log2(n) + 1
        sizes, under twice the rows); as they are otherwise. The results of the first
        len(index) rows are theirs."""
        count = int(tf.size(index))
        if not self.resolve(model, x) or count == 0:
            return index
        length = int(x.shape[0])
        while length > 1 and -(-length // 2) >= count:
            length = -(-length // 2)
        return padded_rows(index, length)


class Attack:
    """Base class: a subclass writes `perturb`, the adversarial batch for one stateless seed."""

    eps: float
    # The ball its points lie in, ‖δ‖ ≤ eps in this norm (constraints.NORMS).
    norm: str = "linf"
    # Whether it returns, per example, an adversarial point whenever one of the points it tried
    # was one (this project's PGD, APGD, FAB, Square and AutoAttack): such an attack cannot
    # succeed silently, and the indicators need not attack again to tell (fbat_tf/indicators).
    keeps_adversarial: bool = False
    # True for an ensemble that re-batches what is still robust before each part, as the
    # reference does over its whole set (AutoAttack): an evaluation then gives it many batches
    # joined, in one call of `in_slices(batch size)`.
    pools: bool = False
    # Whether it needs the input gradients of the model it attacks: on a model without them
    # (losses.UnavailableGradientError) an evaluation reports it not applicable instead.
    needs_gradients: bool = True

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


def bar_verbosity() -> int:
    """Keras progress-bar verbosity: redrawn (1) on a terminal; elsewhere, as in a log file,
    one line at the end (2) instead of carriage-return updates."""
    return 1 if sys.stdout.isatty() else 2


def progress_bar(
    target: int | None,
    unit_name: str = "step",
    stateful_metrics: list[str] | None = None,
    every: float = 10.0,
) -> keras.utils.Progbar | LoggedProgress:
    """A progress bar for work counted in `target` units (`.add(1, values=[(name, value)])`).

    On a terminal, Keras' bar, redrawn. Elsewhere (a log file, a pipe) Keras' bar writes one
    line at the end; `LoggedProgress` adds a line at most every `every` seconds before it, so
    that a long evaluation read from a file shows that it runs and how far it got."""
    bar = keras.utils.Progbar(
        target, stateful_metrics=stateful_metrics, unit_name=unit_name, verbose=bar_verbosity()
    )
    return bar if sys.stdout.isatty() else LoggedProgress(bar, unit_name, every)


class LoggedProgress:
    """Keras' end-of-work line, and before it `unit done/target - seconds - latest values`
    lines, flushed, at most one every `every` seconds."""

    def __init__(self, bar: keras.utils.Progbar, unit_name: str, every: float):
        self.bar, self.unit_name, self.every = bar, unit_name, every
        self.start = self.last = time.monotonic()
        self.done = 0

    def add(self, n: int, values: list[tuple[str, float]] | None = None) -> None:
        self.done += n
        self.bar.add(n, values=values)
        now = time.monotonic()
        if self.bar.target is not None and self.done >= self.bar.target:
            sys.stdout.flush()
            return
        if now - self.last < self.every:
            return
        self.last = now
        target = "?" if self.bar.target is None else self.bar.target
        shown = "".join(f" - {name}: {float(value):.4f}" for name, value in values or [])
        print(f"{self.unit_name} {self.done}/{target} - {now - self.start:.0f}s{shown}", flush=True)
