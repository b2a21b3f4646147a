"""Shared test set-up: quiet TensorFlow logs, a float32 policy around every test, and the
process environment's oneDNN choice left as each test found it."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# One thread for each TensorFlow process's ops, in the test processes and in every program
# they start: pytest-xdist runs a test per core, and a test's program then shares the machine
# with another's; TensorFlow's pools, sized to every core, would each take twice their share.
# Whatever a test compares runs under the same setting (set it in the environment to change).
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import pytest  # noqa: E402

from fbat_tf import startup  # noqa: E402

# TensorFlow's start-up lines left out, as the entry points leave them out: pytest-xdist's
# controller would otherwise print them after the summary.
startup.load_tensorflow()

import keras  # noqa: E402


@pytest.fixture(autouse=True)
def _float32_policy():
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(autouse=True)
def _onednn_choice_left_as_found():
    # Child processes inherit the environment, and TF_ENABLE_ONEDNN_OPTS overrides train.py's
    # choice by dataset: a value a test leaves behind turns oneDNN on for a later test's
    # Tiny-ImageNet run, which then crashes (fbat_tf/onednn.py).
    before = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    yield
    after = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    assert after == before, f"the test left TF_ENABLE_ONEDNN_OPTS={after!r} (was {before!r})"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit_copy(root: str, destination: str) -> str:
    """The project's files as they are now (tracked and new ones, committed results aside)
    copied to `destination` and committed there as a git repository of its own: a clean
    checkout of the code under test, which sweep.py pins and runs as it would pin a clean
    checkout of main."""
    import shutil
    import subprocess

    def git(*args: str, cwd: str = root) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
        ).stdout

    files = git("ls-files", "--cached", "--others", "--exclude-standard", "-z").split("\0")
    for name in files:
        source = os.path.join(root, name)
        if not name or name.startswith("results/") or not os.path.isfile(source):
            continue  # a deleted file, or committed results (not code)
        target = os.path.join(destination, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target)
    git("init", "-q", cwd=destination)
    git("add", "-A", cwd=destination)
    identity = ("-c", "user.name=fbat-tf tests", "-c", "user.email=tests@fbat-tf.invalid")
    git(*identity, "commit", "-q", "-m", "the code under test", cwd=destination)
    return destination


@pytest.fixture(scope="session")
def committed_tree(tmp_path_factory) -> str:
    """A clean git checkout of the code under test (commit_copy), shared by the session."""
    return commit_copy(ROOT, str(tmp_path_factory.mktemp("committed")))


@pytest.fixture(scope="session")
def sequential_two(tmp_path_factory) -> str:
    """The Ray tests' two cells (tests/test_ray_launcher.TWO) run once by the sequential
    launcher, for every test that compares a Ray run with it: the folder of its cells. Made by
    the first test of any pytest-xdist worker that asks, under a file lock, and read by the
    others (the workers share their session's folder)."""
    from filelock import FileLock

    from tests.test_ray_launcher import TWO
    from tests.trees import project_copy, run_sweep

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # this session's, common to its workers
    done = shared / "sequential_two" / "tree" / "results" / "sequential"
    with FileLock(str(shared / "sequential_two.lock")):
        if not (done / "sweep.json").exists():
            tree = project_copy(shared / "sequential_two", {"two": TWO})
            ran = run_sweep(tree, "--sweep=two", "--sweep_dir=results/sequential")
            assert ran.returncode == 0, ran.stderr[-3000:]
    return str(done)
