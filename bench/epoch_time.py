"""Time one training epoch of each method through the training library, beside the input
pipeline's own throughput, on real Fashion-MNIST (Debian's dataset-fashion-mnist).

    python bench/epoch_time.py --methods=fastat,fastbat --max_train_examples=10000 \
        --json=bench/results/epoch_time.json

Each method trains for one epoch in its own child process (a fresh TensorFlow, a temporary
workdir, robust validation on 100 examples, no final AutoAttack) and reports the epoch time and
images/s that the run's results.json records; the epoch time includes the per-epoch robust
validation. The pipeline row iterates the same training split (shuffle, batching, prefetch)
without a model: if its images/s is far above every method's, the input never starves the step.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from absl import app, flags
from harness import (
    command_line,
    define_rounds,
    describe,
    load_average,
    machine,
    publish,
    report,
    run_per_method,
    table,
)

from fbat_tf import methods  # noqa: E402  (harness puts the checkout on the path)

ALL_METHODS = methods.names()

_METHODS = flags.DEFINE_list("methods", ALL_METHODS, "Methods to time.")
_DATASET = flags.DEFINE_string("dataset", "fashion_mnist", "Dataset.")
_MODEL = flags.DEFINE_string("model", "small_cnn", "Architecture.")
_WIDTH = flags.DEFINE_integer("width", 16, "Base width.")
_BATCH = flags.DEFINE_integer("batch_size", 128, "Batch size.")
_EXAMPLES = flags.DEFINE_integer("max_train_examples", 10000, "Training examples per epoch.")
_JIT = flags.DEFINE_enum("jit_compile", "auto", ["auto", "true", "false"], "XLA.")
_ONEDNN = flags.DEFINE_bool(
    "onednn",
    True,
    "TF_ENABLE_ONEDNN_OPTS for the children: 1 as train.py sets it by default, or 0.",
)
_ROUNDS = define_rounds()
_JSON = flags.DEFINE_string("json", None, "Write the results here.")
_CHILD = flags.DEFINE_string("child", None, "Internal: train this method one epoch, print JSON.")


def train_one_epoch(method: str) -> dict:
    from fbat_tf import device
    from fbat_tf.training import TrainConfig, train

    with tempfile.TemporaryDirectory() as workdir:
        config = TrainConfig(
            workdir=workdir,
            method=method,
            dataset=_DATASET.value,
            model=_MODEL.value,
            width=_WIDTH.value,
            epochs=1,
            batch_size=_BATCH.value,
            max_train_examples=_EXAMPLES.value,
            val_examples=100,
            eval_examples=100,
            eval_pgd_steps=1,
            eval_pgd_restarts=1,
            eval_autoattack=False,
            jit_compile=device.resolve_jit_compile(_JIT.value),
            download=False,
            verbose=0,
            # Free-AT divides epochs by its replays: one of its epochs is m passes.
            method_options={"replays": 1} if method == "free" else {},
        )
        record = train(config)
    epoch = record.history[0]
    return {
        "epoch_time_s": epoch.seconds,
        "images_per_s": epoch.get("images_per_second"),
        "device": record.device,
    }


def pipeline_throughput() -> float:
    from fbat_tf import data

    dataset = data.load(
        _DATASET.value,
        "train",
        batch_size=_BATCH.value,
        max_examples=_EXAMPLES.value,
        download=False,
    )
    for _ in dataset.take(2):  # warm-up: decoding into memory, first shuffle buffer
        pass
    start, images = time.perf_counter(), 0
    for x, _ in dataset:
        images += int(x.shape[0])
    return images / (time.perf_counter() - start)


def main(argv: list[str]) -> None:
    if _CHILD.value:
        report(train_one_epoch(_CHILD.value))
        return
    unknown = sorted(set(_METHODS.value) - set(ALL_METHODS))
    if unknown:
        sys.exit(f"error: --methods has unknown name(s) {unknown}; choose from {ALL_METHODS}")
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if _ONEDNN.value else "0"  # the children's
    with load_average() as load:
        results, device = run_per_method(__file__, _METHODS.value, _ROUNDS.value), ""
    for name, measured in results.items():
        device = measured.pop("device")
        print(f"{name}: {measured['epoch_time_s']:.1f} s/epoch", file=sys.stderr)
    summary = {
        "device": device,
        "dataset": _DATASET.value,
        "model": f"{_MODEL.value} width {_WIDTH.value}",
        "batch_size": _BATCH.value,
        "train_examples": _EXAMPLES.value,
        "onednn": _ONEDNN.value,
        "rounds": _ROUNDS.value,
        "command": command_line(),
        "machine": machine(),
        "load_average_1min": load,
        "pipeline_images_per_s": pipeline_throughput(),
        "results": results,
    }
    publish(markdown_table(summary), summary, _JSON.value)


def markdown_table(summary: dict) -> str:
    heading = (
        f"{summary['dataset']}, {summary['model']}, batch {summary['batch_size']}, "
        f"{summary['train_examples']} training examples, {summary['device']}, "
        f"oneDNN {'on' if summary['onednn'] else 'off'}, "
        + describe(summary["machine"], summary["load_average_1min"])
    )
    rows = [["input pipeline alone", "", f"{summary['pipeline_images_per_s']:.0f}"]]
    for name, r in summary["results"].items():
        rows.append([name, f"{r['epoch_time_s']:.1f}", f"{r['images_per_s']:.0f}"])
    return table(heading, ["what", "epoch time (s)", "images/s"], rows)


if __name__ == "__main__":
    app.run(main)
