"""Records as JSON files: read whole or refused with the file's name, written atomically; and
the one rule for every path the project writes, replaces or removes: never through a symbolic
link it did not make.

    write_json_atomic(path, payload)           # a temporary file beside it, renamed into place
    write_atomic(path, b"...")                 # the same for text or bytes (a report, a plot)
    with open_own(path, "a", inside=run_dir):  # opened with O_NOFOLLOW: a link is refused
        ...
    make_dirs(path, inside=sweep_dir)          # os.makedirs, refusing a link on the way
    remove_tree(path, inside=sweep_dir)        # a real folder only, never through a link

`inside` is the folder the user named (it may itself be a link, which is the user's choice):
every folder between it and the path, and the path itself, must not be a link. A refusal is
LinkRefused, an OSError whose message names the path and what to do, in one line.
"""

from __future__ import annotations

import errno
import json
import math
import numbers
import os
import secrets
import shutil
from typing import Any

import numpy as np


def read_json(path: str, what: str, key: str) -> dict[str, Any]:
    """The JSON object at `path`, which holds the object `key`: FileNotFoundError where there
    is none, ValueError naming the file where it is not JSON or not `what`."""
    with open(path) as f:
        try:
            payload = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not readable JSON ({error})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get(key), dict):
        raise ValueError(f"{path} is not {what} (no {key})")
    return payload


class LinkRefused(OSError):
    """A path the project would write, replace or remove through is a symbolic link."""

    def __init__(self, path: str):
        super().__init__(
            errno.ELOOP,
            "a symbolic link, and fbat-tf writes and removes only what it makes itself, never "
            "through a link: move the link away (or name another path) and run the command again",
            path,
        )

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def refuse_links(path: str, inside: str | None = None) -> None:
    """LinkRefused where `path`, or a folder between `inside` and it, is a symbolic link (a
    dangling one included); `inside` itself is not checked, nor is anything above it. A path
    not under `inside` (or with no `inside`) is checked itself only."""
    checked = [path]
    if inside is not None:
        relative = os.path.relpath(path, inside)
        if relative != os.curdir and relative.split(os.sep)[0] != os.pardir:
            parts = relative.split(os.sep)
            checked = [os.path.join(inside, *parts[: i + 1]) for i in range(len(parts))]
    for each in checked:
        if os.path.islink(each):
            raise LinkRefused(each)


# How open_own opens by mode: "x" only where nothing is at the path, "r+" created if missing.
_OPEN_FLAGS = {
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    "r+": os.O_RDWR | os.O_CREAT,
}


def open_own(path: str, mode: str = "w", inside: str | None = None, binary: bool = False):
    """`path` opened to write ("w"), append ("a"), create ("x") or read and write ("r+",
    created where missing), never through a symbolic link: the file is opened with O_NOFOLLOW
    (a link there, dangling or not, is refused as it is opened, and nothing is written behind
    it), after the folders between `inside` and it are checked (`refuse_links`)."""
    if inside is not None:
        refuse_links(os.path.dirname(path), inside)
    try:
        descriptor = os.open(path, _OPEN_FLAGS[mode] | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise LinkRefused(path) from None
        raise
    return os.fdopen(
        descriptor,
        ("r+" if mode == "r+" else "w" if mode == "x" else mode) + ("b" if binary else ""),
    )


def make_dirs(path: str, inside: str | None = None) -> None:
    """os.makedirs(path, exist_ok=True), refusing a link between `inside` and `path` (checked
    before, so that no folder is made behind one, and after)."""
    refuse_links(path, inside)
    os.makedirs(path, exist_ok=True)
    refuse_links(path, inside)


def remove_tree(path: str, inside: str | None = None) -> None:
    """Remove the folder `path` and what it holds, never through a link: LinkRefused where it,
    or a folder between `inside` and it, is one. Links inside it are removed as links, their
    targets untouched (shutil.rmtree)."""
    refuse_links(path, inside)
    shutil.rmtree(path)


def write_atomic(path: str, data: str | bytes, inside: str | None = None) -> None:
    """Write `data` to a new temporary file beside `path` and rename it into place, so that
    readers never see half a file; LinkRefused where `path` (or a folder between `inside` and
    it) is a link: one is neither written through nor replaced."""
    refuse_links(path, inside)
    # A name of its own (several processes may write the same file at once), created where
    # nothing is: never a file or link left there.
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open_own(tmp, "x", binary=isinstance(data, bytes)) as f:
            f.write(data)
        refuse_links(path)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):  # a full disk: no temporary file is left
            os.remove(tmp)


def write_json_atomic(
    path: str, payload: Any, replace: bool = True, inside: str | None = None
) -> None:
    """Write JSON to a temporary file and rename it, so readers never see half a file. A NaN
    or infinite number is written as null (JSON has no such numbers). With `replace=False` a
    file already at `path` is never replaced, whoever wrote it and when: FileExistsError (the
    file is linked into place, which fails where one exists; on a filesystem without hard
    links it is created where none exists and written from the finished temporary file). A
    link at `path` is refused (LinkRefused), never written through nor replaced."""
    text = json.dumps(finite_or_null(payload), indent=2, default=_json_default, allow_nan=False)
    if replace:
        write_atomic(path, text, inside)
        return
    refuse_links(path, inside)
    tmp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open_own(tmp, "x") as f:
            f.write(text)
        _link_or_create(tmp, path)
    finally:
        if os.path.lexists(tmp):  # a full disk, or the file kept: no temporary file is left
            os.remove(tmp)


# What link() raises on a filesystem that has no hard links (FAT, exFAT, some network mounts).
_NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS)


def _link_or_create(tmp: str, path: str) -> None:
    """`tmp` at `path` where no file is: FileExistsError otherwise."""
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise
    except OSError as error:
        if error.errno not in _NO_LINKS:
            raise
    with open(tmp, "rb") as source, open_own(path, "x", binary=True) as target:  # "x": exists
        try:
            shutil.copyfileobj(source, target)
        except BaseException:  # a full disk: no half file is left at `path`
            target.close()
            os.remove(path)
            raise


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return finite_or_null(value.tolist())
    if hasattr(value, "numpy"):  # a TensorFlow tensor (this module does not import TensorFlow)
        return finite_or_null(value.numpy().tolist())
    raise TypeError(f"not JSON serializable: {type(value)}")


def finite_or_null(value: Any) -> Any:
    """`value` with each NaN or infinite float, at any depth, replaced by None: JSON has no
    spelling for them that every reader takes (results.json, model cards, sweep.json)."""
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(item) for item in value]
    if isinstance(value, numbers.Real) and not math.isfinite(value):  # numpy's floats too
        return None
    return value
