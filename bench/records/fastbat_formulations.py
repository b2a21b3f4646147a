"""Time exact formulations of Fast-BAT's gradient side by side, beside Fast-AT's.

    python bench/records/fastbat_formulations.py --json=bench/results/fastbat_formulations_cpu.json

Step 5 of Fast-BAT needs g2 = ∇θ ⟨∇δ ℓ(θ, z), u⟩, a mixed second derivative along u = H ⊙ v.
The formulations timed here all compute it exactly:

- `nested_tapes` (what `fbat_tf.methods.FastBAT` does): the lower-level input gradient of step 2
  is taken inside a tape over θ, and step 5 differentiates that recorded backward pass again
  (backward-over-backward), reusing step 2's forward pass.
- `forward_over_backward`: step 2 records nothing; step 5 is the directional derivative along u
  (tf.autodiff.ForwardAccumulator on z) of the weight gradient ∇θ ℓ(θ, z) — by the symmetry of
  mixed partials the same vector — at the cost of a new forward and backward pass at z.
- `backward_over_forward`: step 2 records nothing; step 5 differentiates over θ the
  forward-mode directional derivative ⟨∇δ ℓ(θ, z), u⟩ (Pearlmutter's R-operator).

Every function is compiled with XLA (or not, `--jit_compile`) and timed in turns with the
others, `--repeats` rounds after one warm-up call each, so that background load hits them alike;
the table gives the median time per call and the ratio to Fast-AT's gradient. Each formulation's
gradient is compared with `nested_tapes`' relative to the size of the implicit term c·g2 itself
(not of the whole gradient, which g1 dominates). Two more rows time `nested_tapes` with the
`uniform` and `corner` linearization points, which skip step 1's gradient: a different
algorithm (`--linearization`), shown for its cost.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/

from harness import (  # noqa: E402
    command_line,
    describe,
    in_turns,
    load_average,
    machine,
    publish,
    table,
)

_MODEL = flags.DEFINE_string("model", "preact_resnet18", "Architecture.")
_WIDTH = flags.DEFINE_integer("width", 16, "Base width.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Batch size.")
_IMAGE = flags.DEFINE_integer("image_size", 32, "Image height and width.")
_JIT = flags.DEFINE_bool("jit_compile", True, "XLA.")
_BATCH_NORM = flags.DEFINE_bool(
    "batch_norm",
    True,
    "False: the model's batch-norm layers are identities (to isolate their cost).",
)
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed rounds (each times every function once).")
_JSON = flags.DEFINE_string("json", None, "Write the results here.")


def formulations():
    """{name: FastBAT subclass}; imported lazily so that flags parse before TensorFlow loads."""
    import tensorflow as tf

    from fbat_tf import constraints
    from fbat_tf.attacks.losses import cross_entropy
    from fbat_tf.methods.base import input_gradient
    from fbat_tf.methods.fast_bat import FastBAT

    class Unrecorded(FastBAT):
        """Steps 1–4 with nothing recorded over θ at step 2; step 5 in `implicit`."""

        def gradients(self, model, x, y, seed, loss_scale=None):
            weights = model.trainable_variables
            batch = tf.cast(tf.shape(x)[0], tf.float32)
            z = tf.stop_gradient(self.linearization_point(model, x, y, seed))
            lower_grad = input_gradient(model, x, z, y)
            delta_star = tf.stop_gradient(
                constraints.project(z + self.lambda_inv * lower_grad, x, self.eps)
            )
            with tf.GradientTape() as upper_tape:
                upper_tape.watch(delta_star)
                loss = tf.reduce_mean(cross_entropy(model(x + delta_star, training=True), y))
            *upper_grads, delta_grad = upper_tape.gradient(loss, weights + [delta_star])
            mask = constraints.inactive_mask(delta_star, x, self.eps, self.tau)
            direction = tf.stop_gradient(mask * delta_grad * batch)
            implicit = self.implicit(model, x, y, z, direction, weights, batch)
            grads = [g + self.ig_coef * i for g, i in zip(upper_grads, implicit, strict=True)]
            return grads, {}

    class ForwardOverBackward(Unrecorded):
        def implicit(self, model, x, y, z, direction, weights, batch):
            with tf.autodiff.ForwardAccumulator(z, direction) as accumulator:
                with tf.GradientTape() as tape:
                    lower = tf.reduce_sum(cross_entropy(model(x + z, training=True), y)) / batch
                weight_grads = tape.gradient(lower, weights)
            return accumulator.jvp(weight_grads)

    class BackwardOverForward(Unrecorded):
        def implicit(self, model, x, y, z, direction, weights, batch):
            with tf.GradientTape() as tape:
                with tf.autodiff.ForwardAccumulator(z, direction) as accumulator:
                    lower = tf.reduce_sum(cross_entropy(model(x + z, training=True), y)) / batch
                along = accumulator.jvp(lower)
            return tape.gradient(along, weights)

    return {
        "nested_tapes": FastBAT,
        "forward_over_backward": ForwardOverBackward,
        "backward_over_forward": BackwardOverForward,
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    import keras
    import numpy as np
    import tensorflow as tf

    from fbat_tf import device, methods, models
    from fbat_tf.models import layers

    if not _BATCH_NORM.value:
        layers.batch_norm = lambda h, name: h
    eps = 8 / 255
    keras.utils.set_random_seed(0)
    shape = (_IMAGE.value, _IMAGE.value, 3)
    model = models.build(_MODEL.value, 10, shape, mean=0.5, std=0.25, width=_WIDTH.value)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(0, 1, (_BATCH.value, *shape)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, _BATCH.value).astype(np.int32))
    seed = tf.constant([0, 1], tf.int32)
    candidates = {"fastat": methods.create("fastat", eps=eps)}
    candidates.update({name: cls(eps) for name, cls in formulations().items()})
    # Not the same algorithm: another linearization point z, without step 1's gradient.
    for linearization in ("uniform", "corner"):
        candidates[f"nested_tapes, z {linearization}"] = methods.create(
            "fastbat", eps=eps, linearization=linearization
        )
    candidates["upper_level_only"] = methods.create("fastbat", eps=eps, ig_coef=0.0)

    def compiled(method):
        return tf.function(
            lambda x, y, seed: method.gradients(model, x, y, seed)[0], jit_compile=_JIT.value
        )

    functions = {name: compiled(method) for name, method in candidates.items()}
    outputs, compile_s = {}, {}
    for name, function in functions.items():
        start = time.perf_counter()
        outputs[name] = [g.numpy() for g in function(x, y, seed)]
        compile_s[name] = time.perf_counter() - start

    def distance(a, b):
        return float(np.sqrt(sum(np.sum((p - q) ** 2) for p, q in zip(a, b, strict=True))))

    implicit_size = distance(outputs["nested_tapes"], outputs["upper_level_only"])
    agreement = {
        name: distance(outputs[name], outputs["nested_tapes"]) / implicit_size
        for name in formulations()
    }
    del functions["upper_level_only"]

    def timed(function):
        def call() -> float:
            start = time.perf_counter()
            function(x, y, seed)[0].numpy()
            return time.perf_counter() - start

        return call

    with load_average() as load:
        calls = {name: timed(function) for name, function in functions.items()}
        times = in_turns(calls, _REPEATS.value)
    median = {name: statistics.median(values) for name, values in times.items()}
    report = {
        "device": device.describe(),
        "machine": machine(),
        "model": f"{_MODEL.value} width {_WIDTH.value}",
        "batch_size": _BATCH.value,
        "image_size": _IMAGE.value,
        "jit_compile": _JIT.value,
        "batch_norm": _BATCH_NORM.value,
        "precision": "float32",
        "repeats": _REPEATS.value,
        "load_average_1min": load,
        "command": command_line(),
        "time_s": median,
        "first_call_s": compile_s,
        "ratio_to_fastat": {name: value / median["fastat"] for name, value in median.items()},
        "difference_relative_to_implicit_term": agreement,
    }
    publish(markdown_table(report), report, _JSON.value)


def markdown_table(report: dict) -> str:
    heading = (
        f"{report['model']}{'' if report['batch_norm'] else ' without batch norm'}, "
        f"batch {report['batch_size']}, {report['image_size']}px, "
        f"{report['device']}, float32, XLA {report['jit_compile']}, "
        f"{describe(report['machine'], report['load_average_1min'])}; "
        f"median of {report['repeats']} interleaved calls of the gradient function"
    )
    rows = []
    for name, seconds in report["time_s"].items():
        difference = report["difference_relative_to_implicit_term"].get(name)
        rows.append(
            [
                name,
                f"{seconds:.3f}",
                f"{report['ratio_to_fastat'][name]:.2f}",
                "" if difference is None else f"{difference:.1e}",
            ]
        )
    return table(heading, ["gradient", "time (s)", "× Fast-AT", "‖g − g_nested‖ / ‖c·g2‖"], rows)


if __name__ == "__main__":
    app.run(main)
