"""What a killed export leaves is removed by the next: `python -m export` (or train.py) killed
with SIGKILL mid-write left its hidden `.partial-*` folder beside the versions for ever. The
next export on the machine removes the folders its own kind made, named with this host and a
process that is gone, and nothing else: not a live export's, not another machine's, not a
symbolic link of that name (never followed), not a folder of another name.

    python -m pytest -q -n 0 tests/test_export_leftovers.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from tests.helpers import linear_model


def _gone_pid() -> int:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    return done.pid


def test_the_next_export_removes_the_folders_killed_exports_left_and_nothing_else(tmp_path):
    from export import savedmodel

    host = socket.gethostname()
    root = tmp_path / "export" / "m"
    root.mkdir(parents=True)
    killed = root / f".partial-1-{host}-{_gone_pid()}-0123abcd"
    (killed / "variables").mkdir(parents=True)
    (killed / "saved_model.pb").write_bytes(b"half")
    live = root / f".partial-2-{host}-{os.getpid()}-0123abcd"
    live.mkdir()
    elsewhere = root / f".partial-3-another-host.example-{_gone_pid()}-0123abcd"
    elsewhere.mkdir()
    older = root / ".partial-4-0123abcd"  # no process named: whose it is cannot be told
    older.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("kept")
    link = root / f".partial-5-{host}-{_gone_pid()}-0123abcd"
    link.symlink_to(outside, target_is_directory=True)

    path = savedmodel.export_model(linear_model((4, 4, 1), 3), str(tmp_path / "export"), "m")

    assert path == str(root / "1")
    assert not killed.exists()
    assert live.is_dir() and elsewhere.is_dir() and older.is_dir()
    assert link.is_symlink() and (outside / "keep.txt").read_text() == "kept"
    assert sorted(os.listdir(root)) == sorted(
        ["1", live.name, elsewhere.name, older.name, link.name]
    )
