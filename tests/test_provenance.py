"""Every result file names the code that made it: version, git revision and a dirty flag."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRINT_CODE = "import json; from fbat_tf import provenance; print(json.dumps(provenance.code()))"


def _git(cwd, *args) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def _code_in(tree) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PRINT_CODE],
        cwd=tree,
        env=dict(os.environ, PYTHONPATH=str(tree)),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout)


def test_code_names_the_revision_and_whether_tracked_files_changed(tmp_path):
    tree = tmp_path / "checkout"
    shutil.copytree(os.path.join(ROOT, "fbat_tf"), tree / "fbat_tf")
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tree / "pyproject.toml")
    # Outside a git checkout: a version, no revision.
    outside = _code_in(tree)
    assert outside["revision"] is None and outside["dirty"] is None
    assert outside["version"]

    _git(tree, "init", "-q")
    _git(tree, "add", ".")
    _git(tree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
    head = _git(tree, "rev-parse", "HEAD")
    clean = _code_in(tree)
    assert clean["revision"] == head and clean["dirty"] is False
    (tree / "untracked.txt").write_text("not part of the code")
    assert _code_in(tree)["dirty"] is False
    with open(tree / "fbat_tf" / "catalog.py", "a") as f:
        f.write("\n# changed\n")
    assert _code_in(tree) == {**clean, "dirty": True}


def test_the_settings_that_change_the_last_digits_are_recorded(monkeypatch):
    """The environment's thread counts and XLA flags are in a run's machine record, beside
    oneDNN's settings; variables that set nothing of the kind are not."""
    from fbat_tf import provenance

    given = {
        "TF_NUM_INTRAOP_THREADS": "3",
        "TF_NUM_INTEROP_THREADS": "2",
        "XLA_FLAGS": "--xla_backend_optimization_level=0",
        "TF_XLA_FLAGS": "--tf_xla_auto_jit=2",
        "TF_ENABLE_ONEDNN_OPTS": "0",
    }
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ONEDNN_DEFAULT_FPMATH_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TF_DETERMINISTIC_OPS", "1")
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "3")
    provenance.machine.cache_clear()
    try:
        recorded = provenance.machine()["kernel_settings"]
    finally:
        provenance.machine.cache_clear()
    assert recorded == {**given, "TF_DETERMINISTIC_OPS": "1"}
