"""The TF-Serving model base path: `<export_dir>/<name>/<version>/`, checked without TensorFlow.

    from export import versions

    versions.check_name("fashion_mnist-small_cnn-fastbat")       # or ValueError
    versions.next_version("runs/demo/export/fashion_mnist-small_cnn-fastbat")   # 1 when empty
    path = versions.free_version_dir("runs/demo/export", "fmnist", 3)   # or FileExistsError

TF-Serving watches `<export_dir>/<name>/` and serves the highest version, which is any child whose
name is a decimal integer ("007" is version 7); it ignores every other child. This module imports
neither TensorFlow nor fbat_tf, so the command line can check its flags in a fraction of a second.
"""

from __future__ import annotations

import os
import re

# A model name is one URL path segment of the REST API (/v1/models/<name>:predict): no "/" or ":".
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(name: str) -> str:
    """Returns `name` if it is a valid TF-Serving model name, else raises ValueError."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"model name {name!r} must be letters, digits, '.', '_' or '-' (starting with a "
            "letter or digit): it is a path segment of the REST URL /v1/models/<name>:predict"
        )
    return name


def check_version(version: int) -> int:
    """Returns `version` if it is a non-negative integer (TF-Serving versions are int64)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be a non-negative integer, got {version!r}")
    return version


def run_name(dataset: str, model: str, method: str) -> str:
    """The default model name of a training run: `<dataset>-<model>-<method>`."""
    return check_name(f"{dataset}-{model}-{method}")


def existing_versions(model_root: str) -> set[int]:
    """The versions TF-Serving would see under `model_root` (empty if it does not exist)."""
    if not os.path.isdir(model_root):
        return set()
    return {int(entry) for entry in os.listdir(model_root) if entry.isdigit()}


def next_version(model_root: str) -> int:
    """One above the highest existing version (1 for none), so TF-Serving serves the new one."""
    return max(existing_versions(model_root), default=0) + 1


def free_version_dir(export_dir: str, name: str, version: int | None) -> tuple[str, int]:
    """(path, version) of the version directory an export would create.

    `version=None` picks `next_version`. Raises FileExistsError if the version exists in any
    spelling ("3" or "003"): an export never replaces a version a server may be serving.
    """
    model_root = os.path.join(export_dir, check_name(name))
    if version is None:
        version = next_version(model_root)
    check_version(version)
    if version in existing_versions(model_root):
        raise FileExistsError(
            f"version {version} of {name!r} already exists in {model_root}; versions are never "
            f"overwritten: pick another (next free: {next_version(model_root)}) or remove it"
        )
    return os.path.join(model_root, str(version)), version
