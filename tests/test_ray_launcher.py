"""sweep.py --launcher=ray: the cells as Ray tasks on a local Ray instance on CPU, as a user
runs it. A driver killed midway and started again finishes the sweep with the sequential
launcher's numbers and runs no finished cell twice; a failing cell is retried, then reported
with its log; a diverged one is not retried; without Ray, one line and nothing written."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from tests.test_sweep import PGD_OWN, TINY_FLAGS, TINY_FLAGS_WITHOUT_FINAL_TEST
from tests.trees import project_copy, run_sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
needs_data = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST), reason="needs dataset-fashion-mnist"
)

# A method whose every step fails: a cell that fails however often it runs.
FAILING_MODULE = """
from fbat_tf.methods.base import Method
from fbat_tf.methods.declarations import Entry


class Failing(Method):
    name = "failing"

    def gradients(self, model, x, y, seed, loss_scale=None):
        raise RuntimeError("this method always fails")


ENTRY = Entry(Failing)
"""
FAILING_LINE = "from fbat_tf.methods import failing  # noqa: E402\nregister(failing.ENTRY)\n"


@pytest.fixture
def ray_env(tmp_path):
    """The environment of a sweep.py run under test, marked, so that the Ray processes a
    killed driver leaves behind are found and stopped afterwards."""
    marker = uuid.uuid4().hex
    # Ray's sockets live under its temporary folder, whose path must stay short.
    scratch = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", FBAT_TEST_RAY=marker, RAY_TMPDIR=scratch)
    env.pop("RAY_ADDRESS", None)
    yield env
    _stop_marked(marker)
    shutil.rmtree(scratch, ignore_errors=True)


def _stop_marked(marker: str) -> None:
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(path, "rb") as f:
                marked = f"FBAT_TEST_RAY={marker}".encode() in f.read().split(b"\0")
            if marked:
                os.kill(int(path.split("/")[2]), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def _numbers(cell_dir: str) -> dict:
    """What a cell found: every epoch's logs but their times, and each evaluation's accuracies."""
    with open(os.path.join(cell_dir, "results.json")) as f:
        results = json.load(f)
    timed = ("epoch_time", "images_per_second")
    found = {
        "history": [{k: v for k, v in h.items() if k not in timed} for h in results["history"]]
    }
    for path in sorted(glob.glob(os.path.join(cell_dir, "eval-*.json"))):
        with open(path) as f:
            evaluation = json.load(f)
        found[os.path.basename(path)] = (
            evaluation["clean_accuracy"],
            evaluation["robust_accuracy"],
        )
    return found


# Two tiny cells, run together: the first (standard training for 2 epochs on 128 images) ends
# while the other (Fast-AT for 12 epochs on 1,024) trains, so that a driver killed once the first
# is evaluated, or a node removed in the middle of the second's training, cuts the second short.
# Each program's start-up outweighs a tiny epoch: the second cell's training must outlast the
# first cell's evaluation by far (with 4 epochs on 128, a fast machine finished both cells before
# the kill).
EPOCHS = 12
# The claims concern each cell's epochs and evaluations (what _same_numbers compares), not
# train.py's final test, which the cells skip.
TWO = {
    "description": "two tiny cells",
    "flags": {**TINY_FLAGS_WITHOUT_FINAL_TEST, "max_train_examples": 128, "jit_compile": "false"},
    "grid": [
        {"method": ["standard"], "eps": [8], "seed": [0]},
        {
            "method": ["fastat"],
            "eps": [8],
            "seed": [0],
            "epochs": [EPOCHS],
            "max_train_examples": [1024],
        },
    ],
    "evaluation": PGD_OWN,
}


def _same_numbers(ray_dir: str, sequential: str) -> list[str]:
    """The cells of the sequential run (each with results.json), each asserted to have found in
    `ray_dir` what it found there; returns their names."""
    cells = sorted(
        name
        for name in os.listdir(sequential)
        if os.path.exists(os.path.join(sequential, name, "results.json"))
    )
    for cell in cells:
        assert _numbers(os.path.join(ray_dir, cell)) == _numbers(os.path.join(sequential, cell)), (
            cell
        )
    return cells


def _runs_of(log: str, program: str) -> int:
    """How many times a cell's log shows `program` started."""
    if not os.path.exists(log):
        return 0
    with open(log) as f:
        return sum(1 for line in f if line.startswith("$ python") and f"/{program} " in line)


def test_launcher_ray_without_ray_says_so_in_one_line_and_writes_nothing(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None\n")
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable,
            "sweep.py",
            "--sweep=fashion_mnist",
            f"--sweep_dir={sweep_dir}",
            "--launcher=ray",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=f"{hidden}{os.pathsep}{ROOT}"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.strip() == 'error: --launcher=ray needs Ray: pip install -e ".[cluster]"'
    assert not sweep_dir.exists()


def _kill_session(session: int) -> None:
    """SIGKILL every process of `session` (Linux's /proc), until none is left."""
    while True:
        found = []
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat") as f:
                    # pid (comm) state ppid pgrp session ...: comm may hold spaces.
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                found.append(int(name))
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


@pytest.mark.slow
@needs_data
def test_a_killed_ray_driver_started_again_finishes_with_the_sequential_numbers(
    tmp_path, ray_env, sequential_two
):
    # Both cells at once: killed once the first has finished, the other is cut short.
    tree = project_copy(tmp_path, {"two": TWO})

    # Two cells at a time, whatever the machine's cores.
    per_cell = f"--cpus_per_cell={max(1, (os.cpu_count() or 2) // 2)}"
    command = [sys.executable, "sweep.py", "--allow_dirty", "--sweep=two", "--launcher=ray"]
    command += ["--sweep_dir=results/ray", per_cell]
    # In a session of its own, killed whole as a scheduler kills a job: the driver, the Ray
    # instance it started and the workers' programs (each worker has a process group of its
    # own, and may otherwise finish its cell before Ray stops it).
    driver = subprocess.Popen(
        command,
        cwd=tree,
        env=dict(ray_env, PYTHONPATH=tree),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    ray_dir = os.path.join(tree, "results", "ray")
    deadline = time.time() + 600
    while time.time() < deadline and driver.poll() is None:
        if glob.glob(os.path.join(ray_dir, "*", "eval-pgd.json")):
            break
        time.sleep(0.5)
    assert driver.poll() is None, driver.stdout.read()[-3000:]  # killed midway, not after
    _kill_session(driver.pid)
    driver.wait()
    first = driver.stdout.read()
    assert "Ray: 2 cells at a time" in first and "dashboard at" in first, first[-2000:]
    finished = {
        os.path.basename(os.path.dirname(p))
        for p in glob.glob(os.path.join(ray_dir, "*", "eval-pgd.json"))
    }
    assert len(finished) == 1

    again = run_sweep(tree, *command[3:], env=ray_env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "2 cells, " in again.stdout and "[" in again.stdout
    cells = _same_numbers(ray_dir, sequential_two)
    assert len(cells) == 2
    for cell in cells:
        logs = os.path.join(ray_dir, "logs", cell)
        if cell in finished:  # finished before the kill: not run again
            assert _runs_of(f"{logs}.train.log", "train.py") == 1, cell
            assert _runs_of(f"{logs}.evaluate.log", "evaluate.py") == 1, cell
        else:  # cut short: a training resumes where it stopped, an evaluation runs again
            assert _runs_of(f"{logs}.evaluate.log", "evaluate.py") >= 1, cell


@pytest.mark.slow
@needs_data
def test_a_failing_cell_is_retried_then_reported_and_a_diverged_one_is_not(tmp_path, ray_env):
    definition = {
        "description": "a cell that fails and one that diverges",
        "flags": {**TINY_FLAGS, "epochs": 1, "jit_compile": "false"},
        "grid": [
            {"method": ["failing"], "eps": [8]},
            {"method": ["fastbat"], "eps": [8], "lr_max": [1e6], "steps_per_epoch": [5]},
        ],
        "evaluation": PGD_OWN,
    }
    tree = project_copy(tmp_path, {"bad": definition})
    with open(os.path.join(tree, "fbat_tf", "methods", "failing.py"), "w") as f:
        f.write(FAILING_MODULE)
    with open(os.path.join(tree, "fbat_tf", "methods", "__init__.py"), "a") as f:
        f.write(FAILING_LINE)
    done = run_sweep(tree, "--sweep=bad", "--launcher=ray", "--cell_retries=1", env=ray_env)
    assert done.returncode != 0
    logs = os.path.join(tree, "results", "bad", "logs")
    (failing,) = glob.glob(os.path.join(logs, "failing-*.train.log"))
    (diverged,) = glob.glob(os.path.join(logs, "fastbat-*.train.log"))
    assert _runs_of(failing, "train.py") == 2  # once, then the one retry
    assert _runs_of(diverged, "train.py") == 1
    assert "failed (attempt 1 of 2), trying again" in done.stdout
    # Reported with the end of its log, which names the cause.
    assert "FAILED after 2 attempts" in done.stdout + done.stderr
    assert "this method always fails" in done.stdout + done.stderr
    assert "diverged in training, not evaluated" in done.stdout
    assert "error: 1 cells failed: failing-" in done.stderr


def test_the_ray_launcher_s_flags_are_refused_with_the_local_one(tmp_path):
    done = subprocess.run(
        [sys.executable, "sweep.py", "--sweep=fashion_mnist", f"--sweep_dir={tmp_path / 's'}"]
        + ["--cell_retries=2", "--ray_address=auto"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.strip() == "error: --ray_address, --cell_retries: for --launcher=ray only"
    assert not (tmp_path / "s").exists()
