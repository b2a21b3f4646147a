"""Re-checking the demo model's three exported files: three evaluate.py commands, one a file,
against one command over all three, which crafts the source's attacks once.

    python bench/records/recheck_once.py                 # the committed run, 256 test images
    python bench/records/recheck_once.py --n_examples=16 # a quick look

Exports the committed demo run (study/results/deploy/fmnist-fastbat, as bench/records/deploy_demo.py
does) into a temporary folder, then times, as a user types them, `python evaluate.py
--model_path=<file> --n_examples=N` for model.onnx, model.tflite and model_int8.tflite one after
the other, and `python evaluate.py --model_path=<the three, comma-separated> --n_examples=N`,
each way with the machine's load average before and after. Each file's evaluation must come out
the same both ways (its accuracies and every point's outcome under each attack); the script
stops otherwise. Writes bench/results/recheck_once.json and .md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from deploy_demo import DEMO, FILES, export  # noqa: E402
from harness import command_line, load_average, machine, publish, table  # noqa: E402

from fbat_tf.records import EvaluationResult  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results")


def timed(paths: list[str], n_examples: int) -> tuple[float, dict]:
    """The wall time of one evaluate.py command over `paths`, and the machine's load."""
    command = [sys.executable, "evaluate.py", "--model_path=" + ",".join(paths)]
    command.append(f"--n_examples={n_examples}")
    with load_average() as load:
        start = time.perf_counter()
        subprocess.run(command, cwd=ROOT, check=True)
        seconds = time.perf_counter() - start
    return seconds, load


def results_of(version: str, keep: str) -> dict[str, dict]:
    """Each file's evaluation (its examples, accuracies and per-point outcomes), its JSON moved
    from beside the file into `keep`, so that the next command may write its own."""
    found = {}
    for name in FILES:
        path = os.path.join(version, f"eval-test-{name.replace('.', '_')}.json")
        result = EvaluationResult.load(path)
        found[name] = {
            "examples": result.examples,
            "accuracies": result.accuracies(),
            "outcomes": dict(result.outcomes),
        }
        shutil.move(path, os.path.join(keep, os.path.basename(path)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", default=DEMO, help="the run to export and check")
    parser.add_argument("--n_examples", type=int, default=256, help="test images attacked")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="recheck_once_")
    try:
        version = export(args.workdir, os.path.join(directory, "export"))
        paths = [os.path.join(version, name) for name in FILES]
        ways = {}
        found = {}
        for way, commands in (
            ("one command a file", [[p] for p in paths]),
            ("one command", [paths]),
        ):
            keep = os.path.join(directory, way.replace(" ", "_"))
            os.makedirs(keep)
            measured = [timed(command, args.n_examples) for command in commands]
            ways[way] = {
                "commands": len(commands),
                "seconds": sum(seconds for seconds, _ in measured),
                "load": [load for _, load in measured],
            }
            found[way] = results_of(version, keep)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    apart, together = found.values()
    for name in FILES:
        if apart[name] != together[name]:
            sys.exit(
                f"error: {name}: the two ways disagree: {apart[name]} against {together[name]}"
            )
    first = ways["one command a file"]["seconds"]
    payload = {
        "command": command_line(),
        "machine": machine(),
        "workdir": os.path.relpath(os.path.abspath(args.workdir), ROOT),
        "n_examples": args.n_examples,
        "files": list(FILES),
        "ways": ways,
        "identical_results": True,
        "accuracies": {name: together[name]["accuracies"] for name in FILES},
    }
    rows = [
        [
            way,
            str(measured["commands"]),
            f"{measured['seconds']:.0f}",
            f"{measured['seconds'] / first:.2f}",
        ]
        for way, measured in ways.items()
    ]
    heading = (
        f"Re-checking {', '.join(FILES)} on the first {args.n_examples} test images (each "
        "file's results identical both ways)"
    )
    markdown = table(heading, ["way", "commands", "wall time (s)", "ratio"], rows)
    publish(
        markdown,
        payload,
        os.path.join(OUT, "recheck_once.json"),
        markdown_path=os.path.join(OUT, "recheck_once.md"),
    )


if __name__ == "__main__":
    main()
