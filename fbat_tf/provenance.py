"""Which code made a result: the package version and the git revision of the checkout.

    provenance.code()   # {"package": "fbat-tf", "version": "0.1.0", "revision": …, "dirty": …}

results.json, evaluate.py's JSON, the model card and sweep.json carry this block, so that a
committed number can be traced to the code that made it; results.json and evaluate.py's JSON
also carry `machine()` (the processor, its cores and the library versions), since the same
code gives other last digits on another CPU or library build. Outside a git checkout (an installed
wheel, a copied tree) or without git, the revision and the dirty flag are null.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import subprocess
from typing import Any

PACKAGE = "fbat-tf"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def version() -> str | None:
    """The installed package's version, or pyproject.toml's in a checkout run uninstalled."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = os.path.join(ROOT, "pyproject.toml")
    if os.path.isfile(pyproject):
        with open(pyproject) as f:
            match = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), flags=re.MULTILINE)
        if match:
            return match.group(1)
    return None


@functools.cache
def code() -> dict[str, Any]:
    """The code's identity; `dirty` is true when tracked files differ from the revision."""
    revision = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if revision else None
    return {
        "package": PACKAGE,
        "version": version(),
        "revision": revision.strip() if revision else None,
        "dirty": None if status is None else bool(status.strip()),
    }


def package_version(package: str) -> str | None:
    """The installed version of `package`, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The instruction sets oneDNN picks its CPU kernels by (its ISA levels: AVX2, AVX-512 core,
# VNNI, BF16, AMX), as /proc/cpuinfo names them: two CPUs that differ here run other kernels,
# which round differently.
ISA_FLAGS = (
    "avx2",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# The environment that sets which kernels TensorFlow and oneDNN run, how XLA compiles, and how
# many threads split an op's work (a reduction split otherwise rounds otherwise: README's demo
# made tiny ends its second epoch at a loss of 2.3645186 with TensorFlow's two threads on 2
# cores and 2.3645165 with one each, bench/records/threads_digits.py).
KERNEL_VARIABLES = (
    "TF_ENABLE_ONEDNN_OPTS",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "TF_DETERMINISTIC_OPS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "XLA_FLAGS",
    "TF_XLA_FLAGS",
)


def cpu_isa() -> list[str] | None:
    """Which of ISA_FLAGS this CPU has (None where /proc/cpuinfo is not there)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [name for name in ISA_FLAGS if name in have]
    except OSError:
        pass
    return None


@functools.cache
def machine() -> dict[str, Any]:
    """The processor, the instruction sets its kernels are picked by, the kernel settings of
    the environment, the cores there are and this process may use, the platform and the
    versions of Python, TensorFlow, Keras and NumPy (read without importing them)."""
    return {
        "cpu": cpu_model(),
        "cpu_isa": cpu_isa(),
        "kernel_settings": {v: os.environ[v] for v in KERNEL_VARIABLES if v in os.environ},
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        **{name: package_version(name) for name in ("tensorflow", "keras", "numpy")},
    }
