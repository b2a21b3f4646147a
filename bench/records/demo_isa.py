"""Which settings make README's demo give the same digits: the demo's Fast-BAT run under each
oneDNN instruction-set cap on this machine, beside the recorded run (study/results/demo/).

    python bench/records/demo_isa.py                  # trains 3 runs (about 15 minutes here)
    python bench/records/demo_isa.py --runs=DIR       # keeps them in DIR (reused where there)

oneDNN picks its CPU kernels by the instruction sets it finds (AVX2, AVX-512, VNNI, ...) unless
ONEDNN_MAX_CPU_ISA caps them, and kernels of other sets round differently. Each run is README's
first command with --noexport, under the environment of its setting; the table gives each
epoch's training loss and the final test numbers. Writes bench/results/demo_isa.json and .md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # fbat_tf, run from a checkout without installing it
sys.path.insert(0, os.path.join(ROOT, "bench"))

from harness import publish  # noqa: E402

from fbat_tf.records import RunRecord  # noqa: E402

FLAGFILE = "configs/fashion_mnist_demo.flags"
RECORDED = os.path.join(ROOT, "study", "results", "demo", "fmnist-fastbat", "results.json")
# Each setting: the variables it sets (none: oneDNN's own choice).
SETTINGS = {"default": {}, "AVX512_CORE": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}}
SETTINGS["AVX2"] = {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def run(setting: str, directory: str) -> str:
    """The results.json of the demo under `setting`, trained unless it is there."""
    workdir = os.path.join(directory, setting)
    if not os.path.exists(os.path.join(workdir, "results.json")):
        env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA",)}
        env.update(SETTINGS[setting])
        command = [sys.executable, "train.py", f"--flagfile={FLAGFILE}", "--noexport"]
        subprocess.run([*command, f"--workdir={workdir}"], cwd=ROOT, env=env, check=True)
    return os.path.join(workdir, "results.json")


def numbers(path: str) -> dict:
    record = RunRecord.load(path)
    final = record.final
    return {
        "loss": [epoch.logs["loss"] for epoch in record.history],
        "test_clean": final.clean_accuracy,
        "test_pgd": final.robust_accuracy("pgd"),
        "machine": record.machine,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", help="train into (or reuse) this directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fbat_isa_") as scratch:
        directory = args.runs or scratch
        found = {name: numbers(run(name, directory)) for name in SETTINGS}
    found["recorded"] = numbers(RECORDED)
    lines = [
        "| run | CPU | ISA cap | epoch losses | test clean | test PGD-20 |",
        "|---|---|---|---|---|---|",
    ]
    for name, got in found.items():
        machine = got["machine"] or {}
        cap = (machine.get("kernel_settings") or {}).get("ONEDNN_MAX_CPU_ISA", "–")
        losses = ", ".join(f"{v:.7f}" for v in got["loss"])
        lines.append(
            f"| {name} | {machine.get('cpu', '?')} | {cap} | {losses} | "
            f"{got['test_clean']:.4f} | {got['test_pgd']:.4f} |"
        )
    out = os.path.join(ROOT, "bench", "results", "demo_isa")
    payload = {"command": f"python train.py --flagfile={FLAGFILE}", "runs": found}
    publish("\n".join(lines), payload, f"{out}.json", markdown_path=f"{out}.md")


if __name__ == "__main__":
    main()
