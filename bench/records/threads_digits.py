"""Whether TensorFlow's thread counts move a run's last digits: why results.json records
TF_NUM_INTRAOP_THREADS and TF_NUM_INTEROP_THREADS among its kernel settings (provenance.py).

    python bench/records/threads_digits.py           # two tiny runs, about half a minute here

README's demo run made tiny (Fast-BAT on real Fashion-MNIST, small_cnn at width 4, two epochs
of 256 images), once with TensorFlow's own thread counts (one per core) and once with one
thread each, as the test suite runs its programs. The table gives each epoch's training loss
and Fast-BAT's implicit-term ratio to all their digits, and whether they are equal. Writes
bench/results/threads_digits.json and .md.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # fbat_tf, run from a checkout without installing it
sys.path.insert(0, os.path.join(ROOT, "bench"))

from harness import publish  # noqa: E402

from fbat_tf.records import RunRecord  # noqa: E402

# README's demo command, made tiny: two epochs of 256 images at width 4, tested on 16.
RUN = ["--flagfile=configs/fashion_mnist_demo.flags", "--width=4", "--epochs=2"]
RUN += ["--max_train_examples=256", "--val_examples=64", "--eval_examples=16", "--noexport"]
THREADS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
SETTINGS = {"TensorFlow's own": {}, "one thread each": dict.fromkeys(THREADS, "1")}


def trained(setting: str, directory: str) -> dict:
    workdir = os.path.join(directory, str(list(SETTINGS).index(setting)))
    env = {k: v for k, v in os.environ.items() if k not in THREADS}
    env.update(SETTINGS[setting], TF_CPP_MIN_LOG_LEVEL="3")
    command = [sys.executable, "train.py", *RUN, f"--workdir={workdir}"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    record = RunRecord.load(os.path.join(workdir, "results.json"))
    machine = record.machine or {}
    return {
        "loss": [epoch.get("loss") for epoch in record.history],
        "ig_norm_ratio": [epoch.get("ig_norm_ratio") for epoch in record.history],
        "kernel_settings": machine.get("kernel_settings", {}),
        "cpus_usable": machine.get("cpus_usable"),
    }


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="fbat_threads_") as scratch:
        found = {name: trained(name, scratch) for name in SETTINGS}
    lines = [
        "| threads | cores | kernel settings recorded | epoch losses | epoch ig_norm_ratio |",
        "|---|---|---|---|---|",
    ]
    for name, got in found.items():
        settings = ", ".join(f"{k}={v}" for k, v in got["kernel_settings"].items()) or "–"
        losses = ", ".join(repr(v) for v in got["loss"])
        ratios = ", ".join(repr(v) for v in got["ig_norm_ratio"])
        lines.append(f"| {name} | {got['cpus_usable']} | {settings} | {losses} | {ratios} |")
    own, one = found.values()
    equal = own["loss"] == one["loss"] and own["ig_norm_ratio"] == one["ig_norm_ratio"]
    lines += ["", f"Every digit equal: {'yes' if equal else 'no'}."]
    payload = {"command": " ".join(["python train.py", *RUN]), "runs": found, "equal": equal}
    out = os.path.join(ROOT, "bench", "results", "threads_digits")
    publish("\n".join(lines), payload, f"{out}.json", markdown_path=f"{out}.md")


if __name__ == "__main__":
    main()
