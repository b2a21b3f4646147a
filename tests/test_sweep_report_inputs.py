"""`sweep.py --report_only` on damaged inputs, run as a user runs it from a root of the
project's shape on a copy of part of a committed sweep (its records, no weights): a cell's
results.json cut short or of another type, a NaN in a cell's history, a tuning.json pick of
another shape. Each is a report that leaves the cell out and says so naming the file, or one
line naming the file and what to do; never a traceback.

    python -m pytest -q -n 0 tests/test_sweep_report_inputs.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.committed import report_root

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _copy(tmp_path, name: str, cells: str, *files: str) -> str:
    """A root shaped like the project (tests/committed.report_root) with study/results/<name>/
    holding the records of the committed sweep's cells whose names contain `cells`, and its
    `files`."""
    report_root(tmp_path)
    committed = os.path.join(ROOT, "study", "results", name)
    copy = tmp_path / "study" / "results" / name
    copy.mkdir(parents=True)
    for entry in sorted(os.listdir(committed)):
        if cells in entry and os.path.isdir(os.path.join(committed, entry)):
            shutil.copytree(
                os.path.join(committed, entry),
                copy / entry,
                ignore=shutil.ignore_patterns("*.h5", "*.png", "checkpoints", "tensorboard"),
            )
    for entry in files:
        shutil.copy(os.path.join(committed, entry), copy / entry)
    return f"study/results/{name}"


def _report(tmp_path, name: str, sweep_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "sweep.py"),
            f"--sweep=study/definitions/{name}.json",
            f"--sweep_dir={sweep_dir}",
            "--report_only",
        ],
        cwd=tmp_path,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _cut_short(text: str) -> str:
    return text[: len(text) // 2]


def _status_5(text: str) -> str:
    found = json.loads(text)
    found["status"] = 5
    return json.dumps(found)


@pytest.mark.parametrize("damage", [_cut_short, _status_5])
def test_a_cell_whose_record_does_not_read_is_left_out_naming_it(tmp_path, damage):
    sweep_dir = _copy(tmp_path, "fashion_mnist", "-eps16-")
    # The first cell of its row: the cost table read its passes, and found none.
    record = tmp_path / sweep_dir / "fastat-eps16-seed0" / "results.json"
    record.write_text(damage(record.read_text()))
    done = _report(tmp_path, "fashion_mnist", sweep_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    (warning,) = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert warning.startswith(
        f"warning: the report leaves fastat-eps16-seed0 out: {sweep_dir}/fastat-eps16-seed0/"
        "results.json"
    ), warning
    assert f"or delete {sweep_dir}/fastat-eps16-seed0 and the sweep trains" in warning
    report = json.loads((tmp_path / sweep_dir / "sweep.json").read_text())
    fastat = [row for row in report["robust_vs_cost"]["16"] if row["key"] == "fastat"]
    assert [row["seeds"] for row in fastat] == [1]  # the other seed's cell, alone


def test_a_nan_in_a_cells_history_is_no_accuracy_in_the_tables(tmp_path):
    sweep_dir = _copy(tmp_path, "fashion_mnist_tuned", "fastat-eps48-seed", "tuning.json")
    record = tmp_path / sweep_dir / "fastat-eps48-seed0" / "results.json"
    found = json.loads(record.read_text())
    for epoch in found["history"]:
        epoch["val_robust_accuracy"] = float("nan")
    record.write_text(json.dumps(found))
    done = _report(tmp_path, "fashion_mnist_tuned", sweep_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    markdown = (tmp_path / sweep_dir / "sweep.md").read_text()
    assert "nan" not in markdown.lower()


def _flags_left_out(pick: dict):
    del pick["flags"]
    return pick


def _candidates_as_text(pick: dict):
    pick["candidates"] = ["fastat_step0.75", 1]
    return pick


def _pick_of_another_name(pick: dict):
    pick["pick"] = "fastat_step9"
    return pick


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (_flags_left_out, "has no 'flags' object"),
        (lambda pick: pick["pick"], "is 'fastat_step0.75'"),
        (_candidates_as_text, "has 'candidates' that are not objects"),
        (_pick_of_another_name, "picks 'fastat_step9', none of its candidates"),
    ],
)
def test_a_tuning_pick_of_another_shape_is_one_line_naming_the_file(tmp_path, damage, said):
    sweep_dir = _copy(tmp_path, "fashion_mnist_tuned", "fastat-eps48-seed", "tuning.json")
    path = tmp_path / sweep_dir / "tuning.json"
    found = json.loads(path.read_text())
    found["picks"]["fastat-eps48"] = damage(found["picks"]["fastat-eps48"])
    path.write_text(json.dumps(found))
    done = _report(tmp_path, "fashion_mnist_tuned", sweep_dir)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"error: {sweep_dir}/tuning.json: the pick of fastat-eps48 {said}")
    assert f"delete {sweep_dir}/tuning.json and run the same command again" in lines[-1]


# A full disk where the report writes its files: the file opens (an empty one appears) and
# writing to it fails, naming no file, as the kernel's ENOSPC does.
FULL_DISK = """
import builtins, errno
_open = builtins.open
class _Full:
    def __init__(self, f): self.f = f
    def __enter__(self): return self
    def __exit__(self, *a): self.f.close()
    def write(self, text): raise OSError(errno.ENOSPC, "No space left on device")
def _full_open(path, mode="r", *args, **kwargs):
    f = _open(path, mode, *args, **kwargs)
    return _Full(f) if "w" in mode and str(path).endswith(".tmp") else f
builtins.open = _full_open
import os
_fdopen = os.fdopen
def _full_fdopen(fd, mode="r", *args, **kwargs):
    # A file the project opens itself (records.files.open_own: os.open, then os.fdopen).
    f = _fdopen(fd, mode, *args, **kwargs)
    return _Full(f) if any(m in mode for m in "wxa") else f
os.fdopen = _full_fdopen
"""


def test_a_full_disk_while_writing_the_report_names_the_file_and_leaves_nothing(tmp_path):
    sweep_dir = _copy(tmp_path, "fashion_mnist", "-eps16-")
    code = (
        f"import runpy, sys\nsys.path.insert(0, {ROOT!r})\n{FULL_DISK}\n"
        f"sys.argv = ['sweep.py', '--sweep=study/definitions/fashion_mnist.json', "
        f"'--sweep_dir={sweep_dir}', '--report_only']\n"
        f"runpy.run_path({os.path.join(ROOT, 'sweep.py')!r}, run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = [line for line in done.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(
        f"error: no space left on the device writing {sweep_dir}/sweep.json: free some space "
        "and run the same command again"
    ), last
    assert "training" not in last
    left = [entry for entry in os.listdir(tmp_path / sweep_dir) if ".tmp" in entry]
    assert left == []
