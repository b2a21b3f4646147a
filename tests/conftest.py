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
        if not name or name.startswith("study/results/") or not os.path.isfile(source):
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


# CPU time by test: `--cpu-durations=N` ---------------------------------------------------------
#
# A test's wall time on this 2-core machine depends on what runs beside it (another pytest-xdist
# worker, a sweep); the CPU time it and the programs it waited for used does not, and the whole
# suite's wall time at rest is about its total over the cores. Each phase's CPU seconds travel
# on its report (pytest-xdist sends them to the controller), which sums them by test.


def _cpu_seconds() -> float:
    import resource

    own, waited = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="list the N tests that used the most CPU time (the test's process and the programs "
        "it waited for, setup and teardown included), and the suite's total",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if item.config.getoption("cpu_durations") is None:
        return
    started = item.stash.get(_CPU_AT, None)
    now = _cpu_seconds()
    item.stash[_CPU_AT] = now  # the next phase starts where this one ended
    if started is not None:
        outcome.get_result().user_properties.append(("cpu_seconds", now - started))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.config.getoption("cpu_durations") is not None:
        item.stash[_CPU_AT] = _cpu_seconds()


_CPU_AT = pytest.StashKey[float]()
_CPU_BY_TEST: dict[str, float] = {}


def pytest_runtest_logreport(report):
    for name, value in report.user_properties:
        if name == "cpu_seconds":
            _CPU_BY_TEST[report.nodeid] = _CPU_BY_TEST.get(report.nodeid, 0.0) + value


def pytest_terminal_summary(terminalreporter, config):
    count = config.getoption("cpu_durations")
    if count is None or not _CPU_BY_TEST:
        return
    ranked = sorted(_CPU_BY_TEST.items(), key=lambda pair: -pair[1])
    total = sum(_CPU_BY_TEST.values())
    terminalreporter.write_sep(
        "=", f"most CPU time, {min(count, len(ranked))} of {len(ranked)} tests"
    )
    for nodeid, seconds in ranked[:count]:
        terminalreporter.write_line(f"{seconds:8.2f}s {nodeid}")
    terminalreporter.write_line(f"{total:8.1f}s of CPU over all {len(ranked)} tests")
