"""Run one measurement per method, each in a fresh Python process, for the bench scripts.

    results = run_per_method(__file__, ["fastat", "fastbat"])   # {method: dict the child printed}

The child is the same script called with `--child=<method>`; it prints one line
`RESULT <json>`. The parent passes on its own flags except --methods and --json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

RESULT = "RESULT "


def report(result: dict) -> None:
    """What a child prints for its parent."""
    print(RESULT + json.dumps(result))


def run_per_method(script: str, methods: list[str]) -> dict[str, dict]:
    passed = [a for a in sys.argv[1:] if not a.startswith(("--methods", "--json"))]
    results = {}
    for name in methods:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        child = subprocess.run(
            [sys.executable, os.path.abspath(script), f"--child={name}", *passed],
            capture_output=True,
            text=True,
            env=env,
        )
        lines = [line for line in child.stdout.splitlines() if line.startswith(RESULT)]
        if child.returncode != 0 or not lines:
            sys.exit(f"error: {name} failed:\n{child.stderr[-3000:]}")
        results[name] = json.loads(lines[-1][len(RESULT) :])
    return results


def write_json(path: str | None, payload: dict) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)
