"""Time one optimizer step of Fast-AT and Fast-BAT in PyTorch beside fbat-tf's, on this CPU.

    python bench/step_vs_torch.py --repeats=10 --rounds=3 \
        --json=bench/results/step_vs_torch_cpu.json
    python bench/step_vs_torch.py --width=8 --batch_size=8 --repeats=2 --rounds=1   # smoke run
    python bench/step_vs_torch.py --check        # both frameworks compute the same step

PreActResNet-18 (width 64 by default: the standard CIFAR model), batch 32, 32x32x3, float32,
SGD with momentum 0.9 and coupled weight decay 5e-4 (DESIGN.md §3), ε = 8/255, the methods'
default hyper-parameters. Every (implementation, method) pair runs in its own child process
(`harness.run_per_method`; `--rounds=R` makes them take turns R times and reports medians over
the rounds): warm-up steps, then the median of `--repeats` timed steps. The variants:

- `fbat_tf`: fbat-tf's default CPU path, `--jit_compile=auto` (no XLA on a CPU) with oneDNN on
  (`TF_ENABLE_ONEDNN_OPTS=1`, as train.py and evaluate.py set it; `--noonednn` for 0);
- `fbat_tf_xla`: the same with `jit_compile=True` (XLA compiles the method's gradient);
- `torch`: the same steps written in PyTorch here, `torch.set_num_threads(os.cpu_count())`
  (`--torch_threads` to change it).

The fbat-tf timings are `bench/step_time.py`'s own: the child runs `step_time.py --child=...`
(the model, `AdversarialTrainer.train_on_batch`, its warm-up and timing) and passes its numbers
on. Reported: seconds per step, images/s, memory as step_time.py defines it, each fbat-tf
variant's ratio to PyTorch per method, and Fast-BAT / Fast-AT within each implementation; plus
the machine (CPU count, load average before and after, versions). JSON and a Markdown table.

The PyTorch side (bench/torch_reference.py, whose docstring says what it matches): the same
model (`preact_resnet18`), steps (`GRADIENTS`), then `torch.optim.SGD(lr=0.01, momentum=0.9,
weight_decay=5e-4)` (step_time.py's learning rate; the decay is added to the gradient before
momentum, as fbat-tf's trainer does).

Not matched, on purpose: fbat-tf's trainer also updates its metrics, logs Fast-BAT's
ig_norm_ratio and inactive_fraction, checks the loss for non-finite values and keeps a copy of
the batch-norm statistics each step (a few small ops); its noise comes from a stateless seed,
PyTorch's from its global generator; PyTorch runs NCHW (its default), TensorFlow NHWC.

`--check` (one process, both frameworks, PreActResNet-18 width 4, batch 8): copies the Keras
model's weights into a PyTorch model with Keras's padding, feeds both the same batch and the
same uniform noise δ0 (fbat-tf's, from its seed), and compares fbat-tf's `method.perturb` and
`method.gradients` (eager, no XLA) with the PyTorch functions timed here: the largest difference
of x+δ, and the relative difference of the whole gradient and, for Fast-BAT, of c·g2 alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch_reference as reference
from absl import app, flags
from harness import (
    command_line,
    define_rounds,
    define_steps,
    load_average,
    machine,
    publish,
    report,
    run_child,
    run_per_method,
    timed_steps,
)

HERE = os.path.dirname(os.path.abspath(__file__))

METHODS = ["fastat", "fastbat"]
# variant -> (label, step_time.py's --jit_compile); "torch" is this script's own.
TF_VARIANTS = {"fbat_tf": ("fbat-tf default", "auto"), "fbat_tf_xla": ("fbat-tf XLA", "true")}
VARIANTS = ["torch", *TF_VARIANTS]
LABELS = {**{name: label for name, (label, _) in TF_VARIANTS.items()}, "torch": "PyTorch"}

LEARNING_RATE = 0.01  # step_time.py's
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
IMAGE_SIZE, CHANNELS, CLASSES = 32, reference.CHANNELS, reference.CLASSES
CHECK_WIDTH, CHECK_BATCH = 4, 8

_METHODS = flags.DEFINE_list("methods", METHODS, f"Methods to time, of {METHODS}.")
_VARIANTS = flags.DEFINE_list(
    "variants",
    VARIANTS,
    "Implementations to time: fbat_tf (no XLA on a CPU, fbat-tf's default), fbat_tf_xla "
    "(jit_compile=True), torch.",
)
_WIDTH = flags.DEFINE_integer("width", 64, "PreActResNet-18 base width.", lower_bound=1)
_BATCH = flags.DEFINE_integer("batch_size", 32, "Batch size.", lower_bound=1)
_REPEATS, _WARMUP = define_steps(repeats=10, warmup=3)
_ROUNDS = define_rounds("Child processes per variant, taking turns; numbers are medians.")
_TF_THREADS = flags.DEFINE_integer(
    "tf_threads",
    0,
    "step_time.py's --tf_threads for the fbat-tf children (0: TensorFlow's defaults).",
    lower_bound=0,
)
_TORCH_THREADS = flags.DEFINE_integer(
    "torch_threads",
    None,
    "torch.set_num_threads for the PyTorch children (default: os.cpu_count()).",
    lower_bound=1,
)
_ONEDNN = flags.DEFINE_bool(
    "onednn", True, "TF_ENABLE_ONEDNN_OPTS for the fbat-tf children: 1 as train.py sets it, or 0."
)
_CHECK = flags.DEFINE_bool(
    "check", False, "Instead of timing: check that both frameworks compute the same steps."
)
_PROFILE = flags.DEFINE_integer(
    "profile_steps",
    0,
    "After timing, run this many more steps under each framework's profiler and report the "
    "time per kind of operation (bench/profiles.py).",
    lower_bound=0,
)
_JSON = flags.DEFINE_string("json", None, "Write the results here.")
_CHILD = flags.DEFINE_string("child", None, "Internal: time this variant:method, print JSON.")


# --------------------------------------------------------------------------------------------
# PyTorch: bench/torch_reference.py's model and steps, with SGD.


def _batch(batch_size: int):
    """step_time.py's batch: U[0, 1] images and random labels from numpy's generator, seed 0."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (batch_size, IMAGE_SIZE, IMAGE_SIZE, CHANNELS)).astype(np.float32)
    y = rng.integers(0, CLASSES, batch_size).astype(np.int32)
    return x, y


def time_torch(method: str) -> dict:
    import torch

    torch.set_num_threads(_TORCH_THREADS.value or os.cpu_count())
    torch.manual_seed(0)
    model = reference.preact_resnet18(_WIDTH.value).train()
    params = list(model.parameters())
    optimizer = torch.optim.SGD(
        params, lr=LEARNING_RATE, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY
    )
    x, y = _batch(_BATCH.value)
    x, y = reference.to_torch(x, y)  # NCHW, int64
    gradients = reference.GRADIENTS[method]

    def step() -> float:
        grads, loss, _ = gradients(model, x, y)
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        optimizer.step()  # adds weight decay to the gradient, then momentum
        return loss.item()

    measured = timed_steps(step, _WARMUP.value, _REPEATS.value, _BATCH.value)
    if _PROFILE.value:
        from profiles import torch_profile

        measured["profile"] = torch_profile(step, _PROFILE.value)
    return {
        **measured,
        "parameters": sum(p.numel() for p in params),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "parallel_info": torch.__config__.parallel_info(),
    }


# --------------------------------------------------------------------------------------------
# fbat-tf: bench/step_time.py's child, run as is.


def step_time_command(method: str | None, jit_compile: str) -> list[str]:
    """step_time.py's child for one method; method None: the user's command for all of them."""
    return [
        sys.executable,
        os.path.join(HERE, "step_time.py"),
        f"--child={method}" if method else f"--methods={','.join(_METHODS.value)}",
        "--model=preact_resnet18",
        f"--width={_WIDTH.value}",
        f"--batch_size={_BATCH.value}",
        f"--image_size={IMAGE_SIZE}",
        f"--channels={CHANNELS}",
        f"--jit_compile={jit_compile}",
        "--precision=float32",
        f"--repeats={_REPEATS.value}",
        f"--warmup={_WARMUP.value}",
        *([f"--profile_steps={_PROFILE.value}"] if _PROFILE.value else []),
        *([f"--tf_threads={_TF_THREADS.value}"] if _TF_THREADS.value else []),
    ]


def time_fbat_tf(variant: str, method: str) -> dict:
    command = step_time_command(method, TF_VARIANTS[variant][1])
    measured = run_child(command, " ".join(command))
    measured["command"] = " ".join(["python", "bench/step_time.py", *command[2:]])
    measured["onednn"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    return measured


# --------------------------------------------------------------------------------------------
# --check: the same batch, weights and noise through both frameworks.


def _norm(tensors: list) -> float:
    import numpy as np

    return float(np.sqrt(sum(float(np.sum(np.square(np.asarray(t)))) for t in tensors)))


def _relative(a: list, b: list) -> float:
    """‖a − b‖ / ‖b‖ over a list of arrays."""
    return _norm([u - w for u, w in zip(a, b, strict=True)]) / _norm(b)


def check() -> dict:
    import keras
    import numpy as np
    import tensorflow as tf
    import torch

    from fbat_tf import constraints, methods, models

    keras.utils.set_random_seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count())
    shape = (IMAGE_SIZE, IMAGE_SIZE, CHANNELS)
    keras_model = models.build(
        "preact_resnet18", CLASSES, shape, reference.MEAN, reference.STD, width=CHECK_WIDTH
    )
    torch_model = reference.preact_resnet18(CHECK_WIDTH, keras_padding=True).train()
    reference.copy_keras_weights(keras_model, torch_model)
    x, y = _batch(CHECK_BATCH)
    seed = tf.constant([0, 1], tf.int32)
    noise = np.asarray(constraints.uniform_noise(tf.constant(x), reference.EPS, seed))
    tx, ty = reference.to_torch(x, y)
    noise_nchw, _ = reference.to_torch(noise, y)
    out = {"width": CHECK_WIDTH, "batch_size": CHECK_BATCH}
    with torch.no_grad():
        logits_tf = np.asarray(keras_model(x, training=False))
        logits_torch = torch_model.eval()(tx).numpy()
        torch_model.train()
    out["logits_max_abs_diff"] = float(np.max(np.abs(logits_tf - logits_torch)))
    for name in _METHODS.value:
        method = methods.create(name, eps=reference.EPS)
        x_adv_tf = np.asarray(method.perturb(keras_model, x, y, seed))
        grads_tf, _ = method.gradients(keras_model, x, y, seed)
        grads_tf = [np.asarray(g) for g in grads_tf]
        grads, loss, parts = reference.GRADIENTS[name](torch_model, tx, ty, noise_nchw)
        x_adv_torch = (tx + parts["delta"]).detach().numpy().transpose(0, 2, 3, 1)
        result = {
            "x_adv_max_abs_diff": float(np.max(np.abs(x_adv_tf - x_adv_torch))),
            "x_adv_fraction_differing": float(np.mean(np.abs(x_adv_tf - x_adv_torch) > 1e-5)),
            "gradient_relative_diff": _relative(
                reference.gradients_as_keras(keras_model, torch_model, grads), grads_tf
            ),
        }
        if name == "fastbat":
            upper_tf, _ = methods.create(name, eps=reference.EPS, ig_coef=0.0).gradients(
                keras_model, x, y, seed
            )
            implicit_tf = [g - np.asarray(u) for g, u in zip(grads_tf, upper_tf, strict=True)]
            implicit_torch = [reference.FASTBAT_IG_COEF * g for g in parts["g2"]]
            result["implicit_term_relative_diff"] = _relative(
                reference.gradients_as_keras(keras_model, torch_model, implicit_torch), implicit_tf
            )
            result["implicit_to_upper_norm_ratio"] = _norm(implicit_tf) / _norm(upper_tf)
        out[name] = result
    return out


def check_table(result: dict) -> str:
    lines = [
        f"PreActResNet-18 width {result['width']}, batch {result['batch_size']}, Keras's weights "
        f"and padding in PyTorch, the same δ0; inference logits differ by at most "
        f"{result['logits_max_abs_diff']:.1e}",
        "",
        "| method | largest difference of x+δ | fraction of pixels > 1e-5 apart "
        "| ‖g_torch − g_tf‖ / ‖g_tf‖ | the same for c·g2 alone | ‖c·g2‖ / ‖g1‖ (fbat-tf) |",
        "|---|---|---|---|---|---|",
    ]
    for name in METHODS:
        if name in result:
            r = result[name]
            implicit = r.get("implicit_term_relative_diff")
            share = r.get("implicit_to_upper_norm_ratio")
            lines.append(
                f"| {name} | {r['x_adv_max_abs_diff']:.1e} | {r['x_adv_fraction_differing']:.1e} "
                f"| {r['gradient_relative_diff']:.1e} | "
                f"{'' if implicit is None else f'{implicit:.1e}'} | "
                f"{'' if share is None else f'{share:.1e}'} |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The parent: children in turns, the summary, the table.


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _CHILD.value:
        variant, method = _CHILD.value.split(":")
        report(time_torch(method) if variant == "torch" else time_fbat_tf(variant, method))
        return
    for flag, given, known in (
        ("methods", _METHODS.value, METHODS),
        ("variants", _VARIANTS.value, VARIANTS),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            sys.exit(f"error: --{flag} has unknown name(s) {unknown}; choose from {known}")
    if (_CHECK.value or "torch" in _VARIANTS.value) and importlib.util.find_spec("torch") is None:
        sys.exit("error: PyTorch is not installed (a bench-only dependency): pip install torch")
    command = command_line()
    if _CHECK.value:
        result = {"command": command, "machine": machine(), "check": check()}
        publish(check_table(result["check"]), result, _JSON.value)
        return

    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if _ONEDNN.value else "0"  # the children's
    names = [f"{variant}:{method}" for variant in _VARIANTS.value for method in _METHODS.value]
    with load_average() as load:
        measured = run_per_method(__file__, names, _ROUNDS.value)
    results: dict[str, dict[str, dict]] = {}
    for name, r in measured.items():
        variant, method = name.split(":")
        results.setdefault(variant, {})[method] = r
        print(f"{name}: {r['step_time_s']:.3f} s/step", file=sys.stderr)

    def seconds(variant: str, method: str) -> float | None:
        return results.get(variant, {}).get(method, {}).get("step_time_s")

    ratio_to_torch = {
        variant: {
            method: seconds(variant, method) / seconds("torch", method) for method in _METHODS.value
        }
        for variant in results
        if variant != "torch" and "torch" in results
    }
    fastbat_over_fastat = {
        variant: seconds(variant, "fastbat") / seconds(variant, "fastat")
        for variant in results
        if seconds(variant, "fastbat") and seconds(variant, "fastat")
    }
    summary = {
        "model": f"preact_resnet18 width {_WIDTH.value}",
        "batch_size": _BATCH.value,
        "image_size": IMAGE_SIZE,
        "precision": "float32",
        "eps": reference.EPS,
        "optimizer": {
            "name": "SGD",
            "learning_rate": LEARNING_RATE,
            "momentum": MOMENTUM,
            "weight_decay": WEIGHT_DECAY,
        },
        "repeats": _REPEATS.value,
        "warmup": _WARMUP.value,
        "rounds": _ROUNDS.value,
        "onednn": _ONEDNN.value,
        "tf_threads": _TF_THREADS.value or None,
        "command": command,
        # The same fbat-tf measurement through step_time.py itself.
        "step_time_commands": {
            variant: " ".join(
                [
                    f"TF_ENABLE_ONEDNN_OPTS={os.environ['TF_ENABLE_ONEDNN_OPTS']}",
                    "python",
                    "bench/step_time.py",
                    *step_time_command(None, jit)[2:],
                ]
            )
            for variant, (_, jit) in TF_VARIANTS.items()
            if variant in results
        },
        "machine": machine(),
        "load_average_1min": load,
        "results": results,
        "ratio_to_torch": ratio_to_torch,
        "fastbat_over_fastat": fastbat_over_fastat,
    }
    if "fastbat" in ratio_to_torch.get("fbat_tf", {}):
        ratio = ratio_to_torch["fbat_tf"]["fastbat"]
        summary["target"] = {
            "fbat_tf_fastbat_over_torch": ratio,
            "at_or_below_torch": ratio <= 1.0,
            "goal_0.75": ratio <= 0.75,
        }
    markdown = markdown_table(summary)
    profiled = {
        f"{LABELS[variant]} {method}": r["profile"]
        for variant, by_method in results.items()
        for method, r in by_method.items()
        if "profile" in r
    }
    if profiled:
        from profiles import markdown_table as profile_table

        markdown += "\n\nSeconds per step by kind of operation (each framework's profiler):\n\n"
        markdown += profile_table(profiled)
    publish(markdown, summary, _JSON.value)


def markdown_table(summary: dict) -> str:
    results, m, load = summary["results"], summary["machine"], summary["load_average_1min"]
    variants = [v for v in VARIANTS if v in results]
    compared = [v for v in variants if v in summary["ratio_to_torch"]]
    methods = [name for name in METHODS if any(name in results[v] for v in variants)]
    versions = ", ".join(
        part
        for part in (
            f"TF {m['tensorflow']} (oneDNN {'on' if summary['onednn'] else 'off'}"
            + (f", {summary['tf_threads']} thread(s)" if summary.get("tf_threads") else "")
            + "), "
            f"Keras {m['keras']}"
            if set(variants) & set(TF_VARIANTS)
            else "",
            f"PyTorch {m['torch']} ({results['torch'][methods[0]]['torch_threads']} threads)"
            if "torch" in results
            else "",
        )
        if part
    )
    lines = [
        f"PreActResNet-18 width {summary['model'].split()[-1]}, batch {summary['batch_size']}, "
        f"{summary['image_size']}×{summary['image_size']}×3, float32, CPU ({m['cpu_count']} "
        f"cores), {versions}; median of {summary['repeats']} steps after {summary['warmup']} "
        "warm-up"
        + (f", median over {summary['rounds']} alternating rounds" if summary["rounds"] > 1 else "")
        + f"; load average (1 min) {load['before']:.2f} before, {load['after']:.2f} after",
        "",
        "| method | "
        + " | ".join(f"{LABELS[v]} (s)" for v in variants)
        + "".join(f" | {LABELS[v]} / PyTorch" for v in compared)
        + " |",
        "|---" * (1 + len(variants) + len(compared)) + "|",
    ]

    def cell(value: float | None, digits: int = 3) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    for method in methods:
        lines.append(
            f"| {method} | "
            + " | ".join(cell(results[v].get(method, {}).get("step_time_s")) for v in variants)
            + "".join(f" | {cell(summary['ratio_to_torch'][v].get(method), 2)}" for v in compared)
            + " |"
        )
    if summary["fastbat_over_fastat"]:
        lines.append(
            "| fastbat / fastat | "
            + " | ".join(cell(summary["fastbat_over_fastat"].get(v), 2) for v in variants)
            + " |" * len(compared)
            + " |"
        )
    if load["before"] > 0.5:
        lines += [
            "",
            f"The machine was busy before the run (load average {load['before']:.2f}"
            f" on {m['cpu_count']} cores): other processes slow every variant, multi-threaded "
            "PyTorch (OpenMP threads waiting for each other) most; rerun on an idle machine.",
        ]
    target = summary.get("target")
    if target:
        lines += [
            "",
            f"fbat-tf's default Fast-BAT step is {target['fbat_tf_fastbat_over_torch']:.2f}× "
            "PyTorch's: target (at or below PyTorch's) "
            f"{'met' if target['at_or_below_torch'] else 'NOT met'}; "
            f"goal ≤ 0.75× {'met' if target['goal_0.75'] else 'not met'}.",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    app.run(main)
