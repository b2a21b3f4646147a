"""A sweep runs committed code: the revision it pins, checked out beside its cells, whatever
happens to the working tree while it runs (end to end on test_sweep_claims's shared sweep); a
dirty tree is refused unless the user allows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import commit_copy
from test_sweep import write_definition

from fbat_tf.sweeps import revision
from tests.commands import NO_TENSORFLOW, python_command

IDENTITY = ("-c", "user.name=t", "-c", "user.email=t@t.invalid")


def git(root, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A small git repository with one committed file and a committed results folder."""
    root = tmp_path / "repo"
    (root / "results" / "s").mkdir(parents=True)
    (root / "code.py").write_text("A = 1\n")
    (root / "results" / "s" / "sweep.md").write_text("# s\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, *IDENTITY, "commit", "-q", "-m", "one")
    return root


def test_a_dirty_tree_is_refused_naming_the_files_but_the_sweeps_own_results_do_not_count(repo):
    sweep_dir = repo / "results" / "s"
    (repo / "code.py").write_text("A = 2\n")
    with pytest.raises(revision.RevisionError, match=r"uncommitted changes in 1 .*code\.py"):
        revision.pin(str(sweep_dir), str(repo))
    assert not (sweep_dir / revision.FILE).exists()
    assert not (sweep_dir / revision.DIRECTORY).exists()

    git(repo, "checkout", "--", "code.py")
    (sweep_dir / "sweep.md").write_text("# s, rewritten by the report\n")  # results, not code
    pinned = revision.pin(str(sweep_dir), str(repo))
    assert pinned.revision == git(repo, "rev-parse", "HEAD")
    assert open(os.path.join(pinned.tree, "code.py")).read() == "A = 1\n"
    # The checkout is not part of the project: the repository's status does not list it.
    assert "code/" not in git(repo, "status", "--porcelain", "--untracked-files=all")


def test_another_sweeps_results_rewritten_beside_it_do_not_make_the_tree_dirty(repo):
    # Another sweep, running beside this one, rewrites its report and its cells' files: the
    # cells its report lists.
    other = repo / "results" / "other"
    (other / "cell").mkdir(parents=True)
    (other / "sweep.json").write_text('{"cells": [{"name": "cell"}]}\n')
    (other / "cell" / "results.json").write_text("{}\n")
    git(repo, "add", "-A")
    git(repo, *IDENTITY, "commit", "-q", "-m", "another sweep's results")
    (other / "sweep.json").write_text('{"cells": [{"name": "cell", "eps": 8}]}\n')
    (other / "cell" / "results.json").write_text('{"history": []}\n')
    pinned = revision.pin(str(repo / "results" / "s"), str(repo))
    assert pinned.revision == git(repo, "rev-parse", "HEAD")
    # Code beside them still counts.
    (repo / "code.py").write_text("A = 2\n")
    with pytest.raises(revision.RevisionError, match=r"uncommitted changes in 1 .*code\.py"):
        revision.pin(str(repo / "results" / "t"), str(repo))


def test_the_recorded_revision_runs_until_repinned_and_is_checked_out_again_where_missing(repo):
    sweep_dir = repo / "results" / "s"
    first = revision.pin(str(sweep_dir), str(repo))
    (repo / "code.py").write_text("A = 3\n")
    git(repo, *IDENTITY, "commit", "-q", "-am", "two")
    second = git(repo, "rev-parse", "HEAD")

    again = revision.pin(str(sweep_dir), str(repo))  # a resumed sweep: the first revision
    assert (again.revision, again.tree, again.started) == (
        first.revision,
        first.tree,
        first.started,
    )
    assert open(os.path.join(again.tree, "code.py")).read() == "A = 1\n"

    # A fresh clone holds revision.json but no checkout; an edited checkout is replaced.
    subprocess.run(["rm", "-rf", first.tree], check=True)
    assert open(os.path.join(revision.pin(str(sweep_dir), str(repo)).tree, "code.py")).read() == (
        "A = 1\n"
    )
    with open(os.path.join(first.tree, "code.py"), "w") as f:
        f.write("A = 'edited'\n")
    assert open(os.path.join(revision.pin(str(sweep_dir), str(repo)).tree, "code.py")).read() == (
        "A = 1\n"
    )

    moved = revision.pin(str(sweep_dir), str(repo), repin=True)
    assert moved.revision == second and moved.tree != first.tree
    assert open(os.path.join(moved.tree, "code.py")).read() == "A = 3\n"
    record = json.loads((sweep_dir / revision.FILE).read_text())
    assert record["revision"] == second and record["earlier"][0]["revision"] == first.revision


def test_outside_a_git_checkout_only_allow_dirty_runs(tmp_path):
    (tmp_path / "code.py").write_text("A = 1\n")
    with pytest.raises(revision.RevisionError, match="not a git checkout.*--allow_dirty"):
        revision.pin(str(tmp_path / "out"), str(tmp_path))
    loose = revision.pin(str(tmp_path / "out"), str(tmp_path), allow_dirty=True)
    assert loose.tree == str(tmp_path) and not loose.pinned
    assert not (tmp_path / "out").exists()


def _sweep(tree, *args, prelude=""):
    command = python_command(os.path.join(tree, "sweep.py"), *args, prelude=prelude)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=900)


def test_sweep_py_refuses_a_dirty_tree_at_start_with_one_line_and_writes_nothing(tmp_path):
    tree = commit_copy(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), tmp_path / "t")
    definition = write_definition(tmp_path, [{"method": ["standard"], "eps": [8]}])
    with open(os.path.join(tree, "fbat_tf", "methods", "standard.py"), "a") as f:
        f.write("# an edit not committed\n")
    out = tmp_path / "out"
    done = _sweep(tree, f"--sweep={definition}", f"--sweep_dir={out}")
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: uncommitted changes in 1 tracked file")
    assert "fbat_tf/methods/standard.py" in lines[0] and "--allow_dirty" in lines[0]
    assert not out.exists()
    # A dry run says so and runs nothing.
    dry = _sweep(tree, f"--sweep={definition}", f"--sweep_dir={out}", "--dry_run")
    assert dry.returncode == 0 and "a real run would stop here: 1 tracked files" in dry.stdout
    assert not out.exists()


# Cells run the pinned revision while the working tree is edited, from a sweep started in another
# folder with relative --sweep_dir and --data_dir: checked end to end on the sweep that
# test_sweep_claims's two processes share (one sweep's programs, not a second sweep's).


@pytest.fixture
def removals(monkeypatch):
    """Every directory removal attempted, recorded and refused: no test here can delete
    anything, inside its temporary folder or outside it."""
    import shutil

    attempted: list[str] = []

    def refuse(path, *args, **kwargs):
        attempted.append(os.path.realpath(path))
        raise PermissionError(f"removal refused in a test: {path}")

    monkeypatch.setattr(shutil, "rmtree", refuse)
    return attempted


@pytest.mark.parametrize(
    "given",
    ["..", "../..", "/", "../../../../", 5, None, ["a" * 40], "A" * 40, "a" * 39, "a" * 40 + "/"],
)
def test_a_revision_json_that_names_no_commit_is_refused_naming_it_and_removes_nothing(
    repo, removals, given
):
    sweep_dir = repo / "results" / "s"
    pinned = revision.pin(str(sweep_dir), str(repo))
    (sweep_dir / revision.FILE).write_text(json.dumps({"revision": given, "started": "x"}))
    before = sorted(str(p) for p in repo.rglob("*"))
    for repin in (False, True):  # --repin reads the old record too, to keep it as "earlier"
        with pytest.raises(revision.RevisionError) as error:
            revision.pin(str(sweep_dir), str(repo), repin=repin)
        message = str(error.value)
        assert str(sweep_dir / revision.FILE) in message and "40 hexadecimal digits" in message
        assert "\n" not in message
    assert removals == []
    assert sorted(str(p) for p in repo.rglob("*")) == before
    assert os.path.isdir(pinned.tree)


def test_a_revision_not_in_the_repository_is_refused_naming_revision_json(repo, removals):
    sweep_dir = repo / "results" / "s"
    revision.pin(str(sweep_dir), str(repo))
    (sweep_dir / revision.FILE).write_text(json.dumps({"revision": "0123456789" * 4}))
    refused = r"revision\.json: revision 0123.*not a commit"
    with pytest.raises(revision.RevisionError, match=refused):
        revision.pin(str(sweep_dir), str(repo))
    assert removals == []
    assert not (sweep_dir / revision.DIRECTORY / "012345678901").exists()


@pytest.mark.parametrize(
    "text, said",
    [
        ('{"revision": "ab', "cannot be read"),
        ('{"started": "2026-01-01"}', "got '(none)'"),
        ('["not", "an", "object"]', "got ['not', 'an', 'object']"),
        ('{"revision": "' + "a" * 40 + '", "started": 5}', "'started' must be a date"),
    ],
)
def test_a_malformed_revision_json_is_one_line_naming_it(repo, removals, text, said):
    sweep_dir = repo / "results" / "s"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / revision.FILE).write_text(text)
    with pytest.raises(revision.RevisionError) as error:
        revision.check(str(sweep_dir), str(repo))
    assert str(sweep_dir / revision.FILE) in str(error.value) and said in str(error.value)
    assert removals == []


def test_only_checkouts_inside_the_sweeps_code_folder_are_ever_removed(repo, tmp_path, removals):
    sweep_dir = repo / "results" / "s"
    pinned = revision.pin(str(sweep_dir), str(repo))
    # An edited checkout is made anew: the one removal asked for is that checkout.
    with open(os.path.join(pinned.tree, "code.py"), "a") as f:
        f.write("B = 2\n")
    with pytest.raises(PermissionError):
        revision.pin(str(sweep_dir), str(repo))
    assert removals == [os.path.realpath(pinned.tree)]
    # A link in its place, pointing outside, is never followed.
    removals.clear()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine\n")
    os.rename(pinned.tree, str(tmp_path / "moved"))
    os.symlink(outside, pinned.tree)
    with pytest.raises(revision.RevisionError, match="refusing to remove"):
        revision.pin(str(sweep_dir), str(repo))
    assert removals == [] and (outside / "keep.txt").exists()
    for wrong in (str(sweep_dir), str(sweep_dir / revision.DIRECTORY), str(outside), "/"):
        with pytest.raises(revision.RevisionError, match="refusing to remove"):
            revision._remove_checkout(str(sweep_dir), wrong)
    assert removals == []


@pytest.mark.parametrize("where", [".", "code_folder"])
def test_the_dirty_tree_refusal_holds_when_the_sweep_directory_holds_the_code(repo, where):
    (repo / "code_folder").mkdir()
    (repo / "code_folder" / "module.py").write_text("B = 1\n")
    git(repo, "add", "-A")
    git(repo, *IDENTITY, "commit", "-q", "-m", "a code folder")
    sweep_dir = repo if where == "." else repo / "code_folder"
    (repo / "code_folder" / "module.py").write_text("B = 2\n")
    (repo / "code.py").write_text("A = 2\n")
    with pytest.raises(revision.RevisionError, match=r"uncommitted changes in 2 .*code\.py"):
        revision.check(str(sweep_dir), str(repo))
    # Once the sweep has run there (its revision and report beside the code), code still counts,
    # and only the sweep's own outputs do not.
    git(repo, "checkout", "--", ".")
    revision.pin(str(sweep_dir), str(repo))
    cell = sweep_dir / "standard-eps8-seed0"
    cell.mkdir()
    for name in ("flags.txt", "results.json", "sweep.md", "plot.png"):
        (cell if name in ("flags.txt", "results.json") else sweep_dir).joinpath(name).write_text(
            "1\n"
        )
    report = '{"cells": [{"name": "standard-eps8-seed0", "seed": %d}]}\n'
    (sweep_dir / "sweep.json").write_text(report % 1)
    git(repo, "add", "-A")
    git(repo, *IDENTITY, "commit", "-q", "-m", "the sweep's outputs")
    for name in ("sweep.md", "plot.png", "standard-eps8-seed0/results.json"):
        (sweep_dir / name).write_text("2\n")
    (sweep_dir / "sweep.json").write_text(report % 2)
    assert revision.changed_files(str(repo), str(sweep_dir)) == []
    (repo / "code_folder" / "module.py").write_text("B = 3\n")
    assert revision.changed_files(str(repo), str(sweep_dir)) == ["code_folder/module.py"]
    with pytest.raises(revision.RevisionError, match=r"uncommitted changes in 1 .*module\.py"):
        revision.check(str(sweep_dir), str(repo), repin=True)


def test_sweep_py_names_a_malformed_revision_json_in_one_line(tmp_path):
    tree = commit_copy(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), tmp_path / "t")
    definition = write_definition(tmp_path, [{"method": ["standard"], "eps": [8]}])
    out = tmp_path / "out"
    out.mkdir()
    (out / revision.FILE).write_text('{"revision": 5}')
    for extra in ((), ("--dry_run",)):
        # Before TensorFlow loads: here it cannot.
        words = (f"--sweep={definition}", f"--sweep_dir={out}", *extra)
        done = _sweep(tree, *words, prelude=NO_TENSORFLOW)
        lines = done.stderr.strip().splitlines()
        assert done.returncode != 0 and len(lines) == 1, done.stderr
        assert str(out / revision.FILE) in lines[0] and "40 hexadecimal digits" in lines[0]
    assert sorted(os.listdir(out)) == [revision.FILE]


def test_processes_pinning_together_make_one_checkout(repo):
    """Six sweep.py processes starting together each made a checkout and all but one were
    moved inside the first (git worktree move onto an existing directory nests), leaving five
    extra worktrees registered with git."""
    sweep_dir = repo / "results" / "s"
    revision.pin(str(sweep_dir), str(repo))  # revision.json first, as the first start writes it
    tree = os.path.join(str(sweep_dir), revision.DIRECTORY, git(repo, "rev-parse", "HEAD")[:12])
    subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=repo, check=True)
    probe = (
        "import sys; from fbat_tf.sweeps import revision; "
        "print(revision.pin(sys.argv[1], sys.argv[2]).tree)"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    started = [
        subprocess.Popen(
            [sys.executable, "-c", probe, str(sweep_dir), str(repo)],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    trees = set()
    for process in started:
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-2000:]
        trees.add(stdout.strip())
    assert trees == {tree}
    listed = git(repo, "worktree", "list", "--porcelain").splitlines()
    assert sorted(line for line in listed if line.startswith("worktree ")) == sorted(
        [f"worktree {repo}", f"worktree {tree}"]
    )
    assert sorted(os.listdir(tree)) == [".git", "code.py", "results"]


@pytest.mark.parametrize(
    "sweep_dir, planted",
    [
        # A sweep run at the repository's root: an empty lock file in a code folder.
        (".", {"code_folder/train.lock": ""}),
        # A file named sweep.json at the root, not a report, and an empty flags.txt.
        ("results/s", {"sweep.json": "{}\n", "code_folder/flags.txt": ""}),
        # A report copied to the root: its cells are not the code folder.
        (
            "results/s",
            {
                "sweep.json": '{"cells": [{"name": "standard-eps8-seed0"}]}\n',
                "code_folder/flags.txt": "",
                "code_folder/eval-pgd.json": "{}\n",
            },
        ),
        # A revision.json that names no revision, and an empty lock file in a code folder.
        ("results/s", {"revision.json": "{}\n", "code_folder/train.lock": ""}),
    ],
)
def test_files_named_like_a_sweeps_outputs_never_hide_code_edits(repo, sweep_dir, planted):
    """A sweep's output is what the sweep recorded (its folder, its revision, the cells its
    report lists), never a file found by its name: empty untracked files named as a cell's
    (train.lock, flags.txt) or a report's (sweep.json) made a code folder pass for a cell, and
    its edits went uncounted while the sweep pinned HEAD without them."""
    (repo / "code_folder").mkdir()
    (repo / "code_folder" / "module.py").write_text("B = 1\n")
    git(repo, "add", "-A")
    git(repo, *IDENTITY, "commit", "-q", "-m", "a code folder")
    where = repo / sweep_dir
    if sweep_dir == ".":
        revision.pin(str(where), str(repo))  # its revision.json, untracked, at the root
    for name, text in planted.items():
        (repo / name).write_text(text)
    (repo / "code_folder" / "module.py").write_text("B = 2\n")
    assert revision.changed_files(str(repo), str(where)) == ["code_folder/module.py"]
    with pytest.raises(revision.RevisionError, match=r"uncommitted changes in 1 .*module\.py"):
        revision.check(str(where), str(repo), repin=True)


def test_a_checkout_a_killed_sweep_left_in_the_making_is_removed_by_the_next_pin(repo):
    """kill -9 between `git worktree add` and the move into place leaves `code/<rev>.<pid>`, a
    whole worktree; the next pin removes it (and git's record of it), whether or not the
    checkout itself is there, and touches nothing else in code/."""
    sweep_dir = repo / "results" / "s"
    pinned = revision.pin(str(sweep_dir), str(repo))
    code = os.path.dirname(pinned.tree)
    for tree_there in (True, False):
        left = f"{pinned.tree}.{_gone_pid()}"
        git(repo, "worktree", "add", "--detach", "--quiet", left, pinned.revision)
        if not tree_there:
            subprocess.run(["rm", "-rf", pinned.tree], check=True)
            git(repo, "worktree", "prune")
        notes = os.path.join(code, "notes.txt")
        with open(notes, "w") as f:
            f.write("mine\n")
        again = revision.pin(str(sweep_dir), str(repo))
        assert again.tree == pinned.tree and os.path.isfile(os.path.join(again.tree, "code.py"))
        assert not os.path.lexists(left)
        assert open(notes).read() == "mine\n"
        assert left not in git(repo, "worktree", "list")


def _gone_pid() -> int:
    """A process id no process has now."""
    pid = 999_999
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid
