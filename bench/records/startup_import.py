"""What loading TensorFlow costs a program in CPU, with and without Keras's optional IPython
and matplotlib.pyplot imports: why startup.load_tensorflow keeps them out (docs/DESIGN.md §7).

    python bench/records/startup_import.py --rounds=8

Each load runs in a fresh process, the two settings taking turns (A B A B ...): as the
entry points load TensorFlow (startup.load_tensorflow), and the same with nothing kept out.
The table gives the median CPU seconds (user + system) of the process once TensorFlow has
loaded and found its devices. Writes bench/results/startup_import.json and .md.
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

# The child reports its own CPU once TensorFlow is loaded, and which of the two modules it holds.
PROBE = """
import resource, sys
from fbat_tf import startup
startup.UNUSED_BY_KERAS_HERE = {kept_out!r}
startup.load_tensorflow()
usage = resource.getrusage(resource.RUSAGE_SELF)
loaded = [name for name in ("IPython", "matplotlib.pyplot") if name in sys.modules]
print(",".join(loaded) or "-", usage.ru_utime + usage.ru_stime)
"""
SETTINGS = {
    "as the entry points load it": ("IPython", "matplotlib.pyplot"),
    "nothing kept out": (),
}


def measure(kept_out: tuple[str, ...]) -> tuple[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(kept_out=kept_out)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT),
    )
    loaded, seconds = done.stdout.split()[-2:]
    return loaded, float(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", default=os.path.join(ROOT, "bench/results/startup_import.json"))
    args = parser.parse_args()
    found: dict[str, list[float]] = {name: [] for name in SETTINGS}
    loaded: dict[str, str] = {}
    for _ in range(args.rounds):
        for name, kept_out in SETTINGS.items():
            loaded[name], seconds = measure(kept_out)
            found[name].append(seconds)
    rows = [
        {
            "setting": name,
            "kept_out": list(SETTINGS[name]),
            "loaded_after": loaded[name],
            "cpu_s": statistics.median(found[name]),
            "runs": found[name],
        }
        for name in SETTINGS
    ]
    table = [
        "| TensorFlow loaded | also loaded | CPU s |",
        "|---|---|---|",
        *(f"| {r['setting']} | {r['loaded_after']} | {r['cpu_s']:.2f} |" for r in rows),
    ]
    publish_taking_turns(table, rows, args.rounds, "settings", args.json)


if __name__ == "__main__":
    main()
