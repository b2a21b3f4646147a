"""Several sweep.py processes on one sweep directory: each cell is claimed by one of them, a
claim whose owner died is taken over, and a killed process's cell is finished by the other (end
to end on a sweep that also shows its cells run the pinned revision while the working tree is
edited, test_sweep_revision's claim)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from fbat_tf.sweeps import claims, revision
from tests.conftest import commit_copy
from tests.test_sweep import (
    PGD_OWN,
    ROOT,
    TINY_FLAGS,
    TINY_FLAGS_WITHOUT_FINAL_TEST,
    write_definition,
)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_claim_is_held_while_its_owner_lives_and_taken_over_after(tmp_path):
    sweep_dir = str(tmp_path)
    first = claims.take(sweep_dir, "cell")
    assert first is not None
    assert claims.take(sweep_dir, "cell") is None  # this live process holds it
    first.release()
    assert claims.owner(sweep_dir, "cell") is None

    path = tmp_path / "claims" / "cell.json"
    # A process of this host that no longer exists: stale at once.
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid()}))
    taken = claims.take(sweep_dir, "cell")
    assert taken is not None and json.loads(path.read_text())["pid"] == os.getpid()
    taken.release()
    # Another host's claim: live while it is touched, stale after STALE_SECONDS without.
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    assert claims.take(sweep_dir, "cell") is None
    old = time.time() - claims.STALE_SECONDS - 1
    os.utime(path, (old, old))
    taken = claims.take(sweep_dir, "cell")
    assert taken is not None
    taken.release()
    # A takeover in progress elsewhere (its lock file): this process does not take the cell.
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid()}))
    (tmp_path / "claims" / "cell.json.takeover").write_text("")
    assert claims.take(sweep_dir, "cell") is None


def test_a_live_claim_on_another_host_is_not_taken_over_between_late_heartbeats(
    tmp_path, monkeypatch
):
    """The owner touches its claim every HEARTBEAT_SECONDS; a claim is stale only after
    STALE_SECONDS untouched. Another host's live owner whose last few heartbeats came late (a
    loaded machine, a network filesystem's cached file times) still holds its cell: a claim
    stale sooner would have its cell run twice."""
    sweep_dir = str(tmp_path)
    path = tmp_path / "claims" / "cell.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    late = time.time() - 3 * claims.HEARTBEAT_SECONDS  # three heartbeats missed
    os.utime(path, (late, late))
    assert claims.owner(sweep_dir, "cell") is not None
    assert claims.take(sweep_dir, "cell") is None

    # And an owner does touch its claim at the heartbeat.
    monkeypatch.setattr(claims, "HEARTBEAT_SECONDS", 0.05)
    held = claims.take(sweep_dir, "other")
    start = os.path.getmtime(tmp_path / "claims" / "other.json")
    time.sleep(0.5)
    assert os.path.getmtime(tmp_path / "claims" / "other.json") > start
    held.release()


def _start(definition: str, tree: str, cwd, log):
    """sweep.py of the checkout `tree` started in `cwd`, the sweep and its data named relative
    to `cwd`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen(
        [
            sys.executable,
            os.path.join(tree, "sweep.py"),
            f"--sweep={definition}",
            "--sweep_dir=out",
            "--data_dir=data",
            "--wait_seconds=1",
        ],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a kill takes the process and the train.py it runs
    )


@pytest.mark.slow
def test_two_processes_share_a_sweep_and_finish_what_a_killed_one_started_from_the_pinned_code(
    tmp_path,
):
    """Two sweep.py processes on one sweep, started from another folder than the code's (a
    clean git checkout of it): each cell is claimed by one of them. Once both cells are claimed
    and the first trains, the working tree's train.py and evaluate.py are replaced by programs
    that fail, and the first cell's process is killed. The other finishes its own cell, then
    resumes the killed one's and evaluates it: each cell evaluated once, every claim released.

    The sweep runs committed code (test_sweep_revision's claim, on this sweep): the programs
    started after the edit ran the pinned revision, checked out beside the cells, and every
    result's code block names it, clean. Relative --sweep_dir and --data_dir mean what they
    mean where sweep.py was started: the cells train, are evaluated and are found done there,
    and nothing lands beside the code."""
    tree = commit_copy(ROOT, str(tmp_path / "t"))
    pinned = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tree, check=True, capture_output=True, text=True
    ).stdout.strip()
    definition = write_definition(
        tmp_path,
        [{"method": ["standard", "fastat"], "eps": [8]}],
        {**TINY_FLAGS_WITHOUT_FINAL_TEST, "epochs": 3},
        evaluation=PGD_OWN,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data").symlink_to("/usr/share/datasets/fashion-mnist", target_is_directory=True)
    out = elsewhere / "out"
    logs = [open(tmp_path / f"process{i}.log", "w") for i in range(2)]
    # Both pin the same revision and check it out under the sweep directory at once.
    processes = [_start(definition, tree, elsewhere, log) for log in logs]
    by_pid = {p.pid: p for p in processes}

    # Once both cells are claimed, edit the working tree and kill the owner of the first cell
    # while it trains.
    deadline = time.time() + 600
    victim_cell = "standard-eps8"
    while True:
        assert time.time() < deadline, "no process claimed the cells"
        assert all(p.poll() is None for p in processes), "a sweep.py process ended"
        owner = claims.owner(str(out), victim_cell)
        other = claims.owner(str(out), "fastat-eps8")
        if (
            owner
            and other
            and owner["pid"] in by_pid
            and (out / victim_cell / "flags.txt").exists()
        ):
            break
        time.sleep(0.2)
    for program in ("train.py", "evaluate.py"):
        with open(os.path.join(tree, program), "w") as f:
            f.write("raise SystemExit('the edited working tree ran')\n")
    victim = by_pid[owner["pid"]]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    survivor = next(p for p in processes if p is not victim)
    log = tmp_path / f"process{processes.index(survivor)}.log"
    assert survivor.wait(timeout=900) == 0, log.read_text()[-3000:]
    for each in logs:
        each.close()
    assert f"cells run revision {pinned[:12]}" in log.read_text()

    checkout = os.path.join(str(out), "code", pinned[:12])  # the pinned revision's
    for cell in ("standard-eps8", "fastat-eps8"):
        assert json.loads((out / cell / "results.json").read_text())["status"] == "complete"
        for name in ("results.json", "eval-pgd.json"):
            code = json.loads((out / cell / name).read_text())["code"]
            assert (code["revision"], code["dirty"]) == (pinned, False), (cell, name)
        evaluated = (out / "logs" / f"{cell}.evaluate.log").read_text()
        started = re.findall(r"^\$ python (\S+)/evaluate\.py ", evaluated, re.M)
        assert started == [checkout], cell
    trained = {
        cell: re.findall(
            r"^\$ python (\S+)/train\.py ",
            (out / "logs" / f"{cell}.train.log").read_text(),
            re.M,
        )
        for cell in ("standard-eps8", "fastat-eps8")
    }
    # The killed process's cell was started by it and resumed by the survivor; the other
    # cell ran once; each from the pinned checkout.
    assert {cell: len(runs) for cell, runs in trained.items()} == {
        "standard-eps8": 2,
        "fastat-eps8": 1,
    }
    assert {run for runs in trained.values() for run in runs} == {checkout}
    assert "Resuming" in (out / "logs" / "standard-eps8.train.log").read_text()
    assert not list((out / "claims").glob("*.json"))  # every claim released

    assert json.loads((out / revision.FILE).read_text())["revision"] == pinned
    report = json.loads((out / "sweep.json").read_text())
    assert report["code"]["revisions"] == {pinned: 2} and not report["code"]["dirty_cells"]
    assert f"every cell ran revision {pinned[:12]}" in (out / "sweep.md").read_text()
    assert not os.path.exists(os.path.join(tree, "out"))
    subprocess.run(["git", "checkout", "--", "train.py", "evaluate.py"], cwd=tree, check=True)
    with open(tmp_path / "again.log", "w") as again_log:
        again = _start(definition, tree, elsewhere, again_log)
        assert again.wait(timeout=900) == 0
    assert "2 cells, 2 done, 0 to run" in (tmp_path / "again.log").read_text()


def test_a_claim_is_never_half_written_and_an_unreadable_one_goes_stale(tmp_path, monkeypatch):
    """A full disk while claiming left an empty claims/<cell>.json, for which the local
    launcher then waited forever and the Ray launcher left the cell undone: a claim appears
    whole or not at all, and an unreadable one left by something else is stale within a
    minute."""
    sweep_dir = str(tmp_path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", full)
    try:
        claims.take(sweep_dir, "cell")
    except OSError as error:
        assert error.errno == 28
    monkeypatch.undo()
    assert os.listdir(os.path.join(sweep_dir, claims.DIRECTORY)) == []
    # An empty claim, as an older writer left it: live while fresh, then stale and taken over.
    path = os.path.join(sweep_dir, claims.DIRECTORY, "other.json")
    open(path, "w").close()
    assert claims.owner(sweep_dir, "other") is not None
    assert claims.take(sweep_dir, "other") is None
    old = time.time() - claims.LOCK_SECONDS - 1
    os.utime(path, (old, old))
    assert claims.owner(sweep_dir, "other") is None
    taken = claims.take(sweep_dir, "other")
    assert taken is not None and json.load(open(path))["pid"] == os.getpid()
    taken.release()


def test_an_unreachable_ray_address_fails_at_once_in_one_line(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    definition = write_definition(tmp_path, [{"method": ["standard"], "eps": [8]}], TINY_FLAGS)
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "sweep.py",
            f"--sweep={definition}",
            f"--sweep_dir={tmp_path / 'out'}",
            "--launcher=ray",
            f"--ray_address=127.0.0.1:{port}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and time.monotonic() - started < 60
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: --ray_address=127.0.0.1:{port}: no Ray cluster answers there"
    ), done.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_a_claim_that_is_a_link_is_taken_over_and_nothing_behind_it_is_touched(tmp_path):
    """A claim is a file linked into place by a hard link, never a symbolic link: one there,
    dangling (it blocked its cell for ever, "waiting for 1 cells other sweep.py processes run")
    or pointing at a file, is no process's claim. It is taken over, and what it points at is
    neither read as a claim nor written, touched or removed."""
    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "claims").mkdir(parents=True)
    path = sweep_dir / "claims" / "cell.json"
    os.symlink(tmp_path / "nowhere.json", path)
    assert claims.owner(str(sweep_dir), "cell") is None
    taken = claims.take(str(sweep_dir), "cell")
    assert taken is not None and not path.is_symlink()
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not (tmp_path / "nowhere.json").exists()
    taken.release()

    # A link to a file that reads as a live claim of this process: still no claim.
    target = tmp_path / "live.json"
    target.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    os.utime(target, (1000, 1000))
    before = target.read_bytes()
    os.symlink(target, path)
    taken = claims.take(str(sweep_dir), "cell")
    assert taken is not None and not path.is_symlink()
    taken.release()
    assert target.read_bytes() == before and os.stat(target).st_mtime == 1000

    # A dangling link left as the takeover's lock by a taker that died: stale after its time.
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid()}))
    lock = sweep_dir / "claims" / "cell.json.takeover"
    os.symlink(tmp_path / "gone", lock)
    old = time.time() - claims.LOCK_SECONDS - 1
    os.utime(lock, (old, old), follow_symlinks=False)
    assert claims.take(str(sweep_dir), "cell") is None  # the stale lock is removed, not taken
    assert not os.path.lexists(lock)
    taken = claims.take(str(sweep_dir), "cell")
    assert taken is not None
    taken.release()
