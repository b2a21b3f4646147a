"""What `import tensorflow` costs in CPU with each ml_dtypes version: why the dev extra holds
ml_dtypes below 0.7 (BUILD.md, "Tests").

    python bench/records/ml_dtypes_import.py --pythons=/path/a/python,/path/b/python --rounds=5

Each interpreter (default: this one) is an environment with TensorFlow and one ml_dtypes
version; the environments take turns (A B A B ...), each import in a fresh process, and the
table gives the median CPU seconds (user + system) of `import ml_dtypes` alone and of
`import tensorflow`. Writes bench/results/ml_dtypes_import.json and .md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from harness import publish_taking_turns  # noqa: E402

# The child reports its own CPU after the import (resource: user + system of the process).
PROBE = """
import resource, sys
import {module}
import ml_dtypes
usage = resource.getrusage(resource.RUSAGE_SELF)
print(ml_dtypes.__version__, usage.ru_utime + usage.ru_stime)
"""


def measure(python: str, module: str) -> tuple[str, float]:
    done = subprocess.run(
        [python, "-c", PROBE.format(module=module)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    version, seconds = done.stdout.split()[-2:]
    return version, float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pythons", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench/results/ml_dtypes_import.json"))
    args = parser.parse_args()
    pythons = args.pythons.split(",")
    found = {p: {"ml_dtypes": [], "tensorflow": []} for p in pythons}
    versions = {}
    for _ in range(args.rounds):
        for python in pythons:
            for module in ("ml_dtypes", "tensorflow"):
                versions[python], seconds = measure(python, module)
                found[python][module].append(seconds)
    rows = [
        {
            "python": python,
            "ml_dtypes": versions[python],
            "import_ml_dtypes_cpu_s": statistics.median(found[python]["ml_dtypes"]),
            "import_tensorflow_cpu_s": statistics.median(found[python]["tensorflow"]),
            "runs": found[python],
        }
        for python in pythons
    ]
    table = [
        "| ml_dtypes | `import ml_dtypes`, CPU s | `import tensorflow`, CPU s |",
        "|---|---|---|",
        *(
            f"| {r['ml_dtypes']} | {r['import_ml_dtypes_cpu_s']:.2f} "
            f"| {r['import_tensorflow_cpu_s']:.2f} |"
            for r in rows
        ),
    ]
    publish_taking_turns(table, rows, args.rounds, "environments", args.json)


if __name__ == "__main__":
    main()
