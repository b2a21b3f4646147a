"""Why fbat_tf/onednn.py leaves TensorFlow's oneDNN CPU kernels off for 64×64 datasets: train.py
run again and again on small Tiny-ImageNet and CIFAR-10 folders with the kernels on and off,
counting the runs that crash (a signal instead of an exit code).

    python bench/records/onednn_crash.py --runs=5 --json=bench/results/onednn_crash.json
    python bench/records/onednn_crash.py --method=fastbat --configurations=cifar10:1,cifar10:0 \
        --runs=10 --json=bench/results/onednn_crash_fastbat.json

Each run: PreActResNet-18 at width 2, Fast-AT (or `--method`), one step of batch 4, validation
and the final PGD evaluation on 4 images, in a process of its own, `TF_ENABLE_ONEDNN_OPTS` set
for it. The configurations (dataset:TF_ENABLE_ONEDNN_OPTS) take turns, so a drift in the
machine's load hits each alike.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tarfile
import tempfile

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import ROOT, command_line, load_average, machine, publish, table  # noqa: E402

_RUNS = flags.DEFINE_integer("runs", 5, "Runs per configuration.", lower_bound=1)
_JSON = flags.DEFINE_string("json", None, "Write the results here as JSON.")
_METHOD = flags.DEFINE_string("method", "fastat", "train.py's --method for every run.")
_CONFIGURATIONS = flags.DEFINE_list(
    "configurations",
    ["tiny_imagenet:1", "tiny_imagenet:0", "cifar10:1"],
    "dataset:TF_ENABLE_ONEDNN_OPTS pairs, run in turn.",
)


def write_data(root: str) -> None:
    """A tiny-imagenet-200/ folder (2 classes, 10 training and 4 validation JPEGs) and a
    cifar-10-python.tar.gz (8 images per batch), random pixels, in their published layouts."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    tiny = os.path.join(root, "tiny-imagenet-200")
    wnids = ["n01000001", "n02000002"]
    os.makedirs(os.path.join(tiny, "val", "images"))
    with open(os.path.join(tiny, "wnids.txt"), "w") as f:
        f.write("\n".join(wnids) + "\n")

    def jpeg(path: str) -> None:
        image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
        with open(path, "wb") as f:
            f.write(tf.io.encode_jpeg(image).numpy())

    for wnid in wnids:
        folder = os.path.join(tiny, "train", wnid, "images")
        os.makedirs(folder)
        for i in range(10):
            jpeg(os.path.join(folder, f"{wnid}_{i}.JPEG"))
    lines = []
    for i in range(4):
        jpeg(os.path.join(tiny, "val", "images", f"val_{i}.JPEG"))
        lines.append(f"val_{i}.JPEG\t{wnids[i % 2]}\t0\t0\t63\t63")
    with open(os.path.join(tiny, "val", "val_annotations.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")

    batches = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(batches)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        images = rng.integers(0, 256, (8, 3, 32, 32), dtype=np.uint8)
        batch = {b"data": images.reshape(8, -1), b"labels": rng.integers(0, 10, 8).tolist()}
        with open(os.path.join(batches, name), "wb") as f:
            pickle.dump(batch, f, protocol=2)
    with tarfile.open(os.path.join(root, "cifar-10-python.tar.gz"), "w:gz") as tar:
        tar.add(batches, arcname="cifar-10-batches-py")


def run_once(data_dir: str, dataset: str, onednn: str, workdir: str, method: str):
    """train.py's exit code, negative for the signal that ended it, and the last line it wrote
    to stderr where it failed."""
    command = [
        sys.executable,
        os.path.join(ROOT, "train.py"),
        f"--dataset={dataset}",
        f"--data_dir={data_dir}",
        "--nodownload",
        "--model=preact_resnet18",
        "--width=2",
        f"--method={method}",
        "--epochs=1",
        "--steps_per_epoch=1",
        "--batch_size=4",
        "--val_examples=4",
        "--val_attack_steps=1",
        "--eval_examples=4",
        "--eval_pgd_steps=1",
        "--noeval_autoattack",
        "--tensorboard_every=0",
        "--noexport",
        f"--workdir={workdir}",
    ]
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    said = [line for line in done.stderr.splitlines() if line.strip()]
    return done.returncode, (said[-1] if done.returncode and said else None)


def main(argv):
    del argv
    configurations = []
    for given in _CONFIGURATIONS.value:
        dataset, _, onednn = given.partition(":")
        if dataset not in ("tiny_imagenet", "cifar10") or onednn not in ("0", "1"):
            raise app.UsageError(f"--configurations: {given!r} is not dataset:0 or dataset:1")
        configurations.append((dataset, onednn))
    counts = {f"{d} oneDNN {'on' if o == '1' else 'off'}": [] for d, o in configurations}
    failures: dict[str, list[str]] = {name: [] for name in counts}
    with tempfile.TemporaryDirectory() as data_dir, load_average() as load:
        write_data(data_dir)
        for i in range(_RUNS.value):
            for (dataset, onednn), name in zip(configurations, counts, strict=True):
                workdir = os.path.join(data_dir, f"run-{dataset}-{onednn}-{i}")
                code, said = run_once(data_dir, dataset, onednn, workdir, _METHOD.value)
                counts[name].append(code)
                if said is not None:
                    failures[name].append(f"run {i + 1}: {said}")
    rows = []
    for name, codes in counts.items():
        crashes = [c for c in codes if c < 0]
        signals = sorted({signal.Signals(-c).name for c in crashes})
        rows.append([name, len(codes), len(crashes), ", ".join(signals) or "–"])
    markdown = table(None, ["configuration", "runs", "crashed", "signals"], rows)
    payload = {
        "command": command_line(),
        "method": _METHOD.value,
        "machine": machine(),
        "load_average_1min": load,
        "exit_codes": counts,
        "failures": failures,
    }
    publish(markdown, payload, _JSON.value)


if __name__ == "__main__":
    app.run(main)
