"""What the wheel declares: every package outside the standard library that the installed code
imports is a dependency of fbat-tf or of one of its extras, or comes with one (grpcio with
tensorflow-serving-api). tests/test_installed.py installs the wheel beside the packages
already here, so this is what tells a dependency missing from pyproject.toml."""

from __future__ import annotations

import ast
import glob
import importlib.metadata as metadata
import os
import re
import sys

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The wheel's packages (pyproject.toml).
INSTALLED = ("fbat_tf", "fbat_cli", "export", "flags", "study")


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized ("tensorflow[and-cuda]>=2.21": tensorflow)."""
    return re.split(r"[<>=!~;\[ (]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _imported() -> dict[str, set[str]]:
    """Top-level modules the installed packages import (also inside functions), by file."""
    found: dict[str, set[str]] = {}
    for package in INSTALLED:
        for path in glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True):
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                if isinstance(node, ast.Import):
                    names = [alias.name.split(".")[0] for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module.split(".")[0]]
                else:
                    continue
                for name in names:
                    if name not in INSTALLED and name not in sys.stdlib_module_names:
                        found.setdefault(name, set()).add(os.path.relpath(path, ROOT))
    found.pop("__future__", None)
    return found


def test_every_third_party_import_is_a_declared_dependency():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for extra in project["optional-dependencies"].values() for r in extra}
    # What a declared distribution brings with it, one level down.
    brought = {
        _name(r) for name in declared for r in (_requires(name) or []) if "extra ==" not in r
    }
    providers = metadata.packages_distributions()
    undeclared = {
        module: sorted(files)
        for module, files in _imported().items()
        if not {_name(d) for d in providers.get(module, [module])} & (declared | brought)
    }
    assert not undeclared, undeclared
    assert "tensorflow" in _imported() and "ray" in _imported()  # the scan sees imports


def _requires(name: str) -> list[str] | None:
    try:
        return metadata.requires(name)
    except metadata.PackageNotFoundError:
        return None
