"""Claims on a sweep's cells, so that several sweep.py processes can share one sweep directory
(one per GPU, or a job array on a cluster with a shared filesystem) and no cell runs twice.
With Ray (--launcher=ray) one driver schedules every cell and holds the claims of those it
runs; the claims serve the sweeps that run without Ray.

    claim = claims.take(sweep_dir, "fastbat-eps8-seed0")   # None: another live process has it
    ...                                                     # train and evaluate the cell
    claim.release()

A sweep's tuning runs (tuning.py) are claimed as its cells are, under `claims/tuning/`; a
process whose final cells wait for a tuning pick waits for the tuning runs other processes hold,
and takes over those whose owner died.

A claim is the file `<sweep_dir>/claims/<cell>.json`, written aside and linked into place
(atomic, and refused where one exists) with the owner's host, process id and start time, so
that no claim is ever half-written (an unreadable one, left by something else, is stale once a
minute old); while the owner runs the cell it touches the
file every HEARTBEAT_SECONDS. A claim is stale, and taken over, when its owner is a process of
this host that no longer exists, or when the file has not been touched for STALE_SECONDS (an
owner on another host that died): ten heartbeats, so that a live owner's late heartbeats (a
loaded machine, a network filesystem's cached file times) never make its claim look stale
(tests/test_sweep_claims.py). A symbolic link where a claim would be is no claim (claims are
linked into place by hard links), dangling or not: stale at once, its target never read nor
touched. A stale claim is replaced under a short-lived lock file, so that of two processes
that find it stale only one takes the cell over.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

from fbat_tf.records import files

DIRECTORY = "claims"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0
LOCK_SECONDS = 60.0


def _path(sweep_dir: str, cell: str) -> str:
    return os.path.join(sweep_dir, DIRECTORY, f"{cell}.json")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user
        return True
    return True


def owner(sweep_dir: str, cell: str) -> dict[str, Any] | None:
    """The live owner of the cell's claim, or None (no claim, or a stale one). A symbolic link
    there is no claim (claims are files, linked into place by a hard link): never read through,
    it is stale and taken over."""
    path = _path(sweep_dir, cell)
    if os.path.islink(path):
        return None
    try:
        with open(path) as f:
            found = json.load(f)
        touched = os.path.getmtime(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        # Claims appear whole (`_create` links a written file into place), so an unreadable one
        # was left by something else (a disk that filled while an older version wrote it):
        # live while fresh, stale once it has not been touched for a takeover's time.
        try:
            fresh = time.time() - os.path.getmtime(path) < LOCK_SECONDS
        except FileNotFoundError:
            return None
        return {"host": "?", "pid": -1} if fresh else None
    if found.get("host") == socket.gethostname():
        return found if _alive(int(found.get("pid", -1))) else None
    return found if time.time() - touched < STALE_SECONDS else None


class Claim:
    """A claim this process holds; `release()` when the cell is finished or has failed."""

    def __init__(self, path: str):
        self.path = path
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path, follow_symlinks=False)  # the claim, never a link's target
            except FileNotFoundError:
                return

    def release(self) -> None:
        self._stop.set()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass


def _create(path: str) -> Claim | None:
    """The claim at `path`, written aside and linked into place (atomic, and refused where a
    claim exists): never a half-written claim, even on a full disk (OSError then, and no
    claim)."""
    written = f"{path}.{socket.gethostname()}.{os.getpid()}.new"
    try:
        with files.open_own(written, "w") as f:  # never through a link left at that name
            json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(written, path)
        except FileExistsError:
            return None
    finally:
        try:
            os.remove(written)
        except FileNotFoundError:
            pass
    return Claim(path)


def take(sweep_dir: str, cell: str) -> Claim | None:
    """Claim the cell for this process, taking over a stale claim; None if a live process
    holds it (or is taking it over at this moment)."""
    path = _path(sweep_dir, cell)
    files.make_dirs(os.path.dirname(path), inside=sweep_dir)  # claims/ is no link
    if not os.path.lexists(path):  # a dangling link is a stale claim, taken over below
        return _create(path)
    if owner(sweep_dir, cell) is not None:
        return None
    # A stale claim is taken over under a lock, so that of two processes that both found it
    # stale, the second sees the first's new claim instead of removing it.
    lock = f"{path}.takeover"
    try:
        descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:  # the lock's own time (a dangling link there is stale too): removed, not followed
            if time.time() - os.lstat(lock).st_mtime > LOCK_SECONDS:  # its taker died meanwhile
                os.remove(lock)
        except FileNotFoundError:
            pass
        return None
    try:
        if owner(sweep_dir, cell) is not None:
            return None
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        return _create(path)
    finally:
        os.close(descriptor)
        os.remove(lock)
