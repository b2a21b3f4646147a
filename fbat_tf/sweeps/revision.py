"""The code a sweep's cells run: a committed revision, checked out beside the cells.

    pinned = revision.pin(sweep_dir, root)        # RevisionError on a dirty tree
    pinned.tree                                   # <sweep_dir>/code/<revision>: run programs here
    pinned.revision, pinned.started               # the revision, and when it was first pinned

A sweep runs for hours while its code may be edited. Its cells therefore never run the working
tree: the first start records the checkout's HEAD in `<sweep_dir>/revision.json` and checks that
revision out as a git worktree under `<sweep_dir>/code/`, where no edit reaches it; every cell's
train.py and evaluate.py run from there, so their results' `code` blocks name that revision,
clean. A later start (a resumed sweep, another process, a fresh clone with the committed files)
runs the recorded revision again, checking it out anew where needed; `repin=True` moves the
sweep to the current HEAD. A tree whose tracked files differ from HEAD (a sweep's own outputs
aside: its report, revision, claims, logs and cells are results, not code, wherever the sweep's
directory is) is refused at the first pin, since what would run is not what the user sees.
revision.json must name a commit (40 hexadecimal digits) of the repository, or the sweep stops
naming the file; the only directories ever removed are checkouts directly inside the sweep's own
code/ folder, never through a link. `pin(..., allow_dirty=True)` runs the working tree as it is
instead; the report marks every cell such a run touches (its `code` says `dirty`).
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import json
import os
import re
import subprocess

from fbat_tf import records
from fbat_tf.records import files

FILE = "revision.json"
DIRECTORY = "code"
# A pinned revision is a commit's full name; anything else in revision.json is refused before
# any path is made of it.
_REVISION = re.compile(r"[0-9a-f]{40}")
# What a checkout under code/ is named: the revision's first 12 digits, and while it is being
# made, the same with the maker's process id.
_CHECKOUT = re.compile(r"[0-9a-f]{12}(\.[0-9]+)?")
# What a sweep writes in its own directory besides its cells (a cell is a run directory).
_REPORT_FILES = ("sweep.json", "sweep.md", FILE, "tuning.json")
_OUTPUT_FOLDERS = (DIRECTORY, "claims", "logs", "tuning")


class RevisionError(RuntimeError):
    """The sweep's code cannot be pinned: a dirty tree, no git checkout, or git failing."""


@dataclasses.dataclass(frozen=True)
class Pinned:
    """Where a sweep's cells run their programs from, and which code that is."""

    tree: str  # the directory holding train.py and evaluate.py
    revision: str | None  # None: the working tree as it is (allow_dirty)
    started: str | None = None  # when the revision was first pinned (UTC, ISO 8601)

    @property
    def pinned(self) -> bool:
        return self.revision is not None


def _git(root: str, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", root, *args], capture_output=True, text=True, timeout=300, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RevisionError(f"git {' '.join(args)} failed in {root}: {error}") from None
    if done.returncode != 0:
        raise RevisionError(f"git {' '.join(args)} failed in {root}: {done.stderr.strip()}")
    return done.stdout


def head(root: str) -> str:
    """The revision checked out at `root`; RevisionError outside a git checkout."""
    return _git(root, "rev-parse", "HEAD").strip()


def changed_files(root: str, sweep_dir: str | None = None) -> list[str]:
    """Tracked files that differ from HEAD, relative to `root`, a sweep's outputs aside: those
    of `sweep_dir` and of any other sweep's directory, results that another sweep running
    beside this one rewrites, not code. Code stays counted wherever the sweep directory is,
    the repository's root or a code folder included."""
    status = _git(root, "status", "--porcelain", "--untracked-files=no", "--", ".")
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return [path for path in changed if not _is_sweep_output(root, path, sweep_dir)]


def _is_sweep_output(root: str, path: str, sweep_dir: str | None) -> bool:
    """Whether `path` (relative to `root`) is something a sweep wrote in its directory: its
    report, plots, revision, claims, logs, checkouts, or a file in one of its cells. What
    decides is what the sweep recorded, never a file's name alone: a folder is a sweep's when
    it is `sweep_dir`, or holds a pinned revision that reads as one (revision.json) or a
    report that lists cells (sweep.json); a cell is a folder its report lists."""
    own = None if sweep_dir is None else os.path.realpath(sweep_dir)
    folder = os.path.dirname(path)
    while True:
        where = os.path.join(root, folder)
        is_own = own is not None and os.path.realpath(where) == own
        if (is_own or _records_a_sweep(where)) and _output_of(
            where, os.path.relpath(path, folder or ".")
        ):
            return True
        if not folder:
            return False
        folder = os.path.dirname(folder)


def _records_a_sweep(folder: str) -> bool:
    """Whether `folder` holds a sweep's own record: a readable pinned revision, or a report
    that lists its cells."""
    if records.report_cells(os.path.join(folder, "sweep.json")) is not None:
        return True
    try:
        return recorded(folder) is not None
    except RevisionError:
        return False


def _output_of(sweep_folder: str, relative: str) -> bool:
    """Whether `relative`, a path inside a sweep's folder, is one of the sweep's outputs: a
    report file, a plot, a file in one of its output folders or in a cell its report lists."""
    first, _, rest = relative.replace(os.sep, "/").partition("/")
    if not rest:
        return first in _REPORT_FILES or first.endswith(".png")
    if first in _OUTPUT_FOLDERS:
        return True
    return first in (records.report_cells(os.path.join(sweep_folder, "sweep.json")) or [])


def recorded(sweep_dir: str) -> dict | None:
    """The sweep's pinned revision record, None if there is none yet; RevisionError naming the
    file where it is unreadable or its revision is not a commit's 40 hexadecimal digits."""
    path = os.path.join(sweep_dir, FILE)
    if not os.path.exists(path):
        return None
    fix = f"restore {path} from version control, or delete it to pin the checkout's HEAD"
    try:
        with open(path) as f:
            kept = json.load(f)
    except (OSError, ValueError) as error:
        raise RevisionError(f"{path} cannot be read ({error}): {fix}") from None
    given = kept.get("revision", "(none)") if isinstance(kept, dict) else kept
    if not isinstance(given, str) or not _REVISION.fullmatch(given):
        raise RevisionError(
            f"{path}: the pinned revision must be a commit's 40 hexadecimal digits, got "
            f"{given!r}: {fix}"
        )
    started = kept.get("started")
    if started is not None and not isinstance(started, str):
        raise RevisionError(f"{path}: 'started' must be a date, got {started!r}: {fix}")
    return kept


def _remove_checkout(sweep_dir: str, path: str) -> None:
    """Remove a checkout this module makes, and nothing else: `path` must lie directly in the
    sweep's own code/ folder, named as a checkout, and neither it nor code/ may be a link (the
    paths as named, never resolved: a link's target is not the sweep's)."""
    parent = os.path.abspath(os.path.join(sweep_dir, DIRECTORY))
    target = os.path.abspath(path)
    if os.path.dirname(target) != parent or not _CHECKOUT.fullmatch(os.path.basename(target)):
        raise RevisionError(f"refusing to remove {path}: not a checkout of {parent}")
    try:
        files.remove_tree(target, inside=sweep_dir)
    except files.LinkRefused as error:
        raise RevisionError(f"refusing to remove {path}: {error}") from None


def _stagings(parent: str) -> list[str]:
    """The checkouts in the making under code/ (named `<12 digits>.<process id>`)."""
    if not os.path.isdir(parent):
        return []
    return sorted(
        os.path.join(parent, name)
        for name in os.listdir(parent)
        if _CHECKOUT.fullmatch(name) and "." in name
    )


def _is_checkout_of(tree: str, revision: str) -> bool:
    """Whether `tree` is a checkout of its own (not a folder inside another, nor a link) at
    `revision`, unaltered."""
    if os.path.islink(tree) or not os.path.isdir(tree):
        return False
    try:
        top = _git(tree, "rev-parse", "--show-toplevel").strip()
        own = os.path.realpath(top) == os.path.realpath(tree)
        return own and head(tree) == revision and not changed_files(tree)
    except RevisionError:
        return False


def checkout(root: str, sweep_dir: str, revision: str) -> str:
    """A clean checkout of `revision` under `<sweep_dir>/code/`, made if missing or altered.
    RevisionError naming the path where code/ or the checkout is a symbolic link: nothing is
    written, replaced or removed behind one."""
    if not _REVISION.fullmatch(revision):
        raise RevisionError(f"not a commit's 40 hexadecimal digits: {revision!r}")
    parent = os.path.join(sweep_dir, DIRECTORY)
    tree = os.path.abspath(os.path.join(parent, revision[:12]))
    try:
        files.refuse_links(parent, inside=sweep_dir)
        if _is_checkout_of(tree, revision) and not _stagings(parent):
            return tree
        files.make_dirs(parent, inside=sweep_dir)
        # Checkouts are code, not results: nothing under code/ is ever committed.
        with files.open_own(os.path.join(parent, ".gitignore"), "w", inside=sweep_dir) as f:
            f.write("*\n")
        # One process at a time makes it: the others, started together, wait and then find it
        # made (git worktree move onto an existing checkout would nest theirs inside it).
        lock = files.open_own(os.path.join(parent, ".lock"), "a", inside=sweep_dir)
    except files.LinkRefused as error:
        raise RevisionError(str(error)) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # A checkout in the making exists only while its maker holds this lock: one found now
        # was left by a process killed midway, and goes (with git's record of it).
        left = _stagings(parent)
        for staging in left:
            _remove_checkout(sweep_dir, staging)
        if left:
            _git(root, "worktree", "prune")
        if _is_checkout_of(tree, revision):
            return tree
        if os.path.lexists(tree):  # a checkout copied from elsewhere, or one that was edited
            _remove_checkout(sweep_dir, tree)
        _git(root, "worktree", "prune")
        # Made aside and moved into place, so that a process killed midway leaves no half a
        # checkout where a later one would take it for whole.
        staging = f"{tree}.{os.getpid()}"
        _git(root, "worktree", "add", "--detach", "--quiet", staging, revision)
        _git(root, "worktree", "move", staging, tree)
    return tree


def check(
    sweep_dir: str, root: str, allow_dirty: bool = False, repin: bool = False
) -> tuple[str | None, str | None]:
    """The revision `pin` would run and when it was first pinned, without writing anything;
    RevisionError where it would refuse."""
    if allow_dirty:
        return None, None
    try:
        current = head(root)
    except RevisionError:
        raise RevisionError(
            f"{root} is not a git checkout, so the code the cells run cannot be pinned; pass "
            "--allow_dirty to run it as it is (the report marks those cells)"
        ) from None
    kept = recorded(sweep_dir)
    if kept is not None and not repin:
        try:
            _git(root, "cat-file", "-e", f"{kept['revision']}^{{commit}}")
        except RevisionError:
            raise RevisionError(
                f"{os.path.join(sweep_dir, FILE)}: revision {kept['revision']} is not a commit "
                f"of {root}: fetch it, or pass --repin to move the sweep to this checkout's HEAD"
            ) from None
        return kept["revision"], kept.get("started")
    changed = changed_files(root, sweep_dir)
    if changed:
        shown = ", ".join(changed[:5]) + (", ..." if len(changed) > 5 else "")
        raise RevisionError(
            f"uncommitted changes in {len(changed)} tracked files ({shown}): a sweep runs "
            "committed code only; commit them, or pass --allow_dirty to run the working "
            "tree as it is (the report marks those cells)"
        )
    return current, datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def pin(sweep_dir: str, root: str, allow_dirty: bool = False, repin: bool = False) -> Pinned:
    """The code this sweep's cells run (module docstring); writes revision.json on a first pin."""
    revision, started = check(sweep_dir, root, allow_dirty, repin)
    if revision is None:
        return Pinned(tree=os.path.abspath(root), revision=None)
    kept = recorded(sweep_dir)
    tree = checkout(root, sweep_dir, revision)
    if kept is None or kept.get("revision") != revision:
        os.makedirs(sweep_dir, exist_ok=True)
        record = {"revision": revision, "started": started}
        if kept is not None:
            record["earlier"] = [*kept.get("earlier", []), kept]
        try:  # renamed into place, never through a link
            files.write_json_atomic(os.path.join(sweep_dir, FILE), record)
        except files.LinkRefused as error:
            raise RevisionError(str(error)) from None
    return Pinned(tree=tree, revision=revision, started=started)
