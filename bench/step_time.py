"""Time one optimizer step of each training method on the same model, batch and device.

    python bench/step_time.py --model=preact_resnet18 --width=16 --batch_size=64 \
        --image_size=32 --jit_compile=true --precision=float32 --json=bench/results/step_time.json
    python bench/step_time.py --methods=fastat,fastbat,fastbat:ig=none   # a method's options

A method is named as `train.py --method` names it, optionally with options of its constructor
after colons (`fastbat:ig=none`, `pgd:steps=10`, `free:replays=4:alpha=0.01`); `fastbat_bob`
and `fastbat_fob` are Fast-BAT with implicit_autodiff backward_over_backward and
forward_over_backward. Each method runs in its own child process (so that its peak memory is its
own), one after the other on the same machine (`--rounds=R`: R times in turns, medians over the
rounds): build the model and `AdversarialTrainer`, warm up (tracing and XLA compilation), then
time `--repeats` calls of `train_on_batch`, which returns numbers and so waits for the step to
finish. Reports per method the median optimizer step time (Free-AT's call makes m optimizer
steps, one per replay of the batch: its step is a call's time / m, and "batch pass" is the
whole call, the cost of passing each of the batch's examples through training once), each
round's, images/s, peak memory (GPU: the allocator's peak; CPU: the child's peak resident set,
and what the steps added to the resident set of the built process) and the ratios to Fast-AT;
writes JSON ("methods": {name: {"step_seconds": ...}}, "setting": {...}) and prints a Markdown
table. `--profile_steps=N` then runs N more steps under TensorFlow's profiler and adds the
kernel time per kind of operation (bench/profiles.py) to each method's numbers; use it without
XLA.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from harness import (
    children_in_turns,
    command_line,
    define_rounds,
    define_steps,
    describe,
    load_average,
    machine,
    median_of,
    parse_variant,
    publish,
    report,
    table,
    timed_steps,
    variant_label,
)

from fbat_tf import methods  # noqa: E402  (harness puts the checkout on the path)

ALL_METHODS = methods.names()
# Fast-BAT with each implicit_autodiff mode named explicitly ("fastbat" itself is "auto").
ALIASES = {
    "fastbat_bob": "fastbat:implicit_autodiff=backward_over_backward",
    "fastbat_fob": "fastbat:implicit_autodiff=forward_over_backward",
}

_METHODS = flags.DEFINE_list(
    "methods",
    ALL_METHODS,
    "Methods to time, each optionally with options (fastbat:ig=none); fastbat_bob and "
    "fastbat_fob are Fast-BAT with implicit_autodiff backward_over_backward and "
    "forward_over_backward.",
)
_MODEL = flags.DEFINE_string("model", "preact_resnet18", "Architecture.")
_WIDTH = flags.DEFINE_integer("width", 16, "Base width.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Batch size.")
_IMAGE = flags.DEFINE_integer("image_size", 32, "Image height and width.")
_CHANNELS = flags.DEFINE_integer("channels", 3, "Image channels.")
_JIT = flags.DEFINE_enum("jit_compile", "true", ["auto", "true", "false"], "XLA.")
_PRECISION = flags.DEFINE_enum(
    "precision", "float32", ["auto", "float32", "mixed_float16", "mixed_bfloat16"], "Policy."
)
_ONEDNN = flags.DEFINE_enum(
    "onednn",
    "environment",
    ["environment", "on", "off"],
    "TF_ENABLE_ONEDNN_OPTS for the children: as the environment has it, 1 (as train.py sets "
    "it) or 0.",
)
_REPEATS, _WARMUP = define_steps(repeats=20, warmup=3)
_ROUNDS = define_rounds()
_PROFILE = flags.DEFINE_integer(
    "profile_steps",
    0,
    "After timing, run this many more steps under TensorFlow's profiler and report the time "
    "per kind of operation (bench/profiles.py; meaningful without XLA).",
    lower_bound=0,
)
_THREADS = flags.DEFINE_integer(
    "tf_threads",
    0,
    "TensorFlow's intra-op and inter-op thread pools both this size (0: TensorFlow's "
    "defaults). With 1, one kernel runs at a time on one core, so profiled kernel times add "
    "up to the step's time.",
    lower_bound=0,
)
_JSON = flags.DEFINE_string("json", None, "Write the results here.")
_CHILD = flags.DEFINE_string("child", None, "Internal: time this one method and print JSON.")


def time_method(variant: str) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    if _THREADS.value:
        tf.config.threading.set_intra_op_parallelism_threads(_THREADS.value)
        tf.config.threading.set_inter_op_parallelism_threads(_THREADS.value)

    from fbat_tf import device, methods, models
    from fbat_tf.trainer import AdversarialTrainer

    precision = device.resolve_precision(_PRECISION.value)
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(0)
    shape = (_IMAGE.value, _IMAGE.value, _CHANNELS.value)
    classifier = models.build(_MODEL.value, 10, shape, mean=0.5, std=0.25, width=_WIDTH.value)
    name, options = parse_variant(ALIASES.get(variant, variant))
    method = methods.create(name, eps=8 / 255, **options)
    method.build((_BATCH.value, *shape))
    trainer = AdversarialTrainer(
        classifier, method, jit_compile=device.resolve_jit_compile(_JIT.value)
    )
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    trainer.compile(optimizer=optimizer)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (_BATCH.value, *shape)).astype(np.float32)
    y = rng.integers(0, 10, _BATCH.value).astype(np.int32)

    def step():
        return trainer.train_on_batch(x, y)  # returns numpy logs: the step has finished

    gpu = bool(tf.config.list_physical_devices("GPU"))
    # Free-AT takes m optimizer steps per call: the time of one optimizer step is a call's / m.
    measured = timed_steps(
        step, _WARMUP.value, _REPEATS.value, _BATCH.value, method.replays, gpu=gpu
    )
    if _PROFILE.value:
        from profiles import tf_profile

        measured["profile"] = tf_profile(step, _PROFILE.value)
    return {
        **measured,
        "optimizer_steps_per_batch": method.replays,
        "method": {"title": method.title, **method.config()},
        "passes": method.passes,
        "device": device.describe(),
        "precision": precision,
        "jit_compile": device.resolve_jit_compile(_JIT.value),
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "tf_threads": _THREADS.value or None,
    }


def method_entry(rounds: list[dict], batch_size: int) -> dict:
    """One method's numbers in the JSON: medians over the rounds, and each round's step."""
    merged = median_of(rounds)
    steps = rounds[0]["optimizer_steps_per_batch"]
    entry = {
        "step_seconds": merged["step_time_s"],
        "round_step_seconds": [r["step_time_s"] for r in rounds],
        "images_per_second": batch_size / merged["step_time_s"],
        "optimizer_steps_per_batch": steps,
        "batch_pass_seconds": merged["step_time_s"] * steps,
        "batch_pass_images_per_second": batch_size / (merged["step_time_s"] * steps),
        "peak_memory_mb": merged["peak_memory_mb"],
        "step_memory_mb": merged["step_memory_mb"],
        "method": merged["method"],
        "passes": merged["passes"],
    }
    if "profile" in merged:
        entry["profile"] = merged["profile"]
    return entry


def main(argv: list[str]) -> None:
    if _CHILD.value:
        report(time_method(_CHILD.value))
        return
    known = ALL_METHODS + list(ALIASES)
    unknown = sorted(
        {v for v in _METHODS.value if parse_variant(ALIASES.get(v, v))[0] not in known}
    )
    if unknown:
        sys.exit(f"error: --methods has unknown name(s) {unknown}; choose from {known}")
    if _ONEDNN.value != "environment":
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if _ONEDNN.value == "on" else "0"
    with load_average() as load:
        runs = children_in_turns(__file__, _METHODS.value, _ROUNDS.value)
    labels = {v: v if v in ALIASES else variant_label(v) for v in _METHODS.value}
    results = {labels[v]: method_entry(rounds, _BATCH.value) for v, rounds in runs.items()}
    first = next(iter(runs.values()))[0]
    for name, entry in results.items():
        print(f"{name}: {entry['step_seconds']:.3f} s/step", file=sys.stderr)
    fastat = results.get("fastat")
    for entry in results.values():
        if fastat:
            entry["ratio_to_fastat"] = entry["step_seconds"] / fastat["step_seconds"]
            entry["memory_ratio_to_fastat"] = entry["step_memory_mb"] / fastat["step_memory_mb"]
    summary = {
        "setting": {
            "model": _MODEL.value,
            "width": _WIDTH.value,
            "batch_size": _BATCH.value,
            "input_shape": [_IMAGE.value, _IMAGE.value, _CHANNELS.value],
            "classes": 10,
            "eps": 8 / 255,
            "optimizer": "SGD, learning rate 0.01, momentum 0.9",
            "device": first["device"],
            "dtype": first["precision"],
            "xla": first["jit_compile"],
            "onednn": first["onednn"],
            "threads": first["tf_threads"] or "TensorFlow's defaults",
            "warmup": _WARMUP.value,
            "repeats": _REPEATS.value,
            "rounds": _ROUNDS.value,
            "machine": machine(),
            "load_average_1min": load,
        },
        "command": command_line(),
        "methods": results,
    }
    markdown = markdown_table(summary)
    profiled = {name: r["profile"] for name, r in results.items() if "profile" in r}
    if profiled:
        from profiles import markdown_table as profile_table

        markdown += "\n\nSeconds per step by kind of operation (TensorFlow's profiler):\n\n"
        markdown += profile_table(profiled)
    publish(markdown, summary, _JSON.value)


def markdown_table(summary: dict) -> str:
    s = summary["setting"]
    onednn = {"1": ", oneDNN on", "0": ", oneDNN off"}.get(s["onednn"], "")
    threads = "" if isinstance(s["threads"], str) else f", {s['threads']} thread(s)"
    heading = (
        f"{s['model']} width {s['width']}, batch {s['batch_size']}, "
        f"{'×'.join(map(str, s['input_shape']))}, {s['device']}, {s['dtype']}, "
        f"XLA {s['xla']}{onednn}{threads}, {describe(s['machine'], s['load_average_1min'])}; "
        f"median of {s['repeats']} steps after {s['warmup']} warm-up"
        + (f", median over {s['rounds']} rounds in turns" if s["rounds"] > 1 else "")
    )

    def cell(value: float | None, digits: int) -> str:
        return "" if value is None else f"{value:.{digits}f}"

    def passes(r: dict) -> str:
        return "" if "passes" not in r else str(sum(r["passes"].values()))

    def spread(r: dict) -> str:
        rounds = r.get("round_step_seconds") or []
        return f"{min(rounds):.3f}–{max(rounds):.3f}" if len(rounds) > 1 else ""

    rows = [
        [
            name,
            passes(r),
            f"{r['step_seconds']:.3f}",
            spread(r),
            f"{r['images_per_second']:.0f}",
            cell(r.get("ratio_to_fastat"), 2),
            r["optimizer_steps_per_batch"],
            f"{r['batch_pass_seconds']:.3f}",
            f"{r['peak_memory_mb']:.0f}",
            f"{r['step_memory_mb']:.0f}",
            cell(r.get("memory_ratio_to_fastat"), 2),
        ]
        for name, r in summary["methods"].items()
    ]
    columns = ["method", "passes per step", "step time (s)", "rounds (s)", "images/s"]
    columns += ["× Fast-AT time", "steps per batch"]
    columns += ["batch pass (s)", "peak memory (MB)", "step memory (MB)", "× Fast-AT step memory"]
    return table(heading, columns, rows)


if __name__ == "__main__":
    app.run(main)
