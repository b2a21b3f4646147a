"""Time one optimizer step of each training method on the same model, batch and device.

    python bench/step_time.py --model=preact_resnet18 --width=16 --batch_size=64 \
        --image_size=32 --jit_compile=true --precision=float32 --json=bench/results/step_time.json

Each method runs in its own child process (so that its peak memory is its own), one after the
other on the same machine: build the model and `AdversarialTrainer`, warm up (tracing and XLA
compilation), then time `--repeats` steps of `train_on_batch`, which returns numbers and so
waits for the step to finish. Reports the median step time, images/s and peak memory (GPU: the
allocator's peak; CPU: the child's peak resident set, and what the steps added to the resident
set of the built process), the ratios to Fast-AT, writes JSON and prints a Markdown table.
`--profile_steps=N` then runs N more steps under TensorFlow's profiler and adds the kernel time
per kind of operation (bench/profiles.py) to each method's numbers; use it without XLA.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from children import report, run_per_method, write_json  # noqa: E402

ALL_METHODS = ["standard", "fastat", "fastat_ga", "pgd", "free", "fastbat"]
# Fast-BAT with each implicit_autodiff mode named explicitly ("fastbat" itself is "auto").
VARIANTS = {
    "fastbat_bob": ("fastbat", {"implicit_autodiff": "backward_over_backward"}),
    "fastbat_fob": ("fastbat", {"implicit_autodiff": "forward_over_backward"}),
}

_METHODS = flags.DEFINE_list(
    "methods",
    ALL_METHODS,
    "Methods to time; fastbat_bob and fastbat_fob are Fast-BAT with implicit_autodiff "
    "backward_over_backward and forward_over_backward.",
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
_REPEATS = flags.DEFINE_integer("repeats", 20, "Timed steps.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps first.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 1, "Child processes per method, taking turns; numbers are medians.", lower_bound=1
)
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


def _resident_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def time_method(method_name: str) -> dict:
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
    name, options = VARIANTS.get(method_name, (method_name, {}))
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
    resident_before = _resident_mb()
    for _ in range(_WARMUP.value):
        trainer.train_on_batch(x, y)
    gpu = tf.config.list_physical_devices("GPU")
    if gpu:
        tf.config.experimental.reset_memory_stats("GPU:0")
    times = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        trainer.train_on_batch(x, y)  # returns numpy logs: the step has finished
        times.append(time.perf_counter() - start)
    if gpu:
        peak_mb = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
        step_mb = peak_mb
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        # What the steps added to the process built so far (model, data, TF runtime).
        step_mb = peak_mb - resident_before
    # Free-AT takes m optimizer steps per call; report the time of one optimizer step.
    step = statistics.median(times) / method.replays
    profile = {}
    if _PROFILE.value:
        from profiles import tf_profile

        profile = {"profile": tf_profile(lambda: trainer.train_on_batch(x, y), _PROFILE.value)}
    return {
        **profile,
        "step_time_s": step,
        "images_per_s": _BATCH.value / step,
        "peak_memory_mb": peak_mb,
        "step_memory_mb": step_mb,
        "device": device.describe(),
        "precision": precision,
        "jit_compile": device.resolve_jit_compile(_JIT.value),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "tf_threads": _THREADS.value or None,
    }


def main(argv: list[str]) -> None:
    if _CHILD.value:
        report(time_method(_CHILD.value))
        return
    known = ALL_METHODS + list(VARIANTS)
    unknown = sorted(set(_METHODS.value) - set(known))
    if unknown:
        sys.exit(f"error: --methods has unknown name(s) {unknown}; choose from {known}")
    results, meta = run_per_method(__file__, _METHODS.value, _ROUNDS.value), {}
    for name, measured in results.items():
        meta = {
            k: measured.pop(k)
            for k in ("device", "precision", "jit_compile", "tensorflow", "keras")
        }
        print(f"{name}: {measured['step_time_s']:.3f} s/step", file=sys.stderr)
    reference = results.get("fastat", {}).get("step_time_s")
    summary = {
        **meta,
        "model": f"{_MODEL.value} width {_WIDTH.value}",
        "batch_size": _BATCH.value,
        "image_size": _IMAGE.value,
        "repeats": _REPEATS.value,
        "rounds": _ROUNDS.value,
        "command": "python bench/step_time.py " + " ".join(sys.argv[1:]),
        "results": results,
        "ratio_to_fastat": {name: r["step_time_s"] / reference for name, r in results.items()}
        if reference
        else {},
    }
    if reference and "fastat" in results:
        fastat_memory = results["fastat"]["step_memory_mb"]
        summary["memory_ratio_to_fastat"] = {
            name: r["step_memory_mb"] / fastat_memory for name, r in results.items()
        }
    print(markdown_table(summary))
    profiled = {name: r["profile"] for name, r in results.items() if "profile" in r}
    if profiled:
        from profiles import markdown_table as profile_table

        print("\nSeconds per step by kind of operation (TensorFlow's profiler):\n")
        print(profile_table(profiled))
    write_json(_JSON.value, summary)


def markdown_table(summary: dict) -> str:
    lines = [
        f"{summary['model']}, batch {summary['batch_size']}, {summary['image_size']}px, "
        f"{summary['device']}, {summary['precision']}, XLA {summary['jit_compile']}, "
        f"TF {summary['tensorflow']}, Keras {summary['keras']}; "
        f"median of {summary['repeats']} steps"
        + (
            f", median over {summary['rounds']} alternating rounds" if summary["rounds"] > 1 else ""
        ),
        "",
        "| method | step time (s) | images/s | peak memory (MB) | step memory (MB) "
        "| × Fast-AT time | × Fast-AT step memory |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in summary["results"].items():
        ratio = summary["ratio_to_fastat"].get(name)
        memory = summary.get("memory_ratio_to_fastat", {}).get(name)
        lines.append(
            f"| {name} | {r['step_time_s']:.3f} | {r['images_per_s']:.0f} | "
            f"{r['peak_memory_mb']:.0f} | {r['step_memory_mb']:.0f} | "
            f"{'' if ratio is None else f'{ratio:.2f}'} | "
            f"{'' if memory is None else f'{memory:.2f}'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    app.run(main)
