"""Run one measurement per method, each in a fresh Python process, for the bench scripts.

    results = run_per_method(__file__, ["fastat", "fastbat"])   # {method: dict the child printed}
    results = run_per_method(__file__, ["fastat", "fastbat"], rounds=3)   # medians of 3 turns

The child is the same script called with `--child=<method>`; it prints one line
`RESULT <json>`. The parent passes on its own flags except --methods, --json and --rounds.
With several rounds the methods take turns (A B A B A B), so that a slow drift in the machine's
background load hits every method alike, and each number reported is the median over rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

RESULT = "RESULT "


def report(result: dict) -> None:
    """What a child prints for its parent."""
    print(RESULT + json.dumps(result))


def run_per_method(script: str, methods: list[str], rounds: int = 1) -> dict[str, dict]:
    passed = [a for a in sys.argv[1:] if not a.startswith(("--methods", "--json", "--rounds"))]
    turns: dict[str, list[dict]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name in methods:
            turns[name].append(_run_child(script, name, passed))
    return {name: median_of(measured) for name, measured in turns.items()}


def median_of(measured: list[dict]) -> dict:
    """Numbers: the median over rounds; anything else: the first round's value."""
    merged = dict(measured[0])
    for key, value in merged.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            merged[key] = statistics.median(m[key] for m in measured)
    return merged


def _run_child(script: str, name: str, passed: list[str]) -> dict:
    command = [sys.executable, os.path.abspath(script), f"--child={name}", *passed]
    return run_child(command, name, dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def run_child(
    command: list[str], label: str, env: dict[str, str] | None = None, echo: bool = False
) -> dict:
    """Run `command` and return what it printed on its last RESULT line; exit with its stderr
    if it failed. `echo` prints the rest of its standard output."""
    child = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in child.stdout.splitlines() if line.startswith(RESULT)]
    if child.returncode != 0 or not lines:
        sys.exit(f"error: {label} failed:\n{child.stderr[-3000:]}")
    if echo:
        print(child.stdout.replace(lines[-1], "").strip(), flush=True)
    return json.loads(lines[-1][len(RESULT) :])


def write_json(path: str | None, payload: dict) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)
