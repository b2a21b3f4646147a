"""Max pooling's second derivative under XLA, and what fbat_tf's max pooling costs.

    python bench/max_pool.py --json=bench/results/max_pool.json

1. Error. ∇θ⟨∇x Σ CE, v⟩ (the product Fast-BAT's implicit term and GradAlign differentiate) of
   two models with max pooling, for --draws random batches, weights and directions v: under
   XLA with Keras' max pooling and with fbat_tf.models.layers.MaxPooling2D, each against
   TensorFlow's eager kernels with Keras' layer (relative error of the whole gradient). The
   models: small_cnn (softplus, width 8, 28×28×1, batch 4) and a user's small model (conv,
   softplus, 2×2 max pooling, conv, softplus, 16×16×2, batch 4).
2. The reference. The same product of the user's model in float64, run eagerly: its
   derivative along a random direction of the weights against a central difference of the
   product (relative error), for each draw.
3. Time. Fast-AT's and Fast-BAT's gradient of small_cnn (width 16, batch 128, 28×28×1) with
   each max pooling, in graph mode and under XLA (in graph mode also with the slices that
   fbat_tf's layer takes under XLA, to show why it does not take them outside): medians of
   --repeats calls after --warmup, the variants of one execution taking turns over --rounds
   rounds. The 1-minute load average is recorded; above the machine's cores the times are
   marked as taken under load.
"""

from __future__ import annotations

import os
import statistics
import sys

from absl import app, flags
from harness import (
    command_line,
    define_rounds,
    define_steps,
    describe,
    in_turns,
    load_average,
    machine,
    publish,
    table,
    timed_steps,
)

_DRAWS = flags.DEFINE_integer("draws", 5, "Random batches, weights and v per model.", lower_bound=1)
_ROUNDS = define_rounds("Rounds in which the timed variants take turns; medians over rounds.")
_REPEATS, _WARMUP = define_steps(repeats=10, warmup=3)
_JSON = flags.DEFINE_string("json", None, "Write the results here as JSON.")


def _pools(model, pool_class) -> None:
    """Give every max-pooling layer of `model` the class `pool_class`, in place."""
    import keras

    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, keras.layers.MaxPooling2D):
            layer.__class__ = pool_class


def _models(seed: int, dtype: str = "float32"):
    """{name: (model, input shape)} with Keras' max pooling."""
    import keras

    from fbat_tf import models

    keras.utils.set_random_seed(seed)
    small_cnn = models.build("small_cnn", 10, (28, 28, 1), 0.5, 0.25, "softplus", width=8)
    _pools(small_cnn, keras.layers.MaxPooling2D)
    inputs = keras.Input((16, 16, 2), dtype=dtype)
    h = inputs
    for name in ("conv1", "pool", "conv2"):
        if name == "pool":
            h = keras.layers.MaxPooling2D(2, dtype=dtype)(h)
        else:
            h = keras.layers.Conv2D(4, 3, padding="same", dtype=dtype)(h)
            h = keras.layers.Activation("softplus", dtype=dtype)(h)
    h = keras.layers.GlobalAveragePooling2D(dtype=dtype)(h)
    users = keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(h))
    return {"small_cnn": (small_cnn, (4, 28, 28, 1)), "users_model": (users, (4, 16, 16, 2))}


def _second_derivative(model, x, y, v, jit_compile: bool):
    """(⟨∇x Σ CE, v⟩, its gradient in the weights)."""
    import tensorflow as tf

    def compute():
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                inner.watch(x)
                logits = model(x, training=True)
                loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
            product = tf.reduce_sum(inner.gradient(loss, x) * v)
        return product, outer.gradient(product, model.trainable_variables)

    return (tf.function(compute, jit_compile=True) if jit_compile else compute)()


def _relative(grads, reference) -> float:
    import numpy as np

    squares = [
        (np.sum((np.float64(a) - np.float64(b)) ** 2), np.sum(np.float64(b) ** 2))
        for a, b in zip(grads, reference, strict=True)
    ]
    return float(np.sqrt(sum(d for d, _ in squares) / sum(n for _, n in squares)))


def error_draws(draws: int) -> dict:
    """Part 1: {model: {"keras_xla": [...], "fbat_xla": [...]}} relative errors per draw."""
    import keras
    import numpy as np
    import tensorflow as tf

    from fbat_tf.models import layers

    found: dict = {}
    for draw in range(draws):
        rng = np.random.default_rng(draw)
        for name, (model, shape) in _models(draw).items():
            x = tf.constant(rng.uniform(size=shape), tf.float32)
            y = tf.constant(rng.integers(0, 3, size=shape[0]), tf.int32)
            v = tf.constant(rng.normal(size=shape), tf.float32)
            _, eager = _second_derivative(model, x, y, v, jit_compile=False)
            errors = found.setdefault(name, {"keras_xla": [], "fbat_xla": []})
            for key, pool_class in (
                ("keras_xla", keras.layers.MaxPooling2D),
                ("fbat_xla", layers.MaxPooling2D),
            ):
                _pools(model, pool_class)
                errors[key].append(_relative(_second_derivative(model, x, y, v, True)[1], eager))
    return found


def _central_difference(model, x, y, v, direction, step: float) -> float:
    """(product(θ + step·d) − product(θ − step·d)) / (2·step), the weights left as found."""
    start = [w.numpy() for w in model.trainable_variables]
    values = []
    for t in (step, -step):
        for w, w0, d in zip(model.trainable_variables, start, direction, strict=True):
            w.assign(w0 + t * d)
        values.append(float(_second_derivative(model, x, y, v, jit_compile=False)[0]))
    for w, w0 in zip(model.trainable_variables, start, strict=True):
        w.assign(w0)
    return (values[0] - values[1]) / (2 * step)


def reference_draws(draws: int, step: float = 1e-6) -> list[float]:
    """Part 2: the eager float64 derivative along a random weight direction against a central
    difference, relative error per draw."""
    import numpy as np
    import tensorflow as tf

    errors = []
    for draw in range(draws):
        rng = np.random.default_rng(100 + draw)
        model, shape = _models(draw, "float64")["users_model"]
        x = tf.constant(rng.uniform(size=shape), tf.float64)
        y = tf.constant(rng.integers(0, 3, size=shape[0]), tf.int32)
        v = tf.constant(rng.normal(size=shape), tf.float64)
        _, grads = _second_derivative(model, x, y, v, jit_compile=False)
        direction = [rng.normal(size=w.shape) for w in model.trainable_variables]
        analytic = sum(float(np.sum(g.numpy() * d)) for g, d in zip(grads, direction, strict=True))
        numeric = _central_difference(model, x, y, v, direction, step)
        errors.append(abs(analytic - numeric) / abs(numeric))
    return errors


def step_times(rounds: int, warmup: int, repeats: int) -> dict:
    """Part 3: {execution: {"<method> <pooling>": median seconds and each round's}}."""
    import keras
    import numpy as np
    import tensorflow as tf

    from fbat_tf import methods, models
    from fbat_tf.models import layers

    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(size=(128, 28, 28, 1)), tf.float32)
    y = tf.constant(np.arange(128) % 10, tf.int32)
    seed = tf.constant([1, 2], tf.int32)
    found: dict = {}
    for execution, jit_compile in (("graph", False), ("xla", True)):
        calls = {}
        poolings = {"keras": keras.layers.MaxPooling2D, "fbat": layers.MaxPooling2D}
        if not jit_compile:  # under XLA fbat_tf's layer is the slices
            poolings["slices"] = type(
                "Slices", (layers.MaxPooling2D,), {"call": layers.MaxPooling2D.maximum_over_slices}
            )
        for pooling, pool_class in poolings.items():
            keras.utils.set_random_seed(0)
            model = models.build("small_cnn", 10, (28, 28, 1), 0.286, 0.353, width=16)
            _pools(model, pool_class)
            for method in ("fastat", "fastbat"):
                gradients = methods.create(method, eps=8 / 255).gradients
                compiled = tf.function(
                    lambda g=gradients, m=model: g(m, x, y, seed)[0], jit_compile=jit_compile
                )

                def step(f=compiled):
                    return [g.numpy() for g in f()]

                for _ in range(warmup):
                    step()
                calls[(method, pooling)] = lambda s=step: timed_steps(s, 0, repeats, 128)
        rounds_found = in_turns(calls, rounds, alternate=True)
        found[execution] = {
            f"{method} {pooling}": {
                "step_time_s": statistics.median(r["step_time_s"] for r in measured),
                "rounds_s": [r["step_time_s"] for r in measured],
            }
            for (method, pooling), measured in rounds_found.items()
        }
    return found


def main(argv: list[str]) -> None:
    del argv
    from fbat_tf import startup

    startup.load_tensorflow()
    with load_average() as load:
        errors = error_draws(_DRAWS.value)
        reference = reference_draws(_DRAWS.value)
        times = step_times(_ROUNDS.value, _WARMUP.value, _REPEATS.value)
    found = machine()
    under_load = max(load["before"], load["after"]) > found["cpu_count"]
    summary = {
        "command": command_line(),
        "machine": found,
        "load_average_1min": load,
        "times_under_load": under_load,
        "second_derivative_relative_error": errors,
        "eager_float64_against_central_difference": reference,
        "step_time": times,
    }

    def spread(values: list[float]) -> str:
        return f"{min(values):.1e} – {max(values):.1e}"

    rows = [[name, spread(e["keras_xla"]), spread(e["fbat_xla"])] for name, e in errors.items()]
    markdown = table(
        f"∇θ⟨∇x Σ CE, v⟩ under XLA against TensorFlow's eager kernels, relative error, min – max "
        f"over {_DRAWS.value} draws (the eager float64 product's derivative against a central "
        f"difference: {spread(reference)})",
        ["model", "Keras' max pooling", "fbat_tf's MaxPooling2D"],
        rows,
    )
    marked = " (under load: above the machine's cores)" if under_load else ""
    time_rows = []
    for execution, measured in times.items():
        for method in ("fastat", "fastbat"):
            keras_s = measured[f"{method} keras"]["step_time_s"]
            row = [execution, method, f"{1000 * keras_s:.0f}"]
            for pooling in ("fbat", "slices"):
                seconds = measured.get(f"{method} {pooling}", {}).get("step_time_s")
                row.append(
                    "" if seconds is None else f"{1000 * seconds:.0f} ({seconds / keras_s:.2f}×)"
                )
            time_rows.append(row)
    markdown += "\n\n" + table(
        f"Gradient time of small_cnn (width 16, batch 128), ms, medians over {_ROUNDS.value} "
        f"rounds{marked}; {describe(found, load)}",
        ["execution", "method", "Keras' max pooling", "fbat_tf's MaxPooling2D", "slices always"],
        time_rows,
    )
    publish(markdown, summary, _JSON.value)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    app.run(main)
