"""Records as JSON files: read whole or refused with the file's name, written atomically."""

from __future__ import annotations

import errno
import json
import math
import numbers
import os
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


def write_json_atomic(path: str, payload: Any, replace: bool = True) -> None:
    """Write JSON to a temporary file and rename it, so readers never see half a file. A NaN
    or infinite number is written as null (JSON has no such numbers). With `replace=False` a
    file already at `path` is never replaced, whoever wrote it and when: FileExistsError (the
    file is linked into place, which fails where one exists; on a filesystem without hard
    links it is created where none exists and written from the finished temporary file)."""
    tmp = f"{path}.{os.getpid()}.tmp"  # several processes may write the same file at once
    try:
        with open(tmp, "w") as f:
            json.dump(finite_or_null(payload), f, indent=2, default=_json_default, allow_nan=False)
        if replace:
            os.replace(tmp, path)
        else:
            _link_or_create(tmp, path)
    finally:
        if os.path.exists(tmp):  # a full disk, or the file kept: no temporary file is left
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
    with open(tmp, "rb") as source, open(path, "xb") as target:  # "x": FileExistsError
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
