"""--help of each entry point lists its own flags with their defaults and exits 0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    ("program", "own"),
    [
        (
            "train.py",
            [
                "--method: <standard|fastat|",
                "--eps:",
                "--nfgsm_noise:",
                "--elle_schedule: <adaptive|constant>",
                "--[no]traceback",
            ],
        ),
        ("evaluate.py", ["--attacks:", "--model_path:", "--pgd_steps:", "--batch_size:"]),
        ("sweep.py", ["--sweep:", "--allow_dirty", "--repin", "--dry_run"]),
    ],
)
def test_help_lists_the_entry_points_own_flags_and_exits_0(program, own):
    for asked in ("--help", "-h"):
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, program), asked],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        for flag in own:
            assert flag in done.stdout, (program, flag)
        assert "(default: " in done.stdout


@pytest.mark.parametrize(
    ("module", "own"),
    [
        ("export", ["--workdir:", "--export_formats:", "--int8_examples:", "--[no]traceback"]),
        ("export.client", ["--server:", "--model_name:", "--images:", "--[no]traceback"]),
    ],
)
def test_help_of_the_export_modules_lists_their_own_flags_and_exits_0(module, own):
    """`python -m export --help` listed no flag and exited 1, as the client's did."""
    for asked in ("--help", "-h"):
        done = subprocess.run(
            [sys.executable, "-m", module, asked],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        for flag in own:
            assert flag in done.stdout, (module, flag)
        assert "(default: " in done.stdout
