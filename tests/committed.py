"""The committed results' files by the folder under study/results/ that holds them (a sweep, with
its tuning runs, or a kit's output): a test that reads every committed file runs once per folder
and names each file that fails, with what failed."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "study", "results")


def by_folder(paths: Iterable[str]) -> dict[str, list[str]]:
    """`paths` (files under results/) by their folder results/<name>, each list sorted."""
    found: dict[str, list[str]] = {}
    for path in sorted(paths):
        folder = os.path.relpath(path, RESULTS).split(os.sep)[0]
        found.setdefault(os.path.join("study", "results", folder), []).append(path)
    return found


def check_each(paths: Iterable[str], check: Callable[[str], None]) -> None:
    """`check` on every path; fails naming each path whose check failed, and how."""
    failed = []
    for path in paths:
        try:
            check(path)
        except AssertionError as error:
            failed.append(f"{os.path.relpath(path, ROOT)}: {error}")
    assert not failed, f"{len(failed)} files fail:\n" + "\n".join(failed)


def report_root(root) -> None:
    """`root` (a pathlib folder) shaped like the project for sweep.py --report_only, which names
    its definitions, the paper's numbers and the cost bench relative to where it runs: configs/,
    bench/ and the study's definitions and papers linked in, study/results/ to copy a sweep into."""
    for folder in ("configs", "bench"):
        os.symlink(os.path.join(ROOT, folder), root / folder)
    (root / "study" / "results").mkdir(parents=True)
    for folder in ("definitions", "papers"):
        os.symlink(os.path.join(ROOT, "study", folder), root / "study" / folder)
