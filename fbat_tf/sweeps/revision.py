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
sweep to the current HEAD. A tree whose tracked files differ from HEAD (the sweep's own
directory aside: its results are not code) is refused at the first pin, since what would run
is not what the user sees. `pin(..., allow_dirty=True)` runs the working tree as it is instead;
the report marks every cell such a run touches (its `code` says `dirty`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import subprocess

FILE = "revision.json"
DIRECTORY = "code"


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


def changed_files(root: str, exclude: str | None = None) -> list[str]:
    """Tracked files that differ from HEAD, relative to `root`, those under `exclude` and in any
    sweep's directory aside: results, which another sweep running beside this one rewrites, not
    code."""
    pathspec = ["--", "."]
    if exclude is not None:
        relative = os.path.relpath(os.path.abspath(exclude), os.path.abspath(root))
        if not relative.startswith(os.pardir):
            pathspec.append(f":(exclude){relative}")
    status = _git(root, "status", "--porcelain", "--untracked-files=no", *pathspec)
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return [path for path in changed if not _in_a_sweep_directory(root, path)]


def _in_a_sweep_directory(root: str, path: str) -> bool:
    """Whether a folder holding `path` is a sweep's (it holds the report or the pinned
    revision)."""
    folder = os.path.dirname(path)
    while folder:
        if any(os.path.exists(os.path.join(root, folder, n)) for n in ("sweep.json", FILE)):
            return True
        folder = os.path.dirname(folder)
    return False


def recorded(sweep_dir: str) -> dict | None:
    path = os.path.join(sweep_dir, FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _is_checkout_of(tree: str, revision: str) -> bool:
    """Whether `tree` is a checkout of its own (not a folder inside another) at `revision`,
    unaltered."""
    if not os.path.isdir(tree):
        return False
    try:
        top = _git(tree, "rev-parse", "--show-toplevel").strip()
        own = os.path.realpath(top) == os.path.realpath(tree)
        return own and head(tree) == revision and not changed_files(tree)
    except RevisionError:
        return False


def checkout(root: str, sweep_dir: str, revision: str) -> str:
    """A clean checkout of `revision` under `<sweep_dir>/code/`, made if missing or altered."""
    parent = os.path.join(sweep_dir, DIRECTORY)
    tree = os.path.abspath(os.path.join(parent, revision[:12]))
    if _is_checkout_of(tree, revision):
        return tree
    os.makedirs(parent, exist_ok=True)
    # Checkouts are code, not results: nothing under code/ is ever committed.
    with open(os.path.join(parent, ".gitignore"), "w") as f:
        f.write("*\n")
    if os.path.exists(tree):  # a checkout copied from elsewhere, or one that was edited
        shutil.rmtree(tree)
    _git(root, "worktree", "prune")
    # Made aside and moved into place, so that a second process never sees half a checkout.
    staging = f"{tree}.{os.getpid()}"
    if os.path.exists(staging):
        shutil.rmtree(staging)
        _git(root, "worktree", "prune")
    _git(root, "worktree", "add", "--detach", "--quiet", staging, revision)
    try:
        _git(root, "worktree", "move", staging, tree)
    except RevisionError:
        _git(root, "worktree", "remove", "--force", staging)
        if not _is_checkout_of(tree, revision):
            raise
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
        return kept["revision"], kept.get("started")
    changed = changed_files(root, exclude=sweep_dir)
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
        path = os.path.join(sweep_dir, FILE)
        with open(f"{path}.tmp", "w") as f:
            json.dump(record, f, indent=2)
        os.replace(f"{path}.tmp", path)
    return Pinned(tree=tree, revision=revision, started=started)
