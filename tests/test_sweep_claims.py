"""Several sweep.py processes on one sweep directory: each cell is claimed by one of them, a
claim whose owner died is taken over, and a killed process's cell is finished by the other."""

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

from fbat_tf.sweeps import claims
from tests.test_sweep import PGD_OWN, ROOT, TINY_FLAGS, write_definition


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


def _start(definition: str, out, log, tree: str = ROOT):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen(
        [
            sys.executable,
            os.path.join(tree, "sweep.py"),
            f"--sweep={definition}",
            f"--sweep_dir={out}",
            "--wait_seconds=1",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a kill takes the process and the train.py it runs
    )


@pytest.mark.slow
def test_two_processes_share_a_sweep_and_one_finishes_what_the_killed_one_started(
    tmp_path, committed_tree
):
    evaluation = PGD_OWN
    definition = write_definition(
        tmp_path,
        [{"method": ["standard", "fastat"], "eps": [8]}],
        {**TINY_FLAGS, "epochs": 3},
        evaluation=evaluation,
    )
    out = tmp_path / "out"
    logs = [open(tmp_path / f"process{i}.log", "w") for i in range(2)]
    # Both pin the same revision and check it out under the sweep directory at once.
    processes = [_start(definition, out, log, committed_tree) for log in logs]
    by_pid = {p.pid: p for p in processes}

    # Once both cells are claimed, kill the owner of the first cell while it trains.
    deadline = time.time() + 600
    victim_cell = "standard-eps8"
    while True:
        assert time.time() < deadline, "no process claimed the cells"
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
    victim = by_pid[owner["pid"]]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    survivor = next(p for p in processes if p is not victim)
    assert survivor.wait(timeout=900) == 0, (tmp_path / "process0.log").read_text()[-3000:]
    for log in logs:
        log.close()

    for cell in ("standard-eps8", "fastat-eps8"):
        assert json.loads((out / cell / "results.json").read_text())["status"] == "complete"
        evaluated = (out / "logs" / f"{cell}.evaluate.log").read_text()
        assert len(re.findall(r"^\$ python \S+/evaluate\.py ", evaluated, re.M)) == 1, cell
    trained = {
        cell: len(
            re.findall(
                r"^\$ python \S+/train\.py ",
                (out / "logs" / f"{cell}.train.log").read_text(),
                re.M,
            )
        )
        for cell in ("standard-eps8", "fastat-eps8")
    }
    # The killed process's cell was started by it and resumed by the survivor; the other
    # cell ran once.
    assert trained == {"standard-eps8": 2, "fastat-eps8": 1}
    assert "Resuming" in (out / "logs" / "standard-eps8.train.log").read_text()
    assert not list((out / "claims").glob("*.json"))  # every claim released


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
