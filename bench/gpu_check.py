"""A GPU user's first command: does Fast-BAT compute the same gradient on this device under XLA,
under the mixed policies and in both autodiff modes, and how fast are its steps here?

    python bench/gpu_check.py                       # mostly XLA compilations
    python bench/gpu_check.py --json=bench/results/gpu_check.json

On the device TensorFlow sees, with PreActResNet-18 (width 64, batch 128 on a GPU; smaller on a
CPU) and one random CIFAR-shaped batch:

1. Gradients. The reference is Fast-BAT's gradient in float32, run eagerly (backward-over-
   backward). Against it, each other way of computing it must agree on the relative error
   ‖g − g_ref‖ / ‖g_ref‖: in float32 (forward-over-backward eagerly, both modes under XLA)
   within 1e-4, with TF32 turned off (Ampere and newer GPUs run float32 convolutions in TF32 by
   default, which alone exceeds it); under mixed_bfloat16 and mixed_float16 (XLA) within 3× the
   error the policy makes on the plain training gradient of the same model and batch (its own
   rounding), so that what is checked is Fast-BAT's arithmetic under the policy, not the
   policy's precision. Every way uses the same random start δ0, drawn once here, so that XLA's
   own random numbers do not enter.
   The check runs Fast-BAT with a small 1/λ (LAMBDA_INV) and δ0 inside the ball, so that δ* is
   a smooth function of the input gradient: at the paper's 1/λ the projection saturates and
   rounding flips coordinates between the bounds, which changes the attack point, not the
   arithmetic this check is after.
2. The defaults `auto` picks on this device (dtype policy, XLA, autodiff mode).
3. Step times: Fast-AT's and Fast-BAT's gradient (both modes) under XLA in the policy `auto`
   picks, medians of --repeats calls, beside the H100 figures of bench/README.md's GPU table.
   Fast-BAT's steps are the ones step 1 compiled where it checked that policy (its fixed start
   and small 1/λ cost the passes the defaults do), so that no graph is compiled twice.

Parts that mean something on a GPU only (what `auto` picks there, the comparison with the H100
figures) are reported as skipped on a CPU. Exits non-zero if a gradient check fails.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import write_json  # noqa: E402

_MODEL = flags.DEFINE_string(
    "model", "preact_resnet18", "Architecture (the H100 figures are PreActResNet-18's)."
)
_ACTIVATION = flags.DEFINE_enum(
    "activation",
    "relu",
    ["relu", "softplus", "swish"],
    "Nonlinearity of the model.",
)
_WIDTH = flags.DEFINE_integer("width", None, "Model width (default: 64 on a GPU, 8 on a CPU).")
_BATCH = flags.DEFINE_integer("batch_size", None, "Batch (default: 128 on a GPU, 8 on a CPU).")
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed calls per step after warm-up.")
_POLICIES = flags.DEFINE_list(
    "policies",
    ["float32", "mixed_bfloat16", "mixed_float16"],
    "The dtype policies to check (float32 is the reference and always runs).",
)
_JSON = flags.DEFINE_string("json", None, "Write the results here as JSON.")

# Relative error of the whole gradient against float32 eager backward-over-backward: a number,
# or None for "POLICY_FACTOR × the policy's error on the plain training gradient".
FLOAT32_TOLERANCE = 1e-4
TOLERANCES = {
    ("float32", "eager", "forward_over_backward"): FLOAT32_TOLERANCE,
    ("float32", "xla", "backward_over_backward"): FLOAT32_TOLERANCE,
    ("float32", "xla", "forward_over_backward"): FLOAT32_TOLERANCE,
    ("mixed_bfloat16", "xla", "backward_over_backward"): None,
    ("mixed_bfloat16", "xla", "forward_over_backward"): None,
    ("mixed_float16", "xla", "backward_over_backward"): None,
    ("mixed_float16", "xla", "forward_over_backward"): None,
}
POLICY_FACTOR = 3.0
# bench/README.md's GPU table: the same steps written in JAX on an H100, PreActResNet-18 width
# 64, batch 128, ms per step.
H100_MS = {
    "float32": {
        "fastat": 7.9,
        "fastbat backward_over_backward": 31.1,
        "fastbat forward_over_backward": 18.1,
    },
    "mixed_bfloat16": {
        "fastat": 5.0,
        "fastbat backward_over_backward": 17.5,
        "fastbat forward_over_backward": 11.3,
    },
}
LOSS_SCALE = 2.0**15  # float16's: the weight gradients come back scaled by it
EPS = 8 / 255
LAMBDA_INV = 0.5 / 255
IG_COEF = 1.0


def relative_error(gradients, reference) -> float:
    """‖g − g_ref‖ / ‖g_ref‖ over all weights, in float64."""
    import numpy as np

    diff = sum(
        float(np.sum((np.float64(g) - np.float64(r)) ** 2))
        for g, r in zip(gradients, reference, strict=True)
    )
    norm = sum(float(np.sum(np.float64(r) ** 2)) for r in reference)
    return (diff / norm) ** 0.5


def verdict(error: float, tolerance: float) -> str:
    return "ok" if error <= tolerance else "FAIL"


class Problem:
    """What every way of computing the gradient shares: the model (its float32 weights), one
    random CIFAR-shaped batch, and Fast-BAT's random start δ0, drawn once here so that XLA's own
    random numbers do not enter."""

    def __init__(self, width: int, batch: int):
        import numpy as np
        import tensorflow as tf

        from fbat_tf import constraints

        self.width, self.batch = width, batch
        rng = np.random.default_rng(0)
        self.x = tf.constant(rng.uniform(0, 1, (batch, 32, 32, 3)), tf.float32)
        self.y = tf.constant(rng.integers(0, 10, batch), tf.int32)
        self.seed = tf.constant([0, 0], tf.int32)
        self.delta0 = constraints.project(
            tf.constant(rng.uniform(-EPS / 2, EPS / 2, (batch, 32, 32, 3)), tf.float32),
            self.x,
            EPS,
        )
        self.reference_model = self.build("float32")
        self.weights = self.reference_model.get_weights()
        # Fast-BAT's gradient steps compiled under XLA, by (policy, autodiff mode).
        self.compiled = {}

    def build(self, policy: str):
        """A new model under `policy` (initialized from the same seed)."""
        import keras

        from fbat_tf import models

        keras.mixed_precision.set_global_policy(policy)
        keras.utils.set_random_seed(1)
        model = models.build(
            _MODEL.value,
            10,
            (32, 32, 3),
            mean=0.5,
            std=0.25,
            width=self.width,
            activation=_ACTIVATION.value,
        )
        keras.mixed_precision.set_global_policy("float32")
        return model

    def model(self, policy: str):
        """The float32 model itself, or a new one under another policy."""
        return self.reference_model if policy == "float32" else self.build(policy)

    def fixed_start(self, **options):
        """Fast-BAT whose random start is δ0, wherever it runs."""
        from fbat_tf import constraints
        from fbat_tf.methods.base import input_gradient
        from fbat_tf.methods.fast_bat import FastBAT

        delta0 = self.delta0

        class FixedStart(FastBAT):
            def linearization_point(self, model, x, y, seed, loss_scale=None):
                grad = input_gradient(model, x, delta0, y, loss_scale)
                return constraints.project(delta0 + self.lambda_inv * grad, x, self.eps)

        return FixedStart(EPS, **options)

    def gradient(self, policy, jit, mode, plain=False, first_order=False):
        """The weight gradient under `policy` (XLA if `jit`, autodiff `mode`), as float32
        arrays: Fast-BAT's, its first-order part alone, or the plain training gradient."""
        import tensorflow as tf

        from fbat_tf import methods

        model = self.model(policy)
        model.set_weights(self.weights)
        if plain:  # the plain training gradient at x: the policy's own rounding
            method = methods.create("standard", eps=EPS)
        else:
            method = self.fixed_start(
                lambda_inv=LAMBDA_INV,
                ig_coef=0.0 if first_order else IG_COEF,
                implicit_autodiff=mode or "auto",
            )
        scale = tf.constant(LOSS_SCALE if policy == "mixed_float16" else 1.0, tf.float32)

        def step():
            grads, _ = method.gradients(model, self.x, self.y, self.seed, scale)
            return [tf.cast(g, tf.float32) / scale for g in grads]

        # Compiled as the trainer compiles a method's gradients (autograph=False).
        run = tf.function(step, jit_compile=True, autograph=False) if jit else step
        if jit and not (plain or first_order):
            self.compiled[policy, mode] = run
        return [g.numpy() for g in run()]


def print_setting(problem: Problem, training_tf32: bool) -> None:
    """The device, the model, how training runs in TF32 here, and the tolerances."""
    from fbat_tf import device

    print(
        f"device: {device.describe()}; {_MODEL.value} width {problem.width}, batch {problem.batch}"
    )
    print(
        "TF32 in training here: "
        + (
            "on: train.py's float32 convolutions and matrix products run in TF32 (TensorFlow's "
            "default on this GPU, as PyTorch's cuDNN convolutions are by default since 1.7); "
            "this check turns it off for its float32 reference"
            if training_tf32
            else "off: float32 is float32 on this device"
        )
    )
    print("Tolerances (relative error of the gradient against float32 eager):")
    print(f"  float32, TF32 off: {FLOAT32_TOLERANCE:g}")
    for policy in ("mixed_bfloat16", "mixed_float16"):
        print(f"  {policy}: {POLICY_FACTOR:g}x the policy's own error on the plain gradient")


def implicit_term(problem: Problem, reference: list) -> tuple[list, float, list]:
    """The implicit term c·g2 of the reference gradient (it minus first-order Fast-BAT's), its
    share of the gradient's norm, and first-order Fast-BAT's gradient (float32 eager)."""
    first_order = problem.gradient("float32", False, None, first_order=True)
    implicit = [r - f for r, f in zip(reference, first_order, strict=True)]
    share = relative_error(first_order, reference)
    print(
        f"The implicit term c·g2 is {100 * share:.1f}% of the gradient's norm here "
        f"(c = {IG_COEF:g}); it is checked alone too (the gradient minus first-order Fast-BAT's)."
    )
    return implicit, share, first_order


def policy_errors(problem: Problem) -> dict[str, float]:
    """Each mixed policy's own error on the plain training gradient (XLA)."""
    plain_reference = problem.gradient("float32", False, None, plain=True)
    own_error = {
        policy: relative_error(problem.gradient(policy, True, None, plain=True), plain_reference)
        for policy in ("mixed_bfloat16", "mixed_float16")
        if policy in _POLICIES.value
    }
    print(
        "\nThe policies' own error on the plain training gradient: "
        + ", ".join(f"{policy} {error:.2e}" for policy, error in own_error.items())
    )
    return own_error


def check_gradients(
    problem: Problem,
    reference: list,
    implicit: list,
    own_error: dict[str, float],
    eager_first_order: list,
) -> list[dict]:
    """Fast-BAT's gradient, and its implicit term alone, each way of TOLERANCES against float32
    eager backward-over-backward: a table row and a check each. First-order Fast-BAT's gradient
    in float32 eager is implicit_term's (`eager_first_order`), not computed again."""
    print("\nFast-BAT's gradient against float32 eager backward-over-backward (relative error):")
    print("| policy | execution | autodiff | gradient | implicit term | tolerance | verdict |")
    print("|---|---|---|---|---|---|---|")
    checks, first_orders = [], {("float32", "eager"): eager_first_order}
    for (policy, execution, mode), tolerance in TOLERANCES.items():
        if policy not in _POLICIES.value:
            print(f"| {policy} | {execution} | {mode} | skipped (--policies) | | | |")
            continue
        if tolerance is None:
            tolerance = POLICY_FACTOR * own_error[policy]
        computed = problem.gradient(policy, execution == "xla", mode)
        error = relative_error(computed, reference)
        # The implicit term alone, against float32 eager's: computed minus first-order.
        key = (policy, execution)
        if key not in first_orders:  # the same whichever autodiff mode
            first_orders[key] = problem.gradient(policy, execution == "xla", None, first_order=True)
        alone = [c - f for c, f in zip(computed, first_orders[key], strict=True)]
        implicit_error = relative_error(alone, implicit)
        outcome = verdict(max(error, implicit_error), tolerance)
        print(
            f"| {policy} | {execution} | {mode} | {error:.2e} | {implicit_error:.2e} | "
            f"{tolerance:.2e} | {outcome} |"
        )
        checks.append(
            {
                "policy": policy,
                "execution": execution,
                "autodiff": mode,
                "relative_error": error,
                "implicit_term_relative_error": implicit_error,
                "tolerance": tolerance,
                "verdict": outcome,
            }
        )
    return checks


def auto_picks(on_gpu: bool) -> dict:
    """What `auto` picks on this device: dtype policy, XLA, autodiff mode."""
    from fbat_tf import device

    picked = {
        "precision": device.resolve_precision("auto"),
        "jit_compile": device.resolve_jit_compile("auto"),
        "implicit_autodiff": device.resolve_implicit_autodiff("auto"),
    }
    print(f"\n`auto` picks here: {picked}")
    if not on_gpu:
        print("skipped (no GPU): that `auto` picks XLA, a mixed policy and forward-over-backward")
    return picked


# The steps timed: (method, its options).
TIMED_STEPS = {
    "fastat": ("fastat", {}),
    "fastbat backward_over_backward": ("fastbat", {"implicit_autodiff": "backward_over_backward"}),
    "fastbat forward_over_backward": ("fastbat", {"implicit_autodiff": "forward_over_backward"}),
}


def time_steps(problem: Problem, policy: str) -> tuple[dict[str, float], list[str]]:
    """Each of TIMED_STEPS' gradient steps under XLA in `policy`: ms, the median of --repeats
    calls after two untimed; and the names of those timed as the checks compiled them (a
    Fast-BAT step whose policy they checked)."""
    import tensorflow as tf

    from fbat_tf import methods

    x, y, seed = problem.x, problem.y, problem.seed
    timed, reused = {}, []
    for name, (method_name, options) in TIMED_STEPS.items():
        step = problem.compiled.get((policy, options.get("implicit_autodiff")))
        if method_name == "fastbat" and step is not None:
            reused.append(name)
        else:
            model = problem.model(policy)
            method = methods.create(method_name, eps=EPS, **options)
            step = tf.function(
                lambda model=model, method=method: method.gradients(model, x, y, seed)[0],
                jit_compile=True,
                autograph=False,
            )
        for _ in range(2):
            [g.numpy() for g in step()]
        seconds = []
        for _ in range(_REPEATS.value):
            start = time.perf_counter()
            [g.numpy() for g in step()]
            seconds.append(time.perf_counter() - start)
        timed[name] = 1000 * statistics.median(seconds)
    return timed, reused


def print_times(timed: dict[str, float], policy: str, on_gpu: bool, problem: Problem) -> None:
    """The step times beside Fast-AT's and the H100 figures (on a GPU)."""
    print(f"\nGradient step time here ({policy}, XLA, median of {_REPEATS.value}), ms:")
    h100 = H100_MS.get(policy)
    print("| step | here | × Fast-AT | H100, JAX (bench/README.md) |")
    print("|---|---|---|---|")
    for name, ms in timed.items():
        reference_ms = f"{h100[name]:.1f}" if (on_gpu and h100) else "skipped (no GPU)"
        print(f"| {name} | {ms:.1f} | {ms / timed['fastat']:.2f} | {reference_ms} |")
    if on_gpu and (_MODEL.value, problem.width, problem.batch) != ("preact_resnet18", 64, 128):
        print("The H100 figures are for width 64, batch 128: compare ratios only.")


def main(argv):
    del argv
    from fbat_tf import device, startup

    # As the entry points load it: TensorFlow's start-up lines left out (fbat_tf/startup.py).
    startup.load_tensorflow()
    import tensorflow as tf

    # On Ampere and newer GPUs TensorFlow runs float32 convolutions and matrix products in TF32
    # (10-bit mantissa) by default, whose rounding alone exceeds the float32 tolerance: the
    # check turns it off, so that float32 means float32 and a failure means Fast-BAT's
    # arithmetic. Training keeps TensorFlow's default.
    training_tf32 = device.tf32_in_use()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    on_gpu = device.gpu_compute_capability() is not None
    problem = Problem(_WIDTH.value or (64 if on_gpu else 8), _BATCH.value or (128 if on_gpu else 8))
    print_setting(problem, training_tf32)
    reference = problem.gradient("float32", False, "backward_over_backward")
    implicit, share, eager_first_order = implicit_term(problem, reference)
    own_error = policy_errors(problem)
    checks = check_gradients(problem, reference, implicit, own_error, eager_first_order)
    picked = auto_picks(on_gpu)
    policy = picked["precision"]
    timed, reused = time_steps(problem, policy)
    print_times(timed, policy, on_gpu, problem)
    results = {
        "device": device.describe(),
        "width": problem.width,
        "batch_size": problem.batch,
        # TF32 as training runs (TensorFlow's default here) and as this check ran (off).
        "tf32_in_training": training_tf32,
        "tf32": tf.config.experimental.tensor_float_32_execution_enabled(),
        "checks": checks,
        "implicit_term_share": share,
        "policy_error_on_the_plain_gradient": own_error,
        "auto": picked,
        "step_ms": {"policy": policy, **timed},
        "steps_timed_as_checked": reused,
    }
    if _JSON.value:
        write_json(_JSON.value, results)
        print(f"\nresults in {_JSON.value}")
    if any(check["verdict"] == "FAIL" for check in checks):
        sys.exit("error: a gradient check failed (FAIL above): do not trust runs on this device")
    print("\nall gradient checks passed")


if __name__ == "__main__":
    app.run(main)
