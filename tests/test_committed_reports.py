"""The committed sweeps' reports are what today's code writes from their committed cells: sweep.py
--report_only, run as a user runs it from the project's root on a copy of the sweep directory,
rewrites sweep.json, sweep.md and every plot byte for byte.

A change to the records, the upgrade of older files or the report that moved a number, a verdict
or a word of a committed report fails here, naming the file and its first differing line. A
sweep still running (`study.committed.sweeps`) is left out until every cell is in: its committed
report is the one it last wrote, beside runs not yet committed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from study import committed as studies
from tests.committed import report_root
from tests.conftest import ROOT

FINISHED = [os.path.basename(path) for path, done in studies.sweeps(ROOT).items() if done]
# Every cell evaluated, a masking check the definition gained perhaps still landing.
EVALUATED = [
    os.path.basename(path) for path, done in studies.sweeps(ROOT, checks=False).items() if done
]


def test_the_finished_sweeps_are_the_committed_studies():
    # Every study with its last cell, and every masking check its definition asks for,
    # committed; a study still running joins once it is.
    names = {
        "fashion_mnist",
        "fashion_mnist_fast",
        "fashion_mnist_ig",
        "fashion_mnist_tuned",
        "fashion_mnist_interior",
    }
    assert names <= set(FINISHED)
    assert set(FINISHED) <= set(EVALUATED)


def _first_difference(written: bytes, committed: bytes) -> str:
    for number, (left, right) in enumerate(
        zip(written.splitlines(), committed.splitlines(), strict=False), start=1
    ):
        if left != right:
            return f"line {number}: {left[:200]!r} != {right[:200]!r}"
    return f"lengths {len(written)} != {len(committed)} bytes"


@pytest.mark.slow
@pytest.mark.parametrize("name", FINISHED)
def test_committed_report_is_rewritten_byte_for_byte(tmp_path, name):
    committed = os.path.join(ROOT, "study", "results", name)
    # The report names its definition and the cost benchmark relative to where sweep.py runs:
    # a root of the same shape, the sweep directory a copy (the plots rewritten from nothing).
    report_root(tmp_path)
    copy = tmp_path / "study" / "results" / name
    shutil.copytree(committed, copy, ignore=shutil.ignore_patterns("*.png", "sweep.*"))
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "sweep.py"),
            f"--sweep=study/definitions/{name}.json",
            f"--sweep_dir=study/results/{name}",
            "--report_only",
        ],
        cwd=tmp_path,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = sorted(
        entry for entry in os.listdir(committed) if entry.endswith(".png") or entry[:6] == "sweep."
    )
    assert {"sweep.json", "sweep.md"} <= set(reports)
    for entry in reports:
        written = (copy / entry).read_bytes() if (copy / entry).exists() else b""
        with open(os.path.join(committed, entry), "rb") as f:
            expected = f.read()
        assert written == expected, f"{name}/{entry}: {_first_difference(written, expected)}"
