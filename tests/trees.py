"""A copy of the project's code for a test to change: a new module, a registry line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def project_copy(directory, definitions: dict[str, dict] | None = None) -> str:
    """The library, the flags, the export and study packages and the entry points copied to
    `directory`/tree, with these sweep definitions in its configs/sweeps/. Not a git checkout: a
    sweep runs it as it is with --allow_dirty, which its report marks."""
    tree = os.path.join(str(directory), "tree")
    ignore = shutil.ignore_patterns("__pycache__")
    for package in ("fbat_tf", "fbat_cli", "flags", "export", "study"):
        # The study's code and definitions without its committed results (over 100 MB): a sweep
        # in the copy writes to the copy's own results/.
        skip = shutil.ignore_patterns("__pycache__", "results") if package == "study" else ignore
        shutil.copytree(os.path.join(ROOT, package), os.path.join(tree, package), ignore=skip)
    for program in ("train.py", "evaluate.py", "sweep.py"):
        shutil.copy(os.path.join(ROOT, program), os.path.join(tree, program))
    configs = os.path.join(tree, "configs", "sweeps")
    os.makedirs(configs)
    for name, definition in (definitions or {}).items():
        with open(os.path.join(configs, f"{name}.json"), "w") as f:
            json.dump(definition, f)
    return tree


def run_sweep(
    tree: str, *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    """sweep.py with `args` run in the copy, as it is (--allow_dirty), importing the copy."""
    env = dict(env or os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(tree))
    return subprocess.run(
        [sys.executable, "sweep.py", "--allow_dirty", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
