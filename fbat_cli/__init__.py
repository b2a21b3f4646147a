"""fbat-tf's programs: train, evaluate and sweep (this package), export and the serving client
(export/), as the checkout's top-level scripts (`python train.py`) and, installed, as console
scripts (`fbat-train`, pyproject.toml) running the same code.

    configs()                     # the shipped flag files and sweep definitions
    flagfile("fashion_mnist_demo")  # a shipped flag file's path, by name
"""

from __future__ import annotations

import importlib
import os

HERE = os.path.dirname(os.path.abspath(__file__))
# Where the programs run from a clone: its top-level folder (None where they are installed).
CHECKOUT = os.path.dirname(HERE) if os.path.isfile(os.path.join(HERE, "..", "train.py")) else None


def configs() -> str:
    """The folder of the shipped configurations (flag files, sweeps/ of sweep definitions): a
    clone's configs/, else the copy installed as fbat_cli/configs (pyproject.toml's package
    data, built through the clone's link fbat_cli/configs to configs/)."""
    if CHECKOUT is not None:
        return os.path.join(CHECKOUT, "configs")
    return os.path.join(HERE, "configs")


def flagfile(name: str) -> str | None:
    """The path of the shipped flag file `name` (with or without .flags), or None."""
    path = os.path.join(configs(), name if name.endswith(".flags") else f"{name}.flags")
    return path if os.path.isfile(path) else None


def shipped_flagfiles(argv: list[str]) -> list[str]:
    """`argv` with each --flagfile=NAME that names no file but a shipped flag file given that
    file's path: `fbat-train --flagfile=fashion_mnist_demo` runs the demo from anywhere."""
    out = []
    for word in argv:
        flag, _, value = word.partition("=")
        if flag in ("--flagfile", "-flagfile") and value and not os.path.exists(value):
            shipped = flagfile(value) if os.sep not in value else None
            word = f"{flag}={shipped}" if shipped else word
        out.append(word)
    return out


def _run(module: str) -> None:
    importlib.import_module(module).run_program()


# The console scripts (pyproject.toml), named apart from the modules they run.
def train_main() -> None:
    """`fbat-train`: train.py."""
    _run("fbat_cli.train")


def evaluate_main() -> None:
    """`fbat-evaluate`: evaluate.py."""
    _run("fbat_cli.evaluate")


def sweep_main() -> None:
    """`fbat-sweep`: sweep.py."""
    _run("fbat_cli.sweep")


def export_main() -> None:
    """`fbat-export`: python -m export."""
    _run("export.__main__")


def serve_client_main() -> None:
    """`fbat-serve-client`: python -m export.client."""
    _run("export.client")
