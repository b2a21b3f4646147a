"""A sweep writes and removes only what it makes itself inside its sweep directory: a
symbolic link planted where its checkout folder, a log or a cell would be stops sweep.py in one
line naming it, and whatever the link points at (always inside the test's own temporary folder)
is left byte for byte as it was."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_sweep import PGD_OWN, TINY_FLAGS, run_sweep, write_definition

from fbat_tf.sweeps import revision, steps
from tests.snapshots import snapshot

CELL = "standard-eps8-seed0"


def _definition(tmp_path) -> str:
    grid = [{"method": ["standard"], "eps": [8], "seed": [0]}]
    return write_definition(tmp_path, grid, {**TINY_FLAGS, "epochs": 1}, evaluation=PGD_OWN)


def _refused(done, link) -> None:
    """sweep.py failed in one line naming `link` as a link and what to do."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"error: {link}: a symbolic link"), lines[0]
    assert "move the link away" in lines[0]


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_code_folder_that_is_a_link_is_refused_and_what_it_points_at_is_kept(
    tmp_path, committed_tree, dry_run
):
    """code/ linked to a user's folder: the checkout's removal compared real paths, so a
    folder there named as the checkout passed for the sweep's own; it was deleted and a
    worktree written in its place (and code/.gitignore rewritten)."""
    pinned = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=committed_tree, capture_output=True, text=True
    ).stdout.strip()
    outside = tmp_path / "mine"
    (outside / pinned[:12]).mkdir(parents=True)
    (outside / pinned[:12] / "notes.txt").write_text("a user's notes\n")
    (outside / ".gitignore").write_text("*.log\n")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(outside, out / revision.DIRECTORY)
    before = snapshot(outside)
    extra = ("--dry_run", "--print_commands") if dry_run else ()
    done = run_sweep(
        f"--sweep={_definition(tmp_path)}", f"--sweep_dir={out}", *extra, tree=committed_tree
    )
    assert snapshot(outside) == before
    _refused(done, out / revision.DIRECTORY)
    assert sorted(os.listdir(out)) == [revision.DIRECTORY]


def test_pinning_refuses_a_code_folder_that_is_a_link(tmp_path):
    """The same at the point of use: revision.pin, given a sweep directory whose code/ is a
    link, names it and touches nothing behind it."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "code.py").write_text("A = 1\n")
    identity = ("-c", "user.name=t", "-c", "user.email=t@t.invalid")
    for args in (("init", "-q"), ("add", "-A"), (*identity, "commit", "-q", "-m", "one")):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    head = revision.head(str(root))
    outside = tmp_path / "mine"
    (outside / head[:12]).mkdir(parents=True)
    (outside / head[:12] / "notes.txt").write_text("a user's notes\n")
    sweep_dir = tmp_path / "out"
    sweep_dir.mkdir()
    os.symlink(outside, sweep_dir / revision.DIRECTORY)
    before = snapshot(outside)
    with pytest.raises(revision.RevisionError, match="a symbolic link") as error:
        revision.pin(str(sweep_dir), str(root))
    assert str(sweep_dir / revision.DIRECTORY) in str(error.value)
    assert "\n" not in str(error.value)
    assert snapshot(outside) == before


@pytest.mark.parametrize(
    "link, target",
    [
        (f"logs/{CELL}.evaluate.log", "notes.txt"),  # a log linked to a user's file
        (f"logs/{CELL}.train.log", "nowhere.txt"),  # a dangling one: no file made behind it
        ("logs", "folder"),  # the logs' folder linked elsewhere
        (CELL, "empty"),  # a cell's run directory linked to an empty folder elsewhere
    ],
)
def test_a_log_or_cell_that_is_a_link_is_refused_and_nothing_is_appended_behind_it(
    tmp_path, committed_tree, link, target
):
    """Logs were appended through a link to a file outside the sweep directory."""
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "empty").mkdir()
    (outside / "folder" / "kept.txt").write_text("kept\n")
    (outside / "notes.txt").write_text("a user's notes\n")
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    if link == "logs":
        (out / "logs").rmdir()
    os.symlink(outside / target, out / link)
    before = snapshot(outside)
    done = run_sweep(f"--sweep={_definition(tmp_path)}", f"--sweep_dir={out}", tree=committed_tree)
    assert snapshot(outside) == before
    _refused(done, out / link)


def test_a_step_never_appends_to_its_log_through_a_link(tmp_path):
    """At the point of use (a Ray worker runs steps.py as it is sent): the log is opened with
    O_NOFOLLOW, and a link there fails the step naming it, before its program runs."""
    behind = tmp_path / "notes.txt"
    behind.write_text("a user's notes\n")
    log = tmp_path / "cell.evaluate.log"
    os.symlink(behind, log)
    ran = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(ran)!r}, 'w').close()"]
    step = steps.Step("pgd", command, str(log))
    with pytest.raises(RuntimeError, match="a symbolic link") as error:
        steps.run_step(step, str(tmp_path), dict(os.environ))
    assert str(log) in str(error.value) and "\n" not in str(error.value)
    assert behind.read_text() == "a user's notes\n" and not ran.exists()
